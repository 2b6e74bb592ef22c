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
import re

import pytest
import torch
from safetensors.torch import load_file

import ftref
import moe_padding
from test_moe import _same_run, _train, _uneven_rows

B = 2

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


def ckpt_grads(grads, cfg):
    """HF 5 names (fused experts) -> the checkpoint's (per-expert gate/up/down_proj)."""
    I = cfg.moe_intermediate_size
    out = {}
    for n, g in grads.items():
        if n.endswith(".mlp.experts.gate_up_proj"):
            pre = n[: -len(".gate_up_proj")]
            for e in range(g.shape[0]):
                out[f"{pre}.{e}.gate_proj.weight"] = g[e, :I]
                out[f"{pre}.{e}.up_proj.weight"] = g[e, I:]
        elif n.endswith(".mlp.experts.down_proj"):
            pre = n[: -len(".down_proj")]
            for e in range(g.shape[0]):
                out[f"{pre}.{e}.down_proj.weight"] = g[e]
        else:
            out[n] = g
    return out


def v5_state(sd, ckpt, I):
    """Writes checkpoint-named tensors into sd, a transformers 5 state dict, in place."""
    for k, v in ckpt.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+_proj)\.weight", k)
        if not m:
            sd[k] = v
            continue
        l, e, p = int(m.group(1)), int(m.group(2)), m.group(3)
        if p == "down_proj":
            sd[f"model.layers.{l}.mlp.experts.down_proj"][e] = v
        else:
            rows = slice(0, I) if p == "gate_proj" else slice(I, 2 * I)
            sd[f"model.layers.{l}.mlp.experts.gate_up_proj"][e, rows] = v


class Case:
    pass


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3_moe")
    built = {}

    def model(name):
        if name not in built:
            built[name] = ftref.build_model_dir(SHAPES[name], root / name)
        return built[name]

    model.root = root
    return model


@pytest.fixture(scope="module", params=list(SHAPES))
def case(request, store, ft):
    shape = SHAPES[request.param]
    c = Case()
    c.shape = shape
    c.model_dir = store(shape.name)
    model = ftref.full_mode_model(c.model_dir)
    c.cfg = model.config
    c.ids, c.labels = ftref.make_batch(model.config.vocab_size, B, shape.T, shape.seed)
    c.ref_logits, c.ref_loss, grads = ftref.hf_grads(model, c.ids, c.labels)
    c.ref_grads = ckpt_grads(grads, model.config)
    with torch.no_grad():
        c.ref_aux = model(input_ids=c.ids, labels=c.labels).aux_loss
    c.spec = dict(model_dir=c.model_dir, input_ids=c.ids, labels=c.labels)
    c.eval_out = ft(dict(c.spec, mode="eval"), f"{shape.name}-eval")
    c.full_out = ft(dict(c.spec, mode="full"), f"{shape.name}-full")
    return c


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
    if case.shape.cfg["output_router_logits"]:
        assert case.ref_aux is not None
        share = case.shape.cfg["router_aux_loss_coef"] * float(case.ref_aux) / float(case.ref_loss)
        assert share > 100 * ftref.TOL_LOGITS


def test_eval_logits_loss(case):
    name = case.shape.name
    ftref.assert_close(f"[{name}] eval logits", case.eval_out["logits"], case.ref_logits,
                       ftref.TOL_LOGITS)
    ftref.assert_close(f"[{name}] eval loss", case.eval_out["loss"], case.ref_loss,
                       ftref.TOL_LOGITS)


def test_full_logits_loss(case):
    name = case.shape.name
    ftref.assert_close(f"[{name}] full logits", case.full_out["logits"], case.ref_logits,
                       ftref.TOL_LOGITS)
    ftref.assert_close(f"[{name}] full loss", case.full_out["loss"], case.ref_loss,
                       ftref.TOL_LOGITS)


