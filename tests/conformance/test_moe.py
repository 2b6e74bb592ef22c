"""Mixture-of-experts models (issue 22) against transformers 5: Mixtral's sparse MoE block
(router softmax, top-k, renormalisation, experts grouped per token) and its router
load-balancing loss (output_router_logits, router_aux_loss_coef), on tiny random models
from MixtralConfig.

transformers 5 holds the experts as fused 3-D parameters (mlp.experts.gate_up_proj
[E, 2I, C] = each expert's [w1; w3], mlp.experts.down_proj [E, C, I] = w2) and the
router as mlp.gate.weight; save_pretrained writes (and ftkit reads) the checkpoint's
per-expert names, model.layers.N.block_sparse_moe.experts.E.w1/w2/w3.weight and
block_sparse_moe.gate.weight. Gradients are compared under the checkpoint's names
(ckpt_grads splits the fused ones).

Covered here: logits and loss (aux term included) in eval and full mode, every full-mode
gradient (router and experts included: the gradient reaches the router through the
selected, renormalised weights and through the aux loss), LoRA on the attention modules
(router and experts frozen; the gradient still flows through the router to the
residual stream), gradient checkpointing, and the refusals of what is not implemented
yet (LoRA on experts / all-linear, training on several ranks), and QLoRA with the
attention modules and every expert quantized on load. ft-train's logged training and
evaluation losses against the HF Trainer's (the aux term in both: each micro-batch's, each
eval batch's), on one process and under every dist.strategy on 2 ranks. The GPU path:
test_gpu_moe.py."""

import json
import random

import pytest
import torch
from safetensors.torch import load_file

import ftref
import moe_padding
import moe_ref
from moe_ref import B

ckpt_grads = moe_ref.mixtral_ckpt_grads  # (the fused experts split; the GPU file's too)
_train = moe_ref.train_hparams

# Tiny Mixtral shapes. The aux coefficient is raised well above the default 0.001 so that
# a wrong load-balancing term (value or gradient) is far outside the tolerances.
_MOE_BASE = dict(ftref._BASE, intermediate_size=24, num_local_experts=4,
                 num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.3,
                 sliding_window=None)

MOE_SHAPES = {
    s.name: s
    for s in [
        ftref.Shape("mixtral", "mixtral", dict(_MOE_BASE), seed=300),
        ftref.Shape("mixtral_top1_noaux", "mixtral",
                    dict(_MOE_BASE, num_experts_per_tok=1, output_router_logits=False,
                         num_local_experts=3), seed=310,
                    note="top-1 (renormalised weight 1), no aux loss"),
        ftref.Shape("mixtral_top3_sw", "mixtral",
                    dict(_MOE_BASE, num_local_experts=6, num_experts_per_tok=3,
                         sliding_window=5, num_attention_heads=4, num_key_value_heads=1,
                         tie_word_embeddings=True), T=14, seed=320,
                    note="top-3 of 6, sliding window, MQA, tied embeddings"),
    ]
}


moe_store = moe_ref.store_fixture(MOE_SHAPES, "moe", name="moe_store")


@pytest.fixture(scope="module", params=list(MOE_SHAPES))
def case(request, moe_store, ft):
    return moe_ref.full_case(MOE_SHAPES[request.param], moe_store(request.param), ft,
                             ckpt_grads)


def test_config_as_written(case):
    """The shapes are what they claim (a guard on the fixtures themselves)."""
    cfg = json.loads((case.model_dir / "config.json").read_text())
    assert cfg["model_type"] == "mixtral"
    assert cfg["num_local_experts"] == case.shape.cfg["num_local_experts"]
    moe_ref.check_aux_share(case)


def test_eval_logits_loss(case):
    moe_ref.check_logits_loss(case, "eval")


def test_full_logits_loss(case):
    moe_ref.check_logits_loss(case, "full")


def test_full_grads(case):
    """Every parameter's gradient: attention, norms, router, each expert's w1/w2/w3.

    Top-1 renormalised without the aux loss routes each token with weight p / p = 1: the
    router's gradient is exactly 0 (ours is); autograd's is rounding noise (|g| ~ 1e-9
    against gradients of order 1e-2), so there the router is checked as 0 within that
    noise and the rest as usual."""
    ref = dict(case.ref_grads)
    cfg = case.shape.cfg
    if cfg["num_experts_per_tok"] == 1 and not cfg["output_router_logits"]:
        scale = max(float(torch.linalg.vector_norm(g)) for g in ref.values())
        for n in [n for n in ref if n.endswith(".block_sparse_moe.gate.weight")]:
            assert float(torch.linalg.vector_norm(ref[n])) < 1e-6 * scale, n
            assert not torch.any(case.full_out["grad." + n]), n
            del ref[n]
        have = {k for k in case.full_out if k.startswith("grad.")}
        case = dict(case.full_out)
        for k in have:
            if k[len("grad."):] not in ref:
                del case[k]
        ftref.assert_tensor_dict_close("grad.", case, ref, ftref.TOL_GRAD)
        return
    ftref.assert_tensor_dict_close("grad.", case.full_out, ref, ftref.TOL_GRAD)


