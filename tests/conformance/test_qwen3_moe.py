"""Qwen3-MoE (issue 22) against transformers 5, on tiny random models from Qwen3MoeConfig:
qwen3's attention (per-head q/k RMSNorm, head_dim from the config, attention_bias) with
the sparse MoE block of modeling_qwen3_moe.py (router softmax, top-k, renormalised only
with norm_topk_prob, the experts of width moe_intermediate_size) and the router
load-balancing loss (output_router_logits, router_aux_loss_coef), and dense layers
(mlp_only_layers, decoder_sparse_step: a plain MLP of intermediate_size, mlp.gate_proj,
..., which PEFT's MLP names do not reach: they are mapped to the experts).

transformers 5 holds the experts as fused 3-D parameters (mlp.experts.gate_up_proj
[E, 2I, C] = each expert's [gate_proj; up_proj], mlp.experts.down_proj [E, C, I]) and the
router as mlp.gate.weight; save_pretrained writes (and ftkit reads) per-expert names,
model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight. Gradients are compared under the
checkpoint's names (ckpt_grads splits the fused ones).

The same checks as test_moe.py's for mixtral: logits and loss (aux included), every
full-mode gradient, gradient checkpointing, LoRA on attention and on the router and
experts (PEFT's target_parameters), QLoRA (experts quantized on
load; a quantized checkpoint's experts dense), five AdamW steps, adapters both ways,
ft-merge, and every dist.strategy on 2 ranks against one process (their evaluations
against the HF Trainer's eval_loss, the aux term included). The GPU path:
test_gpu_moe.py."""

import json
import random

import pytest
import torch

import ftref
import moe_padding
import moe_ref

ckpt_grads = moe_ref.qwen_ckpt_grads  # (the fused experts split; the GPU file's too)
_train = moe_ref.train_hparams

# The aux coefficient is far above the default 0.001 so that a wrong load-balancing term
# is far outside the tolerances; intermediate_size (the dense width) differs from
# moe_intermediate_size, which the experts use.
_BASE = dict(ftref._BASE, intermediate_size=40, moe_intermediate_size=24, num_experts=4,
             num_experts_per_tok=2, norm_topk_prob=False, output_router_logits=True,
             router_aux_loss_coef=0.3, head_dim=12)

SHAPES = {
    s.name: s
    for s in [
        ftref.Shape("qwen3_moe", "qwen3_moe", dict(_BASE), seed=400,
                    note="top-2 of 4 not renormalised, head_dim 12 != hidden / heads"),
        ftref.Shape("qwen3_moe_top3_norm", "qwen3_moe",
                    {k: v for k, v in dict(_BASE, num_experts=6, num_experts_per_tok=3,
                                           norm_topk_prob=True, attention_bias=True,
                                           num_key_value_heads=1,
                                           tie_word_embeddings=True).items()
                     if k != "head_dim"}, T=14, seed=410,
                    note="top-3 of 6 renormalised, q/k/v/o biases, MQA, tied, head_dim absent"),
        ftref.Shape("qwen3_moe_top1_noaux", "qwen3_moe",
                    dict(_BASE, num_experts=3, num_experts_per_tok=1,
                         output_router_logits=False), seed=420,
                    note="top-1 not renormalised (the router's gradient through p), no aux"),
        ftref.Shape("qwen3_moe_dense", "qwen3_moe",
                    dict(_BASE, num_hidden_layers=4, mlp_only_layers=[0],
                         decoder_sparse_step=2), seed=430,
                    note="layers 0 and 2 dense (mlp_only_layers, decoder_sparse_step 2), "
                         "1 and 3 sparse; the dense MLP wider than the experts"),
    ]
}

_PROJ = ("gate_proj", "up_proj", "down_proj")

store = moe_ref.store_fixture(SHAPES, "qwen3_moe")


@pytest.fixture(scope="module", params=list(SHAPES))
def case(request, store, ft):
    return moe_ref.full_case(SHAPES[request.param], store(request.param), ft, ckpt_grads)


