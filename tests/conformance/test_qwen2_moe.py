"""Qwen2-MoE (issue 22) against transformers 5, on tiny random models from Qwen2MoeConfig:
qwen2's attention (q/k/v bias switched by qkv_bias) with the sparse MoE block of
modeling_qwen2_moe.py: the router softmax, top-k (renormalised only with
norm_topk_prob), the experts of width moe_intermediate_size, plus the shared expert (a
SwiGLU MLP of shared_expert_intermediate_size, mlp.shared_expert.{gate,up,down}_proj)
times sigmoid(mlp.shared_expert_gate(x)), added to the routed experts' output; the dense
layers of mlp_only_layers and decoder_sparse_step (a plain MLP of intermediate_size,
mlp.{gate,up,down}_proj); and the router load-balancing loss (output_router_logits,
router_aux_loss_coef) over the sparse layers.

The checkpoint names and the fused 3-D experts of transformers 5 are as for qwen3_moe
(test_qwen3_moe.py's ckpt_grads and v5_state). PEFT 0.21 converts MLP names to the
experts' target_parameters only for the model types transformers maps onto the qwen2_moe
pattern (qwen3_moe among them), not for qwen2_moe itself: here gate_proj, up_proj and
down_proj are the shared expert's and the dense layers' linear layers, "gate" (the
router) fails inside PEFT, and shared_expert_gate is a plain linear layer (all-linear
reaches it). ftkit does the same and refuses router and expert targets with the reason."""

import json

import pytest
import torch

import ftref
from test_moe import _train
from test_qwen3_moe import ckpt_grads

B = 2

# The aux coefficient is far above the default 0.001 so that a wrong load-balancing term
# is far outside the tolerances; the three MLP widths differ.
_BASE = dict(ftref._BASE, intermediate_size=40, moe_intermediate_size=24,
             shared_expert_intermediate_size=20, num_experts=4, num_experts_per_tok=2,
             norm_topk_prob=False, output_router_logits=True, router_aux_loss_coef=0.3)

SHAPES = {
    s.name: s
    for s in [
        ftref.Shape("qwen2_moe", "qwen2_moe", dict(_BASE, num_hidden_layers=3,
                                                   mlp_only_layers=[1]), seed=500,
                    note="top-2 of 4 not renormalised, layer 1 dense (mlp_only_layers)"),
        ftref.Shape("qwen2_moe_top3_norm", "qwen2_moe",
                    dict(_BASE, num_hidden_layers=4, decoder_sparse_step=2, num_experts=6,
                         num_experts_per_tok=3, norm_topk_prob=True, qkv_bias=False,
                         num_key_value_heads=1, tie_word_embeddings=True), T=14, seed=510,
                    note="top-3 of 6 renormalised, layers 0 and 2 dense (decoder_sparse_step "
                         "2), no q/k/v bias, MQA, tied"),
        ftref.Shape("qwen2_moe_top1_noaux", "qwen2_moe",
                    dict(_BASE, num_experts=3, num_experts_per_tok=1,
                         output_router_logits=False), seed=520,
                    note="top-1 not renormalised, every layer sparse, no aux"),
    ]
}


def dense_layers(cfg):
    """The layers Qwen2MoeDecoderLayer gives a plain MLP."""
    return [l for l in range(cfg.num_hidden_layers)
            if l in cfg.mlp_only_layers or (l + 1) % cfg.decoder_sparse_step != 0]