def test_grad_ckpt_equal(case, ft):
    """Gradient checkpointing recomputes the MoE block (routing and grouping) without
    counting it twice in the load-balancing statistics: the same gradients bit for bit."""
    moe_ref.check_grad_ckpt_equal(case, ft)


@pytest.mark.parametrize("name", ["mixtral", "mixtral_top3_sw"])
def test_padded_batch_aux_mask(moe_store, ft, name):
    """Right padding: the load-balancing loss and its gradient leave the padded rows out,
    as transformers given the attention_mask (moe_padding.py)."""
    import moe_padding

    shape = MOE_SHAPES[name]
    moe_padding.check_padded_aux(moe_store(name), shape.T, shape.seed + 5, ft, ckpt_grads, name)


def test_mask_not_right_padding_refused(moe_store, ft_raw):
    import moe_padding

    moe_padding.check_mask_refused(moe_store("mixtral"), MOE_SHAPES["mixtral"].T, ft_raw,
                                   "mixtral")


def test_ft_eval_loss_with_aux(moe_store, tmp_path):
    """ft-eval reports transformers' aux_loss and loss (loss_with_aux) beside the
    cross-entropy; a MoE model without output_router_logits reports neither."""
    import json

    import moe_padding

    moe_padding.check_ft_eval_aux(moe_store("mixtral"), tmp_path, "mixtral")
    data = tmp_path / "mixtral-eval.jsonl"
    cp = ftref.run_tool([_tool("FT_EVAL", "ft-eval"), "--model", moe_store("mixtral_top1_noaux"),
                         "--data", data, "--format", "tokens", "--device", "cpu", "--json"])
    got = json.loads(cp.stdout)
    assert "loss" in got and "aux_loss" not in got and "loss_with_aux" not in got, got


@pytest.fixture(scope="module")
def lora_case(moe_store, ft):
    """LoRA on the attention modules of the first shape (router and experts frozen)."""
    shape = MOE_SHAPES["mixtral"]
    model_dir = moe_store(shape.name)
    adapter = ftref.build_adapter(model_dir, moe_store.root / "adapter-qkvo",
                                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                  seed=7)
    return moe_ref.lora_case(shape, model_dir, adapter, ft, shape.seed + 1, "mixtral-lora-qkvo")


def test_lora_attention(lora_case):
    moe_ref.check_lora(lora_case, "[mixtral lora]")


def _refused(ft_raw, spec, tag, *needles):
    r, _ = ft_raw(spec, tag)
    assert r.returncode != 0, f"{tag}: accepted"
    for n in needles:
        assert n in r.stderr, f"{tag}: {n!r} not in: {r.stderr}"


def v5_state(sd, ckpt, I):
    """Writes checkpoint-named tensors (per-expert w1/w3/w2, block_sparse_moe) into sd, a
    transformers 5 state dict (fused experts, mlp.*), in place."""
    import re

    for k, v in ckpt.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight", k)
        if m:
            l, e, w = int(m.group(1)), int(m.group(2)), m.group(3)
            if w == "w2":
                sd[f"model.layers.{l}.mlp.experts.down_proj"][e] = v
            else:
                rows = slice(0, I) if w == "w1" else slice(I, 2 * I)
                sd[f"model.layers.{l}.mlp.experts.gate_up_proj"][e, rows] = v
        else:
            sd[k.replace(".block_sparse_moe.gate.", ".mlp.gate.")] = v


# ("ckpt": a checkpoint ft-quantize wrote: its attention quantized, its experts dense,
# as transformers 5 + bitsandbytes leave the fused experts)
QLORA_CASES = [dict(type="nf4", blocksize=64, double_quant=True),
               dict(type="fp4", blocksize=32, double_quant=False),
               dict(type="int8"),
               dict(type="nf4", blocksize=64, double_quant=True, ckpt=True)]


@pytest.fixture(scope="module", params=QLORA_CASES,
                ids=[q["type"] + str(q.get("blocksize", "")) + ("-ckpt" if q.get("ckpt") else "")
                     for q in QLORA_CASES])
def qlora_case(request, moe_store, ft):
    """QLoRA on the fly: attention and every expert quantized (the router stays dense), LoRA
    on attention, the router and the experts; the reference is transformers + PEFT on a model holding exactly our
    dequantized weights."""
    q = request.param
    shape = MOE_SHAPES["mixtral"]
    model_dir = moe_store(shape.name)
    adapter = ftref.build_adapter(model_dir, moe_store.root / "adapter-qlora",
                                  target_modules=["q_proj", "v_proj", "o_proj", "gate", "w1",
                                                  "w2", "w3"], seed=9)
    return moe_ref.qlora_case(q, shape, model_dir, adapter, moe_store, ft, v5_state,
                              "intermediate_size",
                              f"moe-qlora-{q['type']}{'-ckpt' if q.get('ckpt') else ''}",
                              moe_store.root / f"dequant-{q['type']}")


