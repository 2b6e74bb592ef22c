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
(test_qwen3_moe.py's ckpt_grads and v5_state). PEFT on transformers 5 maps gate_proj,
up_proj, down_proj (and "gate") to the experts' target_parameters for this model type,
so the shared expert's and the dense layers' MLPs carry no LoRA from a list of names;
shared_expert_gate is a plain linear layer (all-linear reaches it)."""

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
    """'gate' (PEFT: the router is not a linear layer) and target_parameters (the experts)
    are refused on qwen2_moe with the reason."""
    import subprocess

    model_dir = store("qwen2_moe_top1_noaux")
    for targets, want in (("q_proj,gate", "'gate'"), ("w1,w3", "w1/w2/w3")):
        r = subprocess.run([ftref.tool_exe("FT_LORA_INIT", "ft-lora-init"), "--model",
                            str(model_dir), "--out", str(store.root / "refused"), "--target",
                            targets], capture_output=True, text=True)
        assert r.returncode != 0 and want in r.stderr and "qwen2_moe" in r.stderr, r.stderr