def test_config_as_written(case):
    """The shapes are what they claim (a guard on the fixtures themselves)."""
    cfg = json.loads((case.model_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_moe"
    assert cfg["num_local_experts"] == case.shape.cfg["num_experts"]  # (as HF 5 writes it)
    assert cfg["norm_topk_prob"] == case.shape.cfg["norm_topk_prob"]
    assert cfg["moe_intermediate_size"] != cfg["intermediate_size"]
    assert ("head_dim" in cfg) == ("head_dim" in case.shape.cfg)
    dense = [l for l in range(case.cfg.num_hidden_layers) if l in case.cfg.mlp_only_layers
             or (l + 1) % case.cfg.decoder_sparse_step != 0]
    assert bool(dense) == (case.shape.name == "qwen3_moe_dense")
    for l in range(case.cfg.num_hidden_layers):
        assert (f"model.layers.{l}.mlp.gate_proj.weight" in case.ref_grads) == (l in dense)
        assert (f"model.layers.{l}.mlp.gate.weight" in case.ref_grads) == (l not in dense)
    moe_ref.check_aux_share(case)


def test_eval_logits_loss(case):
    moe_ref.check_logits_loss(case, "eval")


def test_full_logits_loss(case):
    moe_ref.check_logits_loss(case, "full")


def test_full_grads(case):
    """Every parameter's gradient: attention, q/k norms, norms, router, each expert's
    gate/up/down_proj (the top-1 unnormalised router gets its gradient through p)."""
    assert any(k.endswith(".mlp.gate.weight") for k in case.ref_grads)
    ftref.assert_tensor_dict_close("grad.", case.full_out, case.ref_grads, ftref.TOL_GRAD)


def test_grad_ckpt_equal(case, ft):
    moe_ref.check_grad_ckpt_equal(case, ft)


def test_ft_eval_loss_with_aux(store, tmp_path):
    """ft-eval's aux_loss and loss_with_aux against transformers (test_moe.py's)."""
    import moe_padding

    moe_padding.check_ft_eval_aux(store("qwen3_moe_top3_norm"), tmp_path, "qwen3_moe")


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen3_moe_top3_norm"])
def test_padded_batch_aux_mask(store, ft, name):
    """Right padding: the load-balancing loss and its gradient leave the padded rows out,
    as transformers given the attention_mask (moe_padding.py)."""
    import moe_padding

    shape = SHAPES[name]
    moe_padding.check_padded_aux(store(name), shape.T, shape.seed + 5, ft, ckpt_grads, name)


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen3_moe_top3_norm", "qwen3_moe_dense"])
def lora_case(request, store, ft):
    """LoRA on the attention modules (router and experts frozen)."""
    shape = SHAPES[request.param]
    model_dir = store(shape.name)
    adapter = ftref.build_adapter(model_dir, store.root / f"adapter-qkvo-{shape.name}",
                                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                  seed=7)
    return moe_ref.lora_case(shape, model_dir, adapter, ft, shape.seed + 1,
                             f"{shape.name}-lora-qkvo")


def test_lora_attention(lora_case):
    moe_ref.check_lora(lora_case, "[qwen3_moe lora]")


EXPERT_TARGETS = {"all-linear": "all-linear",
                  "router-experts": ["q_proj", "v_proj", "gate", "gate_proj", "up_proj",
                                     "down_proj"]}


@pytest.mark.parametrize("variant", list(EXPERT_TARGETS))
@pytest.mark.parametrize("name", ["qwen3_moe", "qwen3_moe_top3_norm", "qwen3_moe_dense"])
def test_lora_router_experts(store, ft, name, variant):
    """LoRA on the router and the experts as PEFT on transformers 5 puts it
    (target_parameters gate.weight, gate_up_proj, down_proj; test_moe.py's router_case
    describes the layout): logits, loss and every LoRA gradient against PEFT."""
    shape = SHAPES[name]
    model_dir = store(name)
    adapter = ftref.build_adapter(model_dir, store.root / f"adapter-x-{name}-{variant}",
                                  target_modules=EXPERT_TARGETS[variant], seed=13)
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    assert sorted(cfg["target_parameters"]) == ["down_proj", "gate.weight", "gate_up_proj"]
    c = moe_ref.lora_case(shape, model_dir, adapter, ft, shape.seed + 5,
                          f"qwen3-moe-lora-x-{name}-{variant}")
    for part in (".mlp.gate.lora_B", ".mlp.experts.base_layer.lora_A", ".mlp.experts.lora_B"):
        assert any(part in k for k in c["grads"]), part
    moe_ref.check_lora(c, "", same_keys=True)


QLORA_CASES = [dict(type="nf4", blocksize=64, double_quant=True), dict(type="int8"),
               dict(type="nf4", blocksize=64, double_quant=True, ckpt=True)]


@pytest.fixture(scope="module", params=QLORA_CASES,
                ids=[q["type"] + ("-ckpt" if q.get("ckpt") else "") for q in QLORA_CASES])
def qlora_case(request, store, ft):
    """QLoRA: attention and every expert quantized on load (the router and q/k norms stay
    dense), LoRA on attention; the reference is transformers + PEFT on a model holding
    exactly our dequantized weights."""
    q = request.param
    shape = SHAPES["qwen3_moe"]
    model_dir = store(shape.name)
    adapter = ftref.build_adapter(model_dir, store.root / "adapter-qlora",
                                  target_modules=["q_proj", "v_proj", "o_proj"], seed=9)
    kind = f"{q['type']}{'-ckpt' if q.get('ckpt') else ''}"
    return moe_ref.qlora_case(q, shape, model_dir, adapter, store, ft, moe_ref.qwen_v5_state,
                              "moe_intermediate_size", f"qwen3-moe-qlora-{kind}",
                              store.root / f"dequant-{kind}")


def test_qlora_quantizes_attention_and_experts(qlora_case):
    c = qlora_case
    L, E = c["cfg"].num_hidden_layers, c["cfg"].num_experts
    want = {f"model.layers.{l}.self_attn.{p}.weight" for l in range(L)
            for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
    if not c["q"].get("ckpt"):
        want |= {f"model.layers.{l}.mlp.experts.{e}.{p}.weight"
                 for l in range(L) for e in range(E) for p in _PROJ}
    moe_ref.check_qlora_dequant(c, want)


def test_qlora_logits_loss_grads(qlora_case):
    moe_ref.check_lora(qlora_case, "qlora")


# --- training, adapters both ways, merge -----------------------------------------------

TRAIN_RUNS = [
    dict(id="full", shape="qwen3_moe", targets=None, train=_train(1e-3)),
    dict(id="full-top3-norm", shape="qwen3_moe_top3_norm", targets=None, train=_train(1e-3)),
    dict(id="full-dense", shape="qwen3_moe_dense", targets=None, train=_train(1e-3)),
    dict(id="lora-qvo", shape="qwen3_moe", targets=["q_proj", "v_proj", "o_proj"],
         train=_train(1e-2)),
]


@pytest.fixture(scope="module", params=TRAIN_RUNS, ids=[r["id"] for r in TRAIN_RUNS])
def train_case(request, store, ft):
    """Five AdamW steps (warmup, cosine, clipping, weight decay) against torch's, the
    load-balancing loss in every step's loss and gradient."""
    return moe_ref.train_case(request.param, SHAPES, store, ft, ckpt_grads, "qwen3-moe-train")


def test_train_losses_and_weights(train_case):
    moe_ref.check_train(train_case)


def test_lora_init_adapter_loads_in_peft(store, tmp_path):
    """ft-lora-init: an adapter of the attention modules PEFT loads, B = 0."""
    model_dir = store("qwen3_moe")
    out = tmp_path / "adapter"
    ftref.run_tool([ftref.tool_exe("FT_LORA_INIT", "ft-lora-init"), "--model", model_dir,
                    "--out", out, "--r", 4, "--target", "q_proj,k_proj,v_proj,o_proj",
                    "--seed", 3])
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert sorted(cfg["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    moe_ref.check_lora_init_loads(model_dir, out)


@pytest.mark.parametrize("shape", ["qwen3_moe", "qwen3_moe_top3_norm", "qwen3_moe_dense"])
def test_merge_loads_in_transformers(store, tmp_path, shape):
    """ft-merge of a PEFT attention adapter: the merged checkpoint loads in transformers 5
    with the PEFT model's logits, and its weights equal merge_and_unload's."""
    model_dir = store(shape)
    adapter = ftref.build_adapter(model_dir, tmp_path / "adapter",
                                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                  seed=5)
    out = tmp_path / "merged"
    moe_ref.check_merged(moe_ref.merge(model_dir, adapter, out, 1, ckpt_grads))


# --- every dist.strategy on 2 ranks equals one process ----------------------------------


@pytest.fixture(scope="module")
def dist_work(tmp_path_factory):
    """A tiny Qwen3-MoE with the load-balancing loss on (coefficient 0.1) and token data of
    uneven lengths, so that one process's batches and the ranks' hold different padding
    (test_moe.py's dist_work says why the runs still agree)."""
    import random

    import rankrun
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    assert rankrun.FT_TRAIN, "FT_TRAIN must be the path of bin/ft-train"
    d = tmp_path_factory.mktemp("qwen3_moe_dist")
    torch.manual_seed(1)
    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=40,
                         moe_intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                         num_experts=4, num_experts_per_tok=2, output_router_logits=True,
                         router_aux_loss_coef=0.1)
    Qwen3MoeForCausalLM(cfg).save_pretrained(d / "model", safe_serialization=True)
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
    """Losses, gradient norms and final weights of 2 ranks = one process (the
    load-balancing statistics summed over the ranks: test_moe.py's); the evaluation is the
    HF Trainer's, its aux term included (moe_padding.check_run_eval)."""
    moe_ref.check_dist_equals_one_process(dist_work, mode, strategy, _EVAL_ROWS)