def test_qlora_quantizes_attention_and_experts(qlora_case):
    c = qlora_case
    L, E = c["cfg"].num_hidden_layers, c["cfg"].num_local_experts
    want = {f"model.layers.{l}.self_attn.{p}.weight" for l in range(L)
            for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
    if not c["q"].get("ckpt"):
        want |= {f"model.layers.{l}.block_sparse_moe.experts.{e}.{w}.weight"
                 for l in range(L) for e in range(E) for w in ("w1", "w2", "w3")}
    moe_ref.check_qlora_dequant(c, want)


def test_qlora_logits_loss_grads(qlora_case):
    moe_ref.check_lora(qlora_case, "qlora")


# --- training, adapters both ways, merge -----------------------------------------------


TRAIN_RUNS = [
    dict(id="full", shape="mixtral", targets=None, train=_train(1e-3)),
    dict(id="full-top3-sw", shape="mixtral_top3_sw", targets=None, train=_train(1e-3)),
    # (k_proj left out, as in test_train.py: its LoRA B rows of the slow RoPE dims have a
    # gradient near 0 that Adam turns into noise)
    dict(id="lora-qvo", shape="mixtral", targets=["q_proj", "v_proj", "o_proj"],
         train=_train(1e-2)),
]


@pytest.fixture(scope="module", params=TRAIN_RUNS, ids=[r["id"] for r in TRAIN_RUNS])
def train_case(request, moe_store, ft):
    """Five AdamW steps (warmup, cosine, clipping, weight decay) against torch's, the
    load-balancing loss in every step's loss and gradient."""
    return moe_ref.train_case(request.param, MOE_SHAPES, moe_store, ft, ckpt_grads,
                              "moe-train")


def test_train_losses_and_weights(train_case):
    moe_ref.check_train(train_case)


def _tool(var, name):
    return ftref.tool_exe(var, name)


def test_lora_init_all_linear_loads_in_peft(moe_store, tmp_path):
    """ft-lora-init with all-linear on a MoE model writes target_parameters, rank_pattern
    and alpha_pattern as PEFT does; PEFT loads it (no missing or unexpected keys) and, B
    being 0, it leaves the logits alone."""
    model_dir = moe_store("mixtral")
    out = tmp_path / "adapter"
    ftref.run_tool([_tool("FT_LORA_INIT", "ft-lora-init"), "--model", model_dir, "--out", out,
                    "--r", 4, "--alpha", 8, "--dropout", 0, "--target", "all-linear",
                    "--seed", 3])
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert sorted(cfg["target_parameters"]) == ["down_proj", "gate.weight", "gate_up_proj"]
    assert cfg["rank_pattern"] == {r".*\.gate_up_proj": 8}
    assert cfg["alpha_pattern"] == {r".*\.gate_up_proj": 16}
    pm, tensors = _loads_in_peft(model_dir, out)
    a = tensors["base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.weight"]
    assert a.shape == (4 * 8, 32) and a.abs().max() > 0  # E 2r rows, U(+-1/sqrt(C))
    assert a.abs().max() <= 1 / 32 ** 0.5
    ids, _ = ftref.make_batch(96, 2, 12, 0)
    assert torch.equal(ftref.hf_forward(pm, ids)[0],
                       ftref.hf_forward(ftref.load_hf(model_dir), ids)[0])


def test_lora_init_adapter_loads_in_peft(moe_store, tmp_path):
    """ft-lora-init on a MoE model: an adapter of the attention modules PEFT loads, B = 0."""
    model_dir = moe_store("mixtral")
    out = tmp_path / "adapter"
    ftref.run_tool([_tool("FT_LORA_INIT", "ft-lora-init"), "--model", model_dir, "--out", out,
                    "--r", 4, "--target", "q_proj,v_proj,o_proj", "--seed", 3])
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert sorted(cfg["target_modules"]) == ["o_proj", "q_proj", "v_proj"]
    moe_ref.check_lora_init_loads(model_dir, out)


def test_merge_loads_in_transformers(moe_store, tmp_path):
    """ft-merge of an attention adapter made by PEFT: the merged checkpoint (experts and
    router under the checkpoint's names) loads in transformers 5 with the logits of the
    PEFT model, and its weights equal merge_and_unload's."""
    model_dir = moe_store("mixtral")
    adapter = ftref.build_adapter(model_dir, tmp_path / "adapter",
                                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                  seed=5)
    moe_ref.check_merged(moe_ref.merge(model_dir, adapter, tmp_path / "merged", 1, ckpt_grads))


# --- ft-train end to end -----------------------------------------------------------------


@pytest.fixture(scope="module")
def train_dir(tmp_path_factory):
    """A tiny Mixtral with a tokenizer trained by `tokenizers`, and prompt/completion data."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import MixtralConfig, MixtralForCausalLM, PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("moe_train_tool")
    rows = [{"prompt": f"Q: colour of item {i}?",
             "completion": f" {['red', 'green', 'blue'][i % 3]}"} for i in range(40)]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator([r["prompt"] + r["completion"] for r in rows],
                           trainers.BpeTrainer(vocab_size=280, special_tokens=["<|endoftext|>"],
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                               show_progress=False))
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>")
    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=tk.get_vocab_size(), hidden_size=32, intermediate_size=48,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=64, eos_token_id=hf.eos_token_id,
                        num_local_experts=4, num_experts_per_tok=2, output_router_logits=True)
    MixtralForCausalLM(cfg).save_pretrained(d / "model")
    hf.save_pretrained(d / "model")
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:32]))
    return d


def _ft_train(d, name, mode, targets, dropout=None):
    import subprocess

    lora = f"    target_modules: {targets}\n" if targets else ""
    if dropout is not None:
        lora += f"    dropout: {dropout}\n"
    text = (f"model:\n  name: {d / 'model'}\n  max_seq_len: 32\n"
            f"tuning:\n  mode: {mode}\n  lora:\n    r: 4\n    alpha: 8\n{lora}"
            f"train:\n  batch_size: 4\n  max_steps: 4\n  learning_rate: 1e-2\n"
            f"  logging_steps: 1\n  output_dir: {d / name}\n"
            f"data:\n  train_path: {d / 'train.jsonl'}\n")
    (d / f"{name}.yaml").write_text(text)
    return subprocess.run([ftref.tool_exe("FT_TRAIN", "ft-train"), "--config",
                           str(d / f"{name}.yaml")], capture_output=True, text=True)


def _loads_in_peft(model_dir, adapter):
    """PEFT loads the adapter with every LoRA tensor of the file in the model (none
    missing or unexpected) and exactly the file's values."""
    from peft import PeftModel

    pm = PeftModel.from_pretrained(ftref.load_hf(model_dir), str(adapter))
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    mem = {ftref.peft_key(n): p for n, p in pm.named_parameters() if ".lora_" in n}
    assert set(mem) == set(tensors), sorted(set(mem) ^ set(tensors))
    for k, t in tensors.items():
        assert torch.equal(mem[k].detach(), t), k
    return pm, tensors


def test_ft_train_lora_and_full(train_dir):
    """ft-train runs LoRA (attention targets) and full fine-tuning of a MoE model; the
    final adapter loads in PEFT, the final full model in transformers."""
    r = _ft_train(train_dir, "lora", "lora", "q_proj,v_proj")
    assert r.returncode == 0, r.stderr
    _loads_in_peft(train_dir / "model", train_dir / "lora/final")
    r = _ft_train(train_dir, "full", "full", None)
    assert r.returncode == 0, r.stderr
    m = ftref.load_hf(train_dir / "full/final")
    assert m.config.model_type == "mixtral" and m.config.num_local_experts == 4


def test_ft_train_all_linear(train_dir):
    """all-linear on a MoE model is PEFT's: attention, the router and the experts
    (target_parameters gate.weight, gate_up_proj with its rank and alpha doubled,
    down_proj); the final adapter says so and loads in PEFT, its expert and router pairs
    trained (B moved off 0)."""
    r = _ft_train(train_dir, "all", "lora", "all-linear", dropout=0)
    assert r.returncode == 0, r.stderr
    cfg = json.loads((train_dir / "all/final/adapter_config.json").read_text())
    assert sorted(cfg["target_parameters"]) == ["down_proj", "gate.weight", "gate_up_proj"]
    assert cfg["rank_pattern"] == {r".*\.gate_up_proj": 8}
    assert cfg["alpha_pattern"] == {r".*\.gate_up_proj": 16}
    _, tensors = _loads_in_peft(train_dir / "model", train_dir / "all/final")
    for part in ("mlp.gate.lora_B", "mlp.experts.base_layer.lora_B", "mlp.experts.lora_B",
                 "self_attn.o_proj.lora_B"):
        ks = [k for k in tensors if part in k]
        assert ks and all(tensors[k].abs().max() > 0 for k in ks), part


def test_ft_train_refuses_moe_lora_with_dropout(train_dir):
    """The default target_modules (all-linear) with the default dropout: PEFT refuses
    dropout on target_parameters, and so do we, naming the key."""
    r = _ft_train(train_dir, "default", "lora", None)
    assert r.returncode != 0
    assert "dropout" in r.stderr and "tuning.lora.dropout" in r.stderr, r.stderr
    r = _ft_train(train_dir, "w1", "lora", "q_proj,w1", dropout=0)
    assert r.returncode != 0 and "w1 without w3" in r.stderr, r.stderr


# --- every dist.strategy on 2 ranks equals one process ----------------------------------


@pytest.fixture(scope="module")
def dist_work(tmp_path_factory):
    """A tiny Mixtral with the load-balancing loss on (coefficient 0.1, so that it moves
    the weights), and token data of uneven lengths (moe_ref.uneven_rows): one process's batch of
    8 rows is padded to its longest, each rank's 4 to theirs, so the batches hold different
    padding; the load-balancing statistics leave it out (the attention_mask), so the runs
    still agree."""
    import random

    import rankrun
    from transformers import MixtralConfig, MixtralForCausalLM

    assert rankrun.FT_TRAIN, "FT_TRAIN must be the path of bin/ft-train"
    d = tmp_path_factory.mktemp("moe_dist")
    torch.manual_seed(1)
    cfg = MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
                        router_aux_loss_coef=0.1)
    MixtralForCausalLM(cfg).save_pretrained(d / "model", safe_serialization=True)
    (d / "train.jsonl").write_text(moe_ref.uneven_rows(random.Random(3)))
    moe_padding.write_rows(d / "eval.jsonl", _EVAL_ROWS)
    return d