class Case:
    pass


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen2_moe")
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
    assert cfg["model_type"] == "qwen2_moe"
    assert cfg["num_experts"] == case.shape.cfg["num_experts"]
    assert "num_local_experts" not in cfg
    assert cfg["norm_topk_prob"] == case.shape.cfg["norm_topk_prob"]
    widths = {cfg["moe_intermediate_size"], cfg["intermediate_size"],
              cfg["shared_expert_intermediate_size"]}
    assert len(widths) == 3
    dense = dense_layers(case.cfg)
    assert len(dense) < case.cfg.num_hidden_layers
    if case.shape.name != "qwen2_moe_top1_noaux":
        assert dense
    for l in range(case.cfg.num_hidden_layers):
        assert (f"model.layers.{l}.mlp.gate_proj.weight" in case.ref_grads) == (l in dense)
        assert (f"model.layers.{l}.mlp.shared_expert_gate.weight" in case.ref_grads) == \
            (l not in dense)
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
    """Every parameter's gradient: attention (biases), norms, router, each expert, the
    shared expert and its gate, the dense layers' MLPs."""
    assert any(k.endswith(".mlp.shared_expert.down_proj.weight") for k in case.ref_grads)
    assert {k for k in case.full_out if k.startswith("grad.")} == \
        {f"grad.{k}" for k in case.ref_grads}
    ftref.assert_tensor_dict_close("grad.", case.full_out, case.ref_grads, ftref.TOL_GRAD)


def test_grad_ckpt_equal(case, ft):
    out = ft(dict(case.spec, mode="full", grad_ckpt=True), f"{case.shape.name}-full-ckpt")
    for k, v in case.full_out.items():
        if k.startswith("grad.") or k in ("loss", "logits"):
            assert torch.equal(out[k], v), k


# --- LoRA: PEFT keeps every MLP name on qwen2_moe's linear layers ----------------------

LORA_TARGETS = {
    # q, k, v, o, the shared expert's and the dense layers' gate/up/down, shared_expert_gate
    "all-linear": "all-linear",
    "gate-down": ["v_proj", "shared_expert_gate", "down_proj"],
}