def test_full_grads(case):
    """Every parameter's gradient: attention, q/k norms, norms, router, each expert's
    gate/up/down_proj (the top-1 unnormalised router gets its gradient through p)."""
    assert any(k.endswith(".mlp.gate.weight") for k in case.ref_grads)
    ftref.assert_tensor_dict_close("grad.", case.full_out, case.ref_grads, ftref.TOL_GRAD)


def test_grad_ckpt_equal(case, ft):
    out = ft(dict(case.spec, mode="full", grad_ckpt=True), f"{case.shape.name}-full-ckpt")
    for k, v in case.full_out.items():
        if k.startswith("grad.") or k in ("loss", "logits"):
            assert torch.equal(out[k], v), k


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
    model = ftref.lora_mode_model(model_dir, adapter)
    ids, labels = ftref.make_batch(model.config.vocab_size, B, shape.T, shape.seed + 1)
    logits, loss, grads = ftref.hf_grads(model, ids, labels, key=ftref.peft_key)
    out = ft(dict(model_dir=model_dir, adapter_dir=adapter, mode="lora", input_ids=ids,
                  labels=labels), f"{shape.name}-lora-qkvo")
    return dict(logits=logits, loss=loss, grads=grads, out=out)


def test_lora_attention(lora_case):
    c = lora_case
    ftref.assert_close("[qwen3_moe lora] logits", c["out"]["logits"], c["logits"],
                       ftref.TOL_LOGITS)
    ftref.assert_close("[qwen3_moe lora] loss", c["out"]["loss"], c["loss"], ftref.TOL_LOGITS)
    ftref.assert_tensor_dict_close("grad.", c["out"], c["grads"], ftref.TOL_GRAD)


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
    model = ftref.lora_mode_model(model_dir, adapter)
    ids, labels = ftref.make_batch(model.config.vocab_size, B, shape.T, shape.seed + 5)
    logits, loss, grads = ftref.hf_grads(model, ids, labels, key=ftref.peft_key)
    out = ft(dict(model_dir=model_dir, adapter_dir=adapter, mode="lora", input_ids=ids,
                  labels=labels), f"qwen3-moe-lora-x-{name}-{variant}")
    for part in (".mlp.gate.lora_B", ".mlp.experts.base_layer.lora_A", ".mlp.experts.lora_B"):
        assert any(part in k for k in grads), part
    assert {k for k in out if k.startswith("grad.")} == {f"grad.{k}" for k in grads}
    ftref.assert_close("logits", out["logits"], logits, ftref.TOL_LOGITS)
    ftref.assert_close("loss", out["loss"], loss, ftref.TOL_LOGITS)
    ftref.assert_tensor_dict_close("grad.", out, grads, ftref.TOL_GRAD)


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
    m = ftref.load_hf(model_dir)
    ids, labels = ftref.make_batch(m.config.vocab_size, B, shape.T, shape.seed + 4)
    spec = dict(adapter_dir=adapter, mode="lora", input_ids=ids, labels=labels)
    tag = f"qwen3-moe-qlora-{q['type']}{'-ckpt' if q.get('ckpt') else ''}"
    if q.get("ckpt"):
        qdir = store.root / "quantized"
        if not qdir.exists():
            ftref.run_tool([ftref.tool_exe("FT_QUANTIZE", "ft-quantize"), "--model", model_dir,
                            "--out", qdir, "--type", q["type"]])
        out = ft(dict(spec, model_dir=qdir), tag)
    else:
        out = ft(dict(spec, model_dir=model_dir, quant=q), tag)
    deq = {k[len("dequant."):]: v for k, v in out.items() if k.startswith("dequant.")}
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    v5_state(sd, deq, m.config.moe_intermediate_size)
    m.load_state_dict(sd)
    ref_dir = store.root / f"dequant-{q['type']}{'-ckpt' if q.get('ckpt') else ''}"
    m.save_pretrained(ref_dir, safe_serialization=True)
    ref = ftref.lora_mode_model(ref_dir, adapter)
    logits, loss, grads = ftref.hf_grads(ref, ids, labels, key=ftref.peft_key)
    ckpt = load_file(str(model_dir / "model.safetensors"))
    return dict(q=q, out=out, deq=deq, ckpt=ckpt, logits=logits, loss=loss, grads=grads,
                L=m.config.num_hidden_layers, E=m.config.num_experts)