# held-out rows of uneven lengths, each counting as many tokens (moe_padding.eval_rows)
_EVAL_ROWS = moe_padding.eval_rows(random.Random(5), 64)

_STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "model_parallel")
# lora: attention only; moe-lora: all-linear, which on a MoE reaches the router and the
# experts (PEFT's target_parameters), dropout 0 as PEFT requires there
DIST_CASES = [("full", s) for s in _STRATEGIES] + \
             [("lora", s) for s in ("ddp", "zero3", "model_parallel")] + \
             [("moe-lora", s) for s in _STRATEGIES]


@pytest.mark.parametrize("mode,strategy", DIST_CASES, ids=[f"{m}-{s}" for m, s in DIST_CASES])
def test_dist_strategy_equals_one_process(dist_work, mode, strategy):
    """Losses, gradient norms and final weights of 2 ranks = one process. The load-balancing
    statistics are summed over the ranks (data parallel: the step's micro-batch; pipeline
    stages: the layers), so the aux term and its gradient are the one process's. The
    evaluation (eval/loss with the aux term, eval/aux_loss) is the HF Trainer's over the
    same eval batches (moe_padding.check_run_eval)."""
    moe_ref.check_dist_equals_one_process(dist_work, mode, strategy, _EVAL_ROWS)