@pytest.fixture(scope="module", params=[(s, t) for s in ("qwen2_moe", "qwen2_moe_top3_norm")
                                        for t in LORA_TARGETS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def lora_case(request, store, ft):
    name, variant = request.param
    shape = SHAPES[name]
    model_dir = store(name)
    adapter = ftref.build_adapter(model_dir, store.root / f"adapter-{name}-{variant}",
                                  target_modules=LORA_TARGETS[variant], seed=7)
    model = ftref.lora_mode_model(model_dir, adapter)
    ids, labels = ftref.make_batch(model.config.vocab_size, B, shape.T, shape.seed + 1)
    logits, loss, grads = ftref.hf_grads(model, ids, labels, key=ftref.peft_key)
    out = ft(dict(model_dir=model_dir, adapter_dir=adapter, mode="lora", input_ids=ids,
                  labels=labels), f"{name}-lora-{variant}")
    return dict(logits=logits, loss=loss, grads=grads, out=out, variant=variant,
                adapter=adapter, cfg=model.config)


def test_lora_targets_as_peft_puts_them(lora_case):
    """The guard: PEFT's pairs sit on the shared expert (and the dense layers' MLP for
    down_proj), on shared_expert_gate, never on the router or the experts."""
    g = lora_case["grads"]
    cfg = json.loads((lora_case["adapter"] / "adapter_config.json").read_text())
    assert not cfg.get("target_parameters")
    assert any(".mlp.shared_expert_gate.lora_B" in k for k in g)
    assert any(".mlp.shared_expert.down_proj.lora_A" in k for k in g)
    dense = dense_layers(lora_case["cfg"])
    assert any(f"layers.{l}.mlp.down_proj.lora_A" in k for k in g for l in dense)
    assert not any(".experts." in k or ".mlp.gate.lora" in k for k in g)


def test_lora_logits_loss_grads(lora_case):
    c = lora_case
    assert {k for k in c["out"] if k.startswith("grad.")} == {f"grad.{k}" for k in c["grads"]}
    ftref.assert_close("lora logits", c["out"]["logits"], c["logits"], ftref.TOL_LOGITS)
    ftref.assert_close("lora loss", c["out"]["loss"], c["loss"], ftref.TOL_LOGITS)
    ftref.assert_tensor_dict_close("grad.", c["out"], c["grads"], ftref.TOL_GRAD)


def test_lora_router_and_experts_refused(store, ft_raw):
    """'gate' (PEFT: the router is not a linear layer), w1/w2/w3 and target_parameters
    (the experts) are refused on qwen2_moe with the reason."""
    import subprocess

    model_dir = store("qwen2_moe_top1_noaux")
    for targets, want in (("q_proj,gate", "'gate'"), ("w1,w3", "w1/w2/w3")):
        r = subprocess.run([ftref.tool_exe("FT_LORA_INIT", "ft-lora-init"), "--model",
                            str(model_dir), "--out", str(store.root / "refused"), "--target",
                            targets], capture_output=True, text=True)
        assert r.returncode != 0 and want in r.stderr and "qwen2_moe" in r.stderr, r.stderr
    # an adapter naming the experts' parameters (PEFT's target_parameters)
    adapter = ftref.build_adapter(model_dir, store.root / "adapter-tp", target_modules=["q_proj"])
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["target_parameters"] = ["mlp.experts.down_proj"]
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    r = subprocess.run([ftref.tool_exe("FT_MERGE", "ft-merge"), "--model", str(model_dir),
                        "--adapter", str(adapter), "--out", str(store.root / "merged-tp")],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "target_parameters" in r.stderr and "qwen2_moe" in r.stderr, \
        r.stderr


# --- QLoRA ---------------------------------------------------------------------------

QLORA_CASES = [dict(type="nf4", blocksize=64, double_quant=True), dict(type="int8"),
               dict(type="nf4", blocksize=64, double_quant=True, ckpt=True)]


@pytest.fixture(scope="module", params=QLORA_CASES,
                ids=[q["type"] + ("-ckpt" if q.get("ckpt") else "") for q in QLORA_CASES])
def qlora_case(request, store, ft):
    """QLoRA: attention, the shared expert and its gate (one row, a linear layer as
    bitsandbytes sees it), the dense layer's MLP and (on load) every expert quantized; the
    router stays dense. LoRA on
    all-linear; the reference is transformers + PEFT on a model holding exactly our
    dequantized weights."""
    from safetensors.torch import load_file

    from test_qwen3_moe import v5_state

    q = request.param
    shape = SHAPES["qwen2_moe"]
    model_dir = store(shape.name)
    adapter = ftref.build_adapter(model_dir, store.root / "adapter-qlora",
                                  target_modules="all-linear", seed=9)
    m = ftref.load_hf(model_dir)
    ids, labels = ftref.make_batch(m.config.vocab_size, B, shape.T, shape.seed + 4)
    spec = dict(adapter_dir=adapter, mode="lora", input_ids=ids, labels=labels)
    tag = f"qwen2-moe-qlora-{q['type']}{'-ckpt' if q.get('ckpt') else ''}"
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
                cfg=m.config)


def test_qlora_quantizes_the_linear_layers(qlora_case):
    from test_qlora import _bound

    c = qlora_case
    cfg, dense = c["cfg"], dense_layers(c["cfg"])
    want = set()
    for l in range(cfg.num_hidden_layers):
        want |= {f"model.layers.{l}.self_attn.{p}.weight"
                 for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
        mlp = "mlp" if l in dense else "mlp.shared_expert"
        want |= {f"model.layers.{l}.{mlp}.{p}.weight" for p in ("gate_proj", "up_proj",
                                                                 "down_proj")}
        if l not in dense:
            want.add(f"model.layers.{l}.mlp.shared_expert_gate.weight")
        if l not in dense and not c["q"].get("ckpt"):
            want |= {f"model.layers.{l}.mlp.experts.{e}.{p}.weight"
                     for e in range(cfg.num_experts) for p in ("gate_proj", "up_proj",
                                                                "down_proj")}
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
    dict(id="full", shape="qwen2_moe", targets=None, train=_train(1e-3)),
    dict(id="full-top3-norm", shape="qwen2_moe_top3_norm", targets=None, train=_train(1e-3)),
    # (k_proj left out, as in test_train.py)
    dict(id="lora", shape="qwen2_moe", targets=["q_proj", "v_proj", "o_proj", "gate_proj",
                                                "up_proj", "down_proj", "shared_expert_gate"],
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
    out = ft(spec, f"qwen2-moe-train-{run['id']}")
    return dict(ref=ref, out=out, run=run)


def test_train_losses_and_weights(train_case):
    ref, out = train_case["ref"], train_case["out"]
    ftref.assert_close(f"losses (ref {[round(x, 6) for x in ref['losses'].tolist()]})",
                       out["losses"], ref["losses"], ftref.TOL_LOSSES)
    ftref.assert_tensor_dict_close("weight.", out, ref["weights"], ftref.TOL_WEIGHT)


def test_lora_init_adapter_loads_in_peft(store, tmp_path):
    """ft-lora-init all-linear: the adapter PEFT makes of all-linear on this model (the
    same pairs, on the shared expert, its gate and the dense layer too), B = 0."""
    from peft import PeftModel
    from safetensors.torch import load_file

    model_dir = store("qwen2_moe")
    out = tmp_path / "adapter"
    ftref.run_tool([ftref.tool_exe("FT_LORA_INIT", "ft-lora-init"), "--model", model_dir,
                    "--out", out, "--r", 4, "--target", "all-linear", "--seed", 3])
    pm = PeftModel.from_pretrained(ftref.load_hf(model_dir), str(out))
    tensors = load_file(str(out / "adapter_model.safetensors"))
    mem = {ftref.peft_key(n): p for n, p in pm.named_parameters() if ".lora_" in n}
    ref = ftref.build_adapter(model_dir, tmp_path / "peft", target_modules="all-linear")
    assert set(mem) == set(tensors) == set(load_file(str(ref / "adapter_model.safetensors")))
    for k, t in tensors.items():
        assert torch.equal(mem[k].detach(), t), k
    ids, _ = ftref.make_batch(96, 2, 12, 0)
    assert torch.equal(ftref.hf_forward(pm, ids)[0],
                       ftref.hf_forward(ftref.load_hf(model_dir), ids)[0])


@pytest.mark.parametrize("shape", ["qwen2_moe", "qwen2_moe_top3_norm"])
def test_merge_loads_in_transformers(store, tmp_path, shape):
    """ft-merge of a PEFT all-linear adapter (attention, shared expert, its gate, the dense
    layers' MLPs): the merged checkpoint loads in transformers 5 with the PEFT model's
    logits, and its weights equal merge_and_unload's."""
    from peft import PeftModel
    from safetensors.torch import load_file

    model_dir = store(shape)
    adapter = ftref.build_adapter(model_dir, tmp_path / "adapter", target_modules="all-linear",
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


def test_quantized_checkpoint_loads_in_transformers(store):
    """ft-quantize's checkpoint quantizes exactly the linear layers transformers 5 +
    bitsandbytes makes Linear4bit (the shared expert and its one-row gate too; the fused
    experts and the router stay dense), and that model runs on it. (The values are
    test_quantize_tool.py's; bitsandbytes' CPU layout keeps them from a comparison here.)"""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model_dir = store("qwen2_moe")
    qdir = store.root / "quantized-nf4"
    if not qdir.exists():
        ftref.run_tool([ftref.tool_exe("FT_QUANTIZE", "ft-quantize"), "--model", model_dir,
                        "--out", qdir, "--type", "nf4"])
    ours = {k[: -len(".weight.absmax")] for k in load_file(str(qdir / "model.safetensors"))
            if k.endswith(".weight.absmax")}
    qm = AutoModelForCausalLM.from_pretrained(qdir)
    theirs = {n for n, mod in qm.named_modules() if type(mod).__name__ == "Linear4bit"}
    assert "model.layers.0.mlp.shared_expert_gate" in theirs
    assert ours == theirs, sorted(ours ^ theirs)
    ids, _ = ftref.make_batch(qm.config.vocab_size, 1, 8, 3)
    # (with grad enabled: bitsandbytes' CPU inference kernel refuses a one-row weight)
    assert torch.isfinite(qm(input_ids=ids).logits).all()


# --- every dist.strategy on 2 ranks equals one process ----------------------------------


@pytest.fixture(scope="module")
def dist_work(tmp_path_factory):
    """A tiny Qwen2-MoE with a dense layer among three (model_parallel splits sparse and
    dense layers by parameter count), the load-balancing loss on (coefficient 0.1) and
    token data of equal lengths (test_moe.py's dist_work says why)."""
    import random

    import rankrun
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    assert rankrun.FT_TRAIN, "FT_TRAIN must be the path of bin/ft-train"
    d = tmp_path_factory.mktemp("qwen2_moe_dist")
    torch.manual_seed(1)
    cfg = Qwen2MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=40,
                         moe_intermediate_size=24, shared_expert_intermediate_size=20,
                         num_hidden_layers=3, mlp_only_layers=[1], num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, num_experts=4,
                         num_experts_per_tok=2, output_router_logits=True,
                         router_aux_loss_coef=0.1)
    Qwen2MoeForCausalLM(cfg).save_pretrained(d / "model", safe_serialization=True)
    rnd = random.Random(3)
    rows = []
    for _ in range(48):
        ids = [rnd.randint(1, 63) for _ in range(12)]
        rows.append({"input_ids": ids, "labels": [-100] * 4 + ids[4:]})
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def _dist_run(d, name, np_, mode, **over):
    import rankrun

    keys = {"train.max_steps": 4, "train.warmup_steps": 1, "train.learning_rate": 1e-2}
    keys.update({k.replace("__", "."): v for k, v in over.items()})
    cfg = rankrun.write_config(d, name, keys, mode=mode)
    rankrun.run(cfg, np_)
    return d / "runs" / name


_STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "model_parallel")
# lora: all-linear (attention, the shared expert and its gate, the dense layer's MLP)
DIST_CASES = [(m, s) for m in ("full", "lora") for s in _STRATEGIES]


@pytest.mark.parametrize("mode,strategy", DIST_CASES, ids=[f"{m}-{s}" for m, s in DIST_CASES])
def test_dist_strategy_equals_one_process(dist_work, mode, strategy):
    """Losses, gradient norms and final weights of 2 ranks = one process."""
    from test_moe import _same_run

    lora = {"tuning__lora__target_modules": "all-linear"} if mode == "lora" else {}
    single = dist_work / "runs" / f"single_{mode}"
    if not single.exists():
        _dist_run(dist_work, f"single_{mode}", 1, mode, train__batch_size=8, **lora)
    batch = 8 if strategy == "model_parallel" else 4
    run = _dist_run(dist_work, f"np2_{mode}_{strategy}", 2, mode, train__batch_size=batch,
                    dist__strategy=strategy, **lora)
    _same_run(single, run)


# --- the memory plan on real ft-train processes, and the auto batch size ---------------


@pytest.mark.parametrize("mode,strategy,np_", [("full", "none", 1), ("lora", "none", 1),
                                               ("full", "zero3", 2), ("lora", "model_parallel", 2)])
def test_memory_check_exact(dist_work, mode, strategy, np_):
    """ft-train --measure: planned == measured on every rank and category (the shared
    expert, its gate, the dense layer; sharded and split by parameter count)."""
    import rankrun
    from test_memcheck import assert_exact

    over = {"tuning__lora__target_modules": "all-linear"} if mode == "lora" else {}
    if strategy != "none":
        over["dist__strategy"] = strategy
    cfg = rankrun.write_config(dist_work, f"mem_{mode}_{strategy}", {"train.max_steps": 2},
                               mode=mode, **over)
    assert_exact(rankrun.run(cfg, np_, "--measure").stdout, np_)


def test_auto_batch(dist_work):
    """train.batch_size auto: the largest micro-batch whose planned peak fits the budget
    (the plan of 3 picks 3, one byte less 2)."""
    import rankrun
    from test_memcheck import assert_exact

    keys = {"train.max_steps": 1}
    cfg = rankrun.write_config(dist_work, "ab_p3", keys, mode="full", train__batch_size=3)
    ranks = assert_exact(rankrun.run(cfg, 1, "--measure").stdout, 1)
    need3 = ranks[0]["planned"]["total"] + ranks[0]["planned"]["host"]
    for budget, want in [(need3, 3), (need3 - 1, 2)]:
        cfg = rankrun.write_config(dist_work, f"ab_{want}", keys, mode="full",
                                   train__batch_size="auto", train__memory_budget=budget)
        out = rankrun.run(cfg, 1)
        assert f"batch_size auto = {want}" in out.stderr, out.stderr[-2000:]