def test_qlora_quantizes_attention_and_experts(qlora_case):
    from test_qlora import _bound

    c = qlora_case
    want = {f"model.layers.{l}.self_attn.{p}.weight" for l in range(c["L"])
            for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
    if not c["q"].get("ckpt"):
        want |= {f"model.layers.{l}.mlp.experts.{e}.{p}.weight"
                 for l in range(c["L"]) for e in range(c["E"]) for p in _PROJ}
    assert set(c["deq"]) == want  # the router is not quantized
    for name, d in c["deq"].items():
        w = c["ckpt"][name].float().numpy()
        err = abs(d.numpy().reshape(-1) - w.reshape(-1))
        assert (err <= _bound(w, c["q"])).all(), name
        assert err.max() > 0, name


def test_qlora_logits_loss_grads(qlora_case):
    c = qlora_case
    ftref.assert_close("qlora logits", c["out"]["logits"], c["logits"], ftref.TOL_LOGITS)
    ftref.assert_close("qlora loss", c["out"]["loss"], c["loss"], ftref.TOL_LOGITS)
    ftref.assert_tensor_dict_close("grad.", c["out"], c["grads"], ftref.TOL_GRAD)


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
    run = request.param
    shape = SHAPES[run["shape"]]
    model_dir = store(shape.name)
    ids, labels = ftref.make_batch(shape.cfg["vocab_size"], B, shape.T, shape.seed + 2)
    if run["targets"] is None:
        m = ftref.full_mode_model(model_dir)
        spec = dict(model_dir=model_dir, mode="full")
        key = lambda n: n  # noqa: E731
    else:
        adapter = ftref.build_adapter(model_dir, store.root / f"adapter-train-{run['id']}",
                                      target_modules=run["targets"], seed=11)
        m = ftref.lora_mode_model(model_dir, adapter)
        spec = dict(model_dir=model_dir, adapter_dir=adapter, mode="lora")
        key = ftref.peft_key
    ref = ftref.reference_train(m, ids, labels, run["train"], key=key)
    ref["weights"] = ckpt_grads(ref["weights"], m.config)
    spec.update(input_ids=ids, labels=labels, train=run["train"])
    out = ft(spec, f"qwen3-moe-train-{run['id']}")
    return dict(ref=ref, out=out, run=run)


def test_train_losses_and_weights(train_case):
    ref, out = train_case["ref"], train_case["out"]
    ftref.assert_close(f"losses (ref {[round(x, 6) for x in ref['losses'].tolist()]})",
                       out["losses"], ref["losses"], ftref.TOL_LOSSES)
    ftref.assert_tensor_dict_close("weight.", out, ref["weights"], ftref.TOL_WEIGHT)


def test_lora_init_adapter_loads_in_peft(store, tmp_path):
    """ft-lora-init: an adapter of the attention modules PEFT loads, B = 0."""
    from peft import PeftModel

    model_dir = store("qwen3_moe")
    out = tmp_path / "adapter"
    ftref.run_tool([ftref.tool_exe("FT_LORA_INIT", "ft-lora-init"), "--model", model_dir,
                    "--out", out, "--r", 4, "--target", "q_proj,k_proj,v_proj,o_proj",
                    "--seed", 3])
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert sorted(cfg["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    pm = PeftModel.from_pretrained(ftref.load_hf(model_dir), str(out))
    tensors = load_file(str(out / "adapter_model.safetensors"))
    mem = {ftref.peft_key(n): p for n, p in pm.named_parameters() if ".lora_" in n}
    assert set(mem) == set(tensors)
    for k, t in tensors.items():
        assert torch.equal(mem[k].detach(), t), k
    ids, _ = ftref.make_batch(96, 2, 12, 0)
    assert torch.equal(ftref.hf_forward(pm, ids)[0],
                       ftref.hf_forward(ftref.load_hf(model_dir), ids)[0])


@pytest.mark.parametrize("shape", ["qwen3_moe", "qwen3_moe_top3_norm", "qwen3_moe_dense"])
def test_merge_loads_in_transformers(store, tmp_path, shape):
    """ft-merge of a PEFT attention adapter: the merged checkpoint loads in transformers 5
    with the PEFT model's logits, and its weights equal merge_and_unload's."""
    from peft import PeftModel

    model_dir = store(shape)
    adapter = ftref.build_adapter(model_dir, tmp_path / "adapter",
                                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                  seed=5)
    out = tmp_path / "merged"
    ftref.run_tool([ftref.tool_exe("FT_MERGE", "ft-merge"), "--model", model_dir, "--adapter",
                    adapter, "--out", out])
    pm = PeftModel.from_pretrained(ftref.load_hf(model_dir), str(adapter))
    pm.eval()
    ids, _ = ftref.make_batch(96, 2, 12, 1)
    ref_logits = ftref.hf_forward(pm, ids)[0]
    merged = pm.merge_and_unload()
    ref_state = ckpt_grads({k: v.detach() for k, v in merged.state_dict().items()},
                           merged.config)
    if merged.config.tie_word_embeddings:
        ref_state.pop("lm_head.weight", None)
    ours = load_file(str(out / "model.safetensors"))
    assert set(ours) == set(ref_state), sorted(set(ours) ^ set(ref_state))
    for k, v in ref_state.items():
        ftref.assert_close(f"merged {k}", ours[k], v, ftref.TOL_WEIGHT)
    ftref.assert_close("merged logits", ftref.hf_forward(ftref.load_hf(out), ids)[0],
                       ref_logits, ftref.TOL_LOGITS)


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
    (d / "train.jsonl").write_text(_uneven_rows(random.Random(3)))
    moe_padding.write_rows(d / "eval.jsonl", _EVAL_ROWS)
    return d


def _dist_run(d, name, np_, mode, **over):
    import rankrun

    keys = {"train.max_steps": 4, "train.warmup_steps": 1, "train.learning_rate": 1e-2,
            "data.eval_path": d / "eval.jsonl", "train.eval_strategy": "steps",
            "train.eval_steps": 2}
    keys.update({k.replace("__", "."): v for k, v in over.items()})
    cfg = rankrun.write_config(d, name, keys, mode=mode)
    rankrun.run(cfg, np_)
    return d / "runs" / name


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
    lora = {"tuning__lora__target_modules": "q_proj,v_proj"} if mode == "lora" else {}
    if mode == "moe-lora":
        lora = {"tuning__lora__target_modules": "all-linear", "tuning__lora__dropout": 0}
    tmode = "lora" if mode == "moe-lora" else mode
    single = dist_work / "runs" / f"single_{mode}"
    if not single.exists():
        _dist_run(dist_work, f"single_{mode}", 1, tmode, train__batch_size=8, **lora)
    batch = 8 if strategy == "model_parallel" else 4
    run = _dist_run(dist_work, f"np2_{mode}_{strategy}", 2, tmode, train__batch_size=batch,
                    dist__strategy=strategy, **lora)
    _same_run(single, run)
    # the evaluations (steps 2 and 4, every rank over the whole eval set in batches of the
    # rank's batch size) are the HF Trainer's, its MoE load-balancing term included
    moe_padding.check_run_eval(run, dist_work / "model", tmode, _EVAL_ROWS, batch, 4,
                               dist_work / "hf_eval")
    if strategy == "model_parallel":  # (the one process's batches: its evaluations too)
        for tag in ("eval/loss", "eval/aux_loss"):
            a, b = (moe_padding.tb_scalars(r, tag) for r in (single, run))
            assert a.keys() == b.keys() == {2, 4}, (a, b)
            for s in a:
                ftref.assert_close(f"{tag} {s}", b[s], a[s], ftref.TOL_LOGITS)