def test_ft_train_logged_losses_are_trainers(dist_work):
    """The training loss ft-train logs per step (TensorBoard's train/loss) is the HF
    Trainer's: each micro-batch's load-balancing term (its own padding left out) added
    whole to the step's loss, with gradient accumulation 2; and its evaluation logs the
    Trainer's eval_loss. Learning rate 0 (the base weights throughout, on both sides),
    the rows in file order on both sides."""
    import rankrun
    from transformers import MixtralForCausalLM

    name = "single_trainer_losses"
    cfg = rankrun.write_config(dist_work, name, {
        "train.max_steps": 3, "train.learning_rate": 0.0, "train.warmup_steps": 0,
        "train.batch_size": 4, "train.grad_accum": 2, "data.shuffle": "false",
        "data.eval_path": dist_work / "eval.jsonl", "train.eval_strategy": "steps",
        "train.eval_steps": 3}, mode="full")
    rankrun.run(cfg, 1)
    run = dist_work / "runs" / name
    rows = [json.loads(line) for line in (dist_work / "train.jsonl").read_text().splitlines()]
    model = MixtralForCausalLM.from_pretrained(dist_work / "model")
    want = moe_padding.trainer_train_losses(model, [(r["input_ids"], r["labels"]) for r in rows],
                                            4, 2, 3, dist_work / "hf_train")
    got = moe_padding.tb_scalars(run, "train/loss")
    assert got.keys() == want.keys() == {1, 2, 3}, (got, want)
    for step in got:
        ftref.assert_close(f"train/loss step {step}", got[step], want[step], ftref.TOL_LOGITS)
    model.config.output_router_logits = False  # (the term shows far above the tolerance)
    bare = moe_padding.trainer_train_losses(model, [(r["input_ids"], r["labels"]) for r in rows],
                                            4, 2, 3, dist_work / "hf_train_bare")
    assert all(want[s] - bare[s] > 100 * ftref.TOL_LOGITS * want[s] for s in want), (want, bare)
    moe_padding.check_run_eval(run, dist_work / "model", "full", _EVAL_ROWS, 4, 3,
                               dist_work / "hf_eval")


def test_dist_refuses_gpipe_chunks_with_aux(dist_work):
    import rankrun

    cfg = rankrun.write_config(dist_work, "gpipe", {"train.max_steps": 1}, mode="full",
                               **{"dist__strategy": "model_parallel",
                                  "dist__pipeline_micro_batches": 2})
    for np_ in (2, 1):  # (one rank too: the model keeps one forward's statistics)
        r = rankrun.run(cfg, np_, check=False)
        assert r.returncode != 0 and "pipeline_micro_batches" in r.stderr, r.stderr[-2000:]


# --- LoRA on the router (PEFT's target_parameters gate.weight) ---------------------------

ROUTER_TARGETS = ["q_proj", "v_proj", "gate", "w1", "w2", "w3"]


@pytest.fixture(scope="module")
def router_case(moe_store, ft, tmp_path_factory):
    """LoRA on q, v, the router and the experts: PEFT on transformers 5 turns
    target_modules "gate", "w1" + "w3", "w2" into target_parameters gate.weight,
    gate_up_proj (rank and alpha doubled by rank_pattern / alpha_pattern), down_proj
    (ParamWrappers: keys mlp.gate.lora_A [r, C] / lora_B [E, r], mlp.experts.base_layer.
    lora_A [E 2r, C] / lora_B [2I, E 2r], mlp.experts.lora_A [E r, I] / lora_B [C, E r]).
    Every shape: top-3 of 6 and top-1 too."""
    out = {}
    for name in MOE_SHAPES:
        shape = MOE_SHAPES[name]
        model_dir = moe_store(name)
        adapter = ftref.build_adapter(model_dir, moe_store.root / f"adapter-router-{name}",
                                      target_modules=ROUTER_TARGETS, seed=13)
        model = ftref.lora_mode_model(model_dir, adapter)
        ids, labels = ftref.make_batch(model.config.vocab_size, B, shape.T, shape.seed + 5)
        logits, loss, grads = ftref.hf_grads(model, ids, labels, key=ftref.peft_key)
        spec = dict(model_dir=model_dir, adapter_dir=adapter, mode="lora", input_ids=ids,
                    labels=labels)
        res = ft(spec, f"moe-lora-router-{name}")
        out[name] = dict(adapter=adapter, model_dir=model_dir, logits=logits, loss=loss,
                         grads=grads, out=res, spec=spec)
    return out


def test_router_lora_config_as_peft_writes_it(router_case):
    cfg = json.loads((router_case["mixtral"]["adapter"] / "adapter_config.json").read_text())
    assert sorted(cfg["target_parameters"]) == ["down_proj", "gate.weight", "gate_up_proj"]
    assert sorted(cfg["target_modules"]) == ["q_proj", "v_proj"]
    assert cfg["rank_pattern"] == {r".*\.gate_up_proj": 8}
    assert cfg["alpha_pattern"] == {r".*\.gate_up_proj": 16}


@pytest.mark.parametrize("name", list(MOE_SHAPES))
def test_router_lora_logits_loss_grads(router_case, name):
    c = router_case[name]
    for part in (".mlp.gate.lora_B", ".mlp.experts.base_layer.lora_A", ".mlp.experts.lora_B"):
        assert any(part in k for k in c["grads"]), part
    assert {k for k in c["out"] if k.startswith("grad.")} == {f"grad.{k}" for k in c["grads"]}
    ftref.assert_close(f"[{name} router lora] logits", c["out"]["logits"], c["logits"],
                       ftref.TOL_LOGITS)
    ftref.assert_close(f"[{name} router lora] loss", c["out"]["loss"], c["loss"],
                       ftref.TOL_LOGITS)
    grads = c["grads"]
    if name == "mixtral_top1_noaux":
        # top-1 renormalised: the weight is 1 whatever the logits, so without the aux loss
        # nothing reaches the router (autograd's is rounding noise, |g| ~ 1e-9)
        router = {k for k in grads if ".mlp.gate.lora_" in k}
        for k in router:
            assert grads[k].abs().max() < 1e-7 and c["out"]["grad." + k].abs().max() < 1e-7, k
        grads = {k: v for k, v in grads.items() if k not in router}
        out = {k: v for k, v in c["out"].items() if k[len("grad."):] not in router}
    else:
        out = c["out"]
    ftref.assert_tensor_dict_close("grad.", out, grads, ftref.TOL_GRAD)


EXPERT_VARIANTS = {
    # gate_up alone: its pair at mlp.experts.lora_A/B (no nesting); rsLoRA: the pair's
    # scaling is 2 alpha / sqrt(2 r), not alpha / sqrt(r)
    "w1w3-rslora": dict(target_modules=["w1", "w3"], use_rslora=True),
    "w2": dict(target_modules=["k_proj", "w2"]),
    "all-linear": dict(target_modules="all-linear"),
}


@pytest.fixture(scope="module", params=list(EXPERT_VARIANTS))
def expert_variant(request, moe_store, ft, tmp_path_factory):
    """Other expert targets on the first shape: logits, loss and LoRA grads vs PEFT, and the
    adapter saved after one AdamW step loads in PEFT with exactly our tensors."""
    name = request.param
    shape = MOE_SHAPES["mixtral"]
    model_dir = moe_store(shape.name)
    adapter = ftref.build_adapter(model_dir, moe_store.root / f"adapter-x-{name}", seed=19,
                                  **EXPERT_VARIANTS[name])
    model = ftref.lora_mode_model(model_dir, adapter)
    ids, labels = ftref.make_batch(model.config.vocab_size, B, shape.T, shape.seed + 7)
    logits, loss, grads = ftref.hf_grads(model, ids, labels, key=ftref.peft_key)
    out = ft(dict(model_dir=model_dir, adapter_dir=adapter, mode="lora", input_ids=ids,
                  labels=labels), f"moe-lora-x-{name}")
    saved = tmp_path_factory.mktemp(f"x-saved-{name}") / "adapter"
    trained = ft(dict(model_dir=model_dir, adapter_dir=adapter, mode="lora", input_ids=ids,
                      labels=labels, train=dict(_train(1e-2), steps=1, warmup_steps=0),
                      save_adapter=str(saved)), f"moe-lora-x-{name}-save")
    return dict(name=name, adapter=adapter, model_dir=model_dir, logits=logits, loss=loss,
                grads=grads, out=out, saved=saved, trained=trained)


def test_expert_lora_variants(expert_variant):
    c = expert_variant
    cfg = json.loads((c["adapter"] / "adapter_config.json").read_text())
    if c["name"] == "w2":
        assert cfg["target_parameters"] == ["down_proj"] and not cfg["rank_pattern"]
        assert any(".mlp.experts.lora_A" in k for k in c["grads"])
    else:
        assert "gate_up_proj" in cfg["target_parameters"]
    if c["name"] == "w1w3-rslora":
        assert any(".mlp.experts.lora_A" in k for k in c["grads"])
    assert {k for k in c["out"] if k.startswith("grad.")} == {f"grad.{k}" for k in c["grads"]}
    ftref.assert_close(f"[{c['name']}] logits", c["out"]["logits"], c["logits"], ftref.TOL_LOGITS)
    ftref.assert_close(f"[{c['name']}] loss", c["out"]["loss"], c["loss"], ftref.TOL_LOGITS)
    ftref.assert_tensor_dict_close("grad.", c["out"], c["grads"], ftref.TOL_GRAD)


def test_expert_lora_saved_adapter_loads_in_peft(expert_variant):
    from peft import PeftModel

    c = expert_variant
    ours = load_file(str(c["saved"] / "adapter_model.safetensors"))
    theirs = load_file(str(c["adapter"] / "adapter_model.safetensors"))
    assert set(ours) == set(theirs)
    ours_cfg = json.loads((c["saved"] / "adapter_config.json").read_text())
    theirs_cfg = json.loads((c["adapter"] / "adapter_config.json").read_text())
    assert sorted(ours_cfg["target_parameters"]) == sorted(theirs_cfg["target_parameters"])
    for k in ("rank_pattern", "alpha_pattern", "use_rslora"):
        assert ours_cfg[k] == theirs_cfg[k], k
    pm = PeftModel.from_pretrained(ftref.load_hf(c["model_dir"]), str(c["saved"]))
    mem = {ftref.peft_key(n): p for n, p in pm.named_parameters() if ".lora_" in n}
    assert set(mem) == set(ours), sorted(set(mem) ^ set(ours))
    for k, t in ours.items():
        assert torch.equal(mem[k].detach(), t), k
        assert torch.equal(t, c["trained"]["weight." + k]), k
        assert not torch.equal(t, theirs[k]), k  # the step moved it


@pytest.mark.parametrize("name", list(MOE_SHAPES))
def test_expert_lora_grad_ckpt_equal(router_case, ft, name):
    """Gradient checkpointing recomputes the router's and the experts' LoRA paths: the same
    gradients bit for bit."""
    c = router_case[name]
    out = ft(dict(c["spec"], grad_ckpt=True), f"moe-lora-router-{name}-ckpt")
    for k, v in c["out"].items():
        if k.startswith("grad.") or k in ("loss", "logits"):
            assert torch.equal(out[k], v), k


def test_moe_lora_refusals(router_case, moe_store, ft_raw, tmp_path):
    """What stays refused in an adapter_config.json: target_parameters other than the
    router's and the experts', a rank_pattern key that matches no module LoRA targets
    (PEFT ignores it), patterns giving a pair another rank than its tensors have, dropout
    beside target_parameters (PEFT refuses it), and a target_modules regex (PEFT resolves
    it against the fused experts' names). (Patterns PEFT honours: test_lora_patterns.py.)"""
    model_dir = moe_store("mixtral")
    ids, labels = ftref.make_batch(96, 1, 6, 0)
    adapter = moe_store.root / "adapter-router-mixtral"
    pat = r".*\.gate_up_proj"
    for variant, edit, needle in [
            ("other", dict(target_parameters=["gate.weight", "lm_head.weight"]),
             "lm_head.weight"),
            ("dropout", dict(lora_dropout=0.1), "lora_dropout"),
            ("no-pattern", dict(rank_pattern={}), "wrong shape"),
            ("rank", dict(rank_pattern={pat: 4}), "wrong shape"),
            ("unmatched-pattern", dict(rank_pattern={pat: 8, "o_proj": 2}), "rank_pattern"),
            ("router-name", dict(alpha_pattern={pat: 16, "mlp.gate": 2}), "alpha_pattern"),
            ("regex", dict(target_modules=r".*\.q_proj"), "regex")]:
        d = tmp_path / variant
        d.mkdir()
        cfg = json.loads((adapter / "adapter_config.json").read_text())
        cfg.update(edit)
        (d / "adapter_config.json").write_text(json.dumps(cfg))
        (d / "adapter_model.safetensors").write_bytes(
            (adapter / "adapter_model.safetensors").read_bytes())
        _refused(ft_raw, dict(model_dir=model_dir, adapter_dir=d, mode="lora", input_ids=ids,
                              labels=labels), f"moe-lora-refused-{variant}",
                 "adapter_config.json", needle)


@pytest.fixture(scope="module")
def router_train(moe_store, ft, tmp_path_factory):
    """Five AdamW steps of LoRA on q, v, o, the router and the experts against torch's
    (aux loss in), the trained adapter saved."""
    shape = MOE_SHAPES["mixtral"]
    model_dir = moe_store(shape.name)
    adapter = ftref.build_adapter(model_dir, moe_store.root / "adapter-train-router",
                                  target_modules=["q_proj", "v_proj", "o_proj", "gate", "w1",
                                                  "w2", "w3"], seed=17)
    m = ftref.lora_mode_model(model_dir, adapter)
    ids, labels = ftref.make_batch(shape.cfg["vocab_size"], B, shape.T, shape.seed + 6)
    train = _train(1e-2)
    ref = ftref.reference_train(m, ids, labels, train, key=ftref.peft_key)
    saved = tmp_path_factory.mktemp("router-saved") / "adapter"
    out = ft(dict(model_dir=model_dir, adapter_dir=adapter, mode="lora", input_ids=ids,
                  labels=labels, train=train, save_adapter=str(saved)), "moe-train-router")
    return dict(ref=ref, out=out, saved=saved, model_dir=model_dir)


def test_router_lora_train(router_train):
    ref, out = router_train["ref"], router_train["out"]
    assert any(".mlp.gate.lora_A" in k for k in ref["weights"])
    assert any(".mlp.experts.base_layer.lora_B" in k for k in ref["weights"])
    ftref.assert_close("router losses", out["losses"], ref["losses"], ftref.TOL_LOSSES)
    ftref.assert_tensor_dict_close("weight.", out, ref["weights"], ftref.TOL_WEIGHT)


def test_router_lora_adapter_saved_loads_in_peft(router_train):
    """The trained adapter we save: target_parameters as PEFT writes it, and PEFT loads it
    with no missing or unexpected keys, holding exactly our trained tensors."""
    from peft import PeftModel

    c = router_train
    cfg = json.loads((c["saved"] / "adapter_config.json").read_text())
    assert sorted(cfg["target_parameters"]) == ["down_proj", "gate.weight", "gate_up_proj"]
    ours = load_file(str(c["saved"] / "adapter_model.safetensors"))
    want = {k[len("weight."):]: v for k, v in c["out"].items() if k.startswith("weight.")}
    assert set(ours) == set(want)
    pm = PeftModel.from_pretrained(ftref.load_hf(c["model_dir"]), str(c["saved"]))
    mem = {ftref.peft_key(n): p for n, p in pm.named_parameters() if ".lora_" in n}
    assert set(mem) == set(ours), sorted(set(mem) ^ set(ours))
    for k, t in ours.items():
        assert torch.equal(mem[k].detach(), t), k
        assert torch.equal(t, want[k]), k


def test_router_lora_merge(router_case, moe_store, tmp_path):
    """ft-merge folds the router's pair into block_sparse_moe.gate.weight and the experts'
    into experts.E.w1/w3/w2 as PEFT's merge_and_unload does; the output loads in
    transformers with the PEFT model's logits."""
    model_dir = moe_store("mixtral")
    adapter = moe_store.root / "adapter-router-mixtral"
    m = moe_ref.merge(model_dir, adapter, tmp_path / "merged", 3, ckpt_grads)
    base = load_file(str(model_dir / "model.safetensors"))
    for k in ("gate", "experts.0.w1", "experts.1.w3", "experts.3.w2"):
        k = f"model.layers.0.block_sparse_moe.{k}.weight"
        assert not torch.equal(m.ours[k], base[k]), k
    moe_ref.check_merged(m)
