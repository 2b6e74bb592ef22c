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
(moe_ref.py's qwen_ckpt_grads and qwen_v5_state). PEFT 0.21 converts MLP names to the
experts' target_parameters only for the model types transformers maps onto the qwen2_moe
pattern (qwen3_moe among them), not for qwen2_moe itself: here gate_proj, up_proj and
down_proj are the shared expert's and the dense layers' linear layers, "gate" (the
router) fails inside PEFT, and shared_expert_gate is a plain linear layer (all-linear
reaches it). ftkit does the same and refuses the router's and the experts' module names
(gate, w1/w2/w3) with the reason. An explicit LoraConfig(target_parameters=[...]) is taken
by PEFT here as on qwen3_moe (the router's weight, the fused gate_up_proj and down_proj),
without the rank / alpha patterns its name conversion adds: the gate_up pair has rank r;
those adapters are checked against PEFT (logits, loss, LoRA grads, ft-eval, five AdamW
steps, the saved adapter loaded by PEFT, ft-merge), and ft-train asks for them with
tuning.lora.target_parameters (from such an init_adapter; the memory plan exact)."""

import json

import pytest
import torch

import ftref
import moe_ref

ckpt_grads = moe_ref.qwen_ckpt_grads  # (the fused experts split, as for qwen3_moe)
_train = moe_ref.train_hparams

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


store = moe_ref.store_fixture(SHAPES, "qwen2_moe")


@pytest.fixture(scope="module", params=list(SHAPES))
def case(request, store, ft):
    return moe_ref.full_case(SHAPES[request.param], store(request.param), ft, ckpt_grads)


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
    moe_ref.check_aux_share(case)


def test_eval_logits_loss(case):
    moe_ref.check_logits_loss(case, "eval")


def test_full_logits_loss(case):
    moe_ref.check_logits_loss(case, "full")


def test_full_grads(case):
    """Every parameter's gradient: attention (biases), norms, router, each expert, the
    shared expert and its gate, the dense layers' MLPs."""
    assert any(k.endswith(".mlp.shared_expert.down_proj.weight") for k in case.ref_grads)
    assert {k for k in case.full_out if k.startswith("grad.")} == \
        {f"grad.{k}" for k in case.ref_grads}
    ftref.assert_tensor_dict_close("grad.", case.full_out, case.ref_grads, ftref.TOL_GRAD)


def test_grad_ckpt_equal(case, ft):
    moe_ref.check_grad_ckpt_equal(case, ft)


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
    c = moe_ref.lora_case(shape, model_dir, adapter, ft, shape.seed + 1, f"{name}-lora-{variant}")
    return dict(c, variant=variant, adapter=adapter)


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
    moe_ref.check_lora(lora_case, "lora", same_keys=True)


def test_lora_router_and_experts_names_refused(store, ft_raw):
    """'gate' (PEFT: the router is not a linear layer) and w1/w2/w3 (PEFT converts no MLP
    names here) are refused on qwen2_moe with the reason; PEFT itself fails on both."""
    import subprocess

    from peft import LoraConfig, get_peft_model

    model_dir = store("qwen2_moe_top1_noaux")
    for targets, want in (("q_proj,gate", "'gate'"), ("w1,w3", "w1/w2/w3")):
        r = subprocess.run([ftref.tool_exe("FT_LORA_INIT", "ft-lora-init"), "--model",
                            str(model_dir), "--out", str(store.root / "refused"), "--target",
                            targets], capture_output=True, text=True)
        assert r.returncode != 0 and want in r.stderr and "qwen2_moe" in r.stderr, r.stderr
        with pytest.raises(Exception):
            get_peft_model(ftref.load_hf(model_dir),
                           LoraConfig(r=4, target_modules=targets.split(",")))


# --- LoRA on the router and the experts by target_parameters, as PEFT takes them ------
# PEFT converts no names on qwen2_moe, but an explicit LoraConfig(target_parameters=[...])
# wraps the router's weight and the fused experts as on qwen3_moe, with no rank or alpha
# pattern: the gate_up pair has rank r (not 2 r) and alpha's scaling.

TP_VARIANTS = {
    "experts": dict(target_modules=["q_proj", "v_proj", "shared_expert_gate"],
                    target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),
    "router-experts-all-linear": dict(
        target_modules="all-linear",
        target_parameters=["mlp.gate.weight", "mlp.experts.gate_up_proj",
                           "mlp.experts.down_proj"]),
    "gate_up-rslora": dict(target_modules=["o_proj"],
                           target_parameters=["mlp.experts.gate_up_proj"], use_rslora=True),
}


@pytest.fixture(scope="module", params=[(s, v) for s in ("qwen2_moe", "qwen2_moe_top3_norm")
                                        for v in TP_VARIANTS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def tp_case(request, store, ft):
    """Logits, loss and LoRA grads against PEFT; the adapter saved after one AdamW step."""
    name, variant = request.param
    shape = SHAPES[name]
    model_dir = store(name)
    adapter = ftref.build_adapter(model_dir, store.root / f"adapter-tp-{name}-{variant}",
                                  seed=21, **TP_VARIANTS[variant])
    c = moe_ref.lora_case(shape, model_dir, adapter, ft, shape.seed + 8,
                          f"{name}-lora-tp-{variant}")
    saved = store.root / f"saved-tp-{name}-{variant}"
    trained = ft(dict(c["spec"], train=dict(_train(1e-2), steps=1, warmup_steps=0),
                      save_adapter=str(saved)), f"{name}-lora-tp-{variant}-save")
    return dict(c, name=name, variant=variant, model_dir=model_dir, adapter=adapter,
                saved=saved, trained=trained)


def test_lora_target_parameters(tp_case):
    c = tp_case
    cfg = json.loads((c["adapter"] / "adapter_config.json").read_text())
    want = TP_VARIANTS[c["variant"]]["target_parameters"]
    assert sorted(cfg["target_parameters"]) == sorted(want)
    assert not cfg["rank_pattern"] and not cfg["alpha_pattern"]
    g = c["grads"]
    nest = ".base_layer" if "mlp.experts.down_proj" in want else ""
    r = cfg["r"]
    for k, v in g.items():  # the gate_up pair: rank r per expert, not 2 r
        if f".mlp.experts{nest}.lora_A" in k:
            assert v.shape[0] == SHAPES[c["name"]].cfg["num_experts"] * r, (k, v.shape)
    assert any(f".mlp.experts{nest}.lora_B" in k for k in g)
    assert any(".mlp.gate.lora_A" in k for k in g) == ("mlp.gate.weight" in want)
    moe_ref.check_lora(c, "tp", same_keys=True)


def test_lora_target_parameters_saved_loads_in_peft(tp_case):
    """Our adapter after one step: PEFT's config keys, and PEFT loads it with no missing or
    unexpected keys, holding exactly our trained tensors."""
    from peft import PeftModel
    from safetensors.torch import load_file

    c = tp_case
    ours = load_file(str(c["saved"] / "adapter_model.safetensors"))
    theirs = load_file(str(c["adapter"] / "adapter_model.safetensors"))
    assert set(ours) == set(theirs)
    ours_cfg = json.loads((c["saved"] / "adapter_config.json").read_text())
    theirs_cfg = json.loads((c["adapter"] / "adapter_config.json").read_text())
    assert sorted(p.split(".")[-1] if p.endswith("_proj") else p.split("mlp.")[-1]
                  for p in theirs_cfg["target_parameters"]) == \
        sorted(ours_cfg["target_parameters"])
    for k in ("rank_pattern", "alpha_pattern", "use_rslora", "r", "lora_alpha"):
        assert ours_cfg[k] == theirs_cfg[k], k
    pm = PeftModel.from_pretrained(ftref.load_hf(c["model_dir"]), str(c["saved"]))
    mem = {ftref.peft_key(n): p for n, p in pm.named_parameters() if ".lora_" in n}
    assert set(mem) == set(ours), sorted(set(mem) ^ set(ours))
    for k, t in ours.items():
        assert torch.equal(mem[k].detach(), t), k
        assert torch.equal(t, c["trained"]["weight." + k]), k
        assert not torch.equal(t, theirs[k]), k  # the step moved it


def test_lora_target_parameters_merge(tp_case, tmp_path):
    """ft-merge folds the router's and the experts' pairs as merge_and_unload does; the
    output loads in transformers with the PEFT model's logits."""
    from safetensors.torch import load_file

    c = tp_case
    m = moe_ref.merge(c["model_dir"], c["adapter"], tmp_path / "merged", 2, ckpt_grads)
    base = load_file(str(c["model_dir"] / "model.safetensors"))
    l = min(set(range(m.cfg.num_hidden_layers)) - set(dense_layers(m.cfg)))
    k = f"model.layers.{l}.mlp.experts.0.gate_proj.weight"
    assert not torch.equal(m.ours[k], base[k]), k
    moe_ref.check_merged(m)


def test_lora_target_parameters_ft_eval(tp_case, tmp_path):
    """ft-eval --adapter on rows of uneven lengths in one batch: loss_with_aux is the PEFT
    model's loss (the router's LoRA moves the load-balancing term too), aux_loss its
    aux_loss."""
    import random

    from moe_padding import _hf_batch_loss

    c = tp_case
    pm = ftref.lora_mode_model(c["model_dir"], c["adapter"])
    rnd = random.Random(5)
    rows = []
    for T in (9, 5, 12):
        ids = [rnd.randrange(1, pm.config.vocab_size) for _ in range(T)]
        rows.append((ids, [-100] * 2 + ids[2:]))
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({"input_ids": i, "labels": lab}) + "\n"
                            for i, lab in rows))
    cp = ftref.run_tool([ftref.tool_exe("FT_EVAL", "ft-eval"), "--model", c["model_dir"],
                         "--adapter", c["adapter"], "--data", data, "--format", "tokens",
                         "--batch-size", 8, "--device", "cpu", "--json"])
    got = json.loads(cp.stdout)
    loss, aux = _hf_batch_loss(pm, rows)
    ftref.assert_close("ft-eval loss_with_aux", got["loss_with_aux"], loss, ftref.TOL_LOGITS)
    ftref.assert_close("ft-eval aux_loss", got["aux_loss"], aux, ftref.TOL_LOGITS)
    base, _ = _hf_batch_loss(ftref.load_hf(c["model_dir"]), rows)
    assert abs(base - loss) > 1e-4  # the adapter moves the loss


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
    q = request.param
    shape = SHAPES["qwen2_moe"]
    model_dir = store(shape.name)
    adapter = ftref.build_adapter(model_dir, store.root / "adapter-qlora",
                                  target_modules="all-linear", seed=9)
    kind = f"{q['type']}{'-ckpt' if q.get('ckpt') else ''}"
    return moe_ref.qlora_case(q, shape, model_dir, adapter, store, ft, moe_ref.qwen_v5_state,
                              "moe_intermediate_size", f"qwen2-moe-qlora-{kind}",
                              store.root / f"dequant-{kind}")


def test_qlora_quantizes_the_linear_layers(qlora_case):
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
    moe_ref.check_qlora_dequant(c, want)


def test_qlora_logits_loss_grads(qlora_case):
    moe_ref.check_lora(qlora_case, "qlora")


# --- training, adapters both ways, merge -----------------------------------------------

TRAIN_RUNS = [
    dict(id="full", shape="qwen2_moe", targets=None, train=_train(1e-3)),
    dict(id="full-top3-norm", shape="qwen2_moe_top3_norm", targets=None, train=_train(1e-3)),
    # (k_proj left out, as in test_train.py)
    dict(id="lora", shape="qwen2_moe", targets=["q_proj", "v_proj", "o_proj", "gate_proj",
                                                "up_proj", "down_proj", "shared_expert_gate"],
         train=_train(1e-2)),
    # the router and the experts by target_parameters (rank r on gate_up_proj)
    dict(id="lora-tp", shape="qwen2_moe", targets=["q_proj", "v_proj", "shared_expert_gate"],
         extra=dict(target_parameters=["mlp.gate.weight", "mlp.experts.gate_up_proj",
                                       "mlp.experts.down_proj"]),
         train=_train(1e-2)),
]


@pytest.fixture(scope="module", params=TRAIN_RUNS, ids=[r["id"] for r in TRAIN_RUNS])
def train_case(request, store, ft):
    """Five AdamW steps (warmup, cosine, clipping, weight decay) against torch's, the
    load-balancing loss in every step's loss and gradient."""
    return moe_ref.train_case(request.param, SHAPES, store, ft, ckpt_grads, "qwen2-moe-train")


def test_train_losses_and_weights(train_case):
    moe_ref.check_train(train_case)


def test_lora_init_adapter_loads_in_peft(store, tmp_path):
    """ft-lora-init all-linear: the adapter PEFT makes of all-linear on this model (the
    same pairs, on the shared expert, its gate and the dense layer too), B = 0."""
    from safetensors.torch import load_file

    model_dir = store("qwen2_moe")
    out = tmp_path / "adapter"
    ftref.run_tool([ftref.tool_exe("FT_LORA_INIT", "ft-lora-init"), "--model", model_dir,
                    "--out", out, "--r", 4, "--target", "all-linear", "--seed", 3])
    names = moe_ref.check_lora_init_loads(model_dir, out)
    ref = ftref.build_adapter(model_dir, tmp_path / "peft", target_modules="all-linear")
    assert names == set(load_file(str(ref / "adapter_model.safetensors")))


@pytest.mark.parametrize("shape", ["qwen2_moe", "qwen2_moe_top3_norm"])
def test_merge_loads_in_transformers(store, tmp_path, shape):
    """ft-merge of a PEFT all-linear adapter (attention, shared expert, its gate, the dense
    layers' MLPs): the merged checkpoint loads in transformers 5 with the PEFT model's
    logits, and its weights equal merge_and_unload's."""
    model_dir = store(shape)
    adapter = ftref.build_adapter(model_dir, tmp_path / "adapter", target_modules="all-linear",
                                  seed=5)
    moe_ref.check_merged(moe_ref.merge(model_dir, adapter, tmp_path / "merged", 1, ckpt_grads))


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


_STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "model_parallel")
# lora: all-linear (attention, the shared expert and its gate, the dense layer's MLP)
DIST_CASES = [(m, s) for m in ("full", "lora") for s in _STRATEGIES]


@pytest.mark.parametrize("mode,strategy", DIST_CASES, ids=[f"{m}-{s}" for m, s in DIST_CASES])
def test_dist_strategy_equals_one_process(dist_work, mode, strategy):
    """Losses, gradient norms and final weights of 2 ranks = one process."""
    lora = {"tuning__lora__target_modules": "all-linear"} if mode == "lora" else {}
    single = dist_work / "runs" / f"single_{mode}"
    if not single.exists():
        moe_ref.dist_run(dist_work, f"single_{mode}", 1, mode, evaluate=False,
                         train__batch_size=8, **lora)
    batch = 8 if strategy == "model_parallel" else 4
    run = moe_ref.dist_run(dist_work, f"np2_{mode}_{strategy}", 2, mode, evaluate=False,
                           train__batch_size=batch, dist__strategy=strategy, **lora)
    moe_ref.same_run(single, run)



_TP_RUN = {"tuning__lora__target_modules": "q_proj,shared_expert_gate",
           "tuning__lora__target_parameters": "mlp.gate.weight,mlp.experts.gate_up_proj,"
                                              "mlp.experts.down_proj"}


def test_ft_train_target_parameters_from_init_adapter(dist_work):
    """ft-train with tuning.lora.target_parameters, from a PEFT adapter made with the same
    explicit target_parameters (init_adapter): the run takes it (the gate_up pair of rank
    r), and its final adapter loads in PEFT with no missing or unexpected keys, holding
    exactly the trained tensors, none of them the initial ones."""
    from peft import PeftModel
    from safetensors.torch import load_file

    import rankrun

    init = ftref.build_adapter(dist_work / "model", dist_work / "tp-init",
                               target_modules=["q_proj", "shared_expert_gate"], seed=23,
                               target_parameters=["mlp.gate.weight", "mlp.experts.gate_up_proj",
                                                  "mlp.experts.down_proj"])
    cfg = rankrun.write_config(dist_work, "tp_train", {"train.max_steps": 2},
                               tuning__lora__init_adapter=str(init), **_TP_RUN)
    rankrun.run(cfg, 1)
    final = dist_work / "runs" / "tp_train" / "final"
    saved = json.loads((final / "adapter_config.json").read_text())
    assert sorted(saved["target_parameters"]) == ["down_proj", "gate.weight", "gate_up_proj"]
    assert not saved["rank_pattern"] and not saved["alpha_pattern"]
    ours = load_file(str(final / "adapter_model.safetensors"))
    given = load_file(str(init / "adapter_model.safetensors"))
    assert set(ours) == set(given)
    pm = PeftModel.from_pretrained(ftref.load_hf(dist_work / "model"), str(final))
    mem = {ftref.peft_key(n): p for n, p in pm.named_parameters() if ".lora_" in n}
    assert set(mem) == set(ours), sorted(set(mem) ^ set(ours))
    for k, t in ours.items():
        assert torch.equal(mem[k].detach(), t), k
        assert not torch.equal(t, given[k]), k


def test_ft_train_target_parameters_refusals(dist_work):
    """tuning.lora.target_parameters: an unknown parameter, dropout beside it, and an
    init_adapter whose gate_up pair has another rank are refused, naming the key."""
    import rankrun

    for name, over, needle in [
            ("tp_bad", dict(_TP_RUN, tuning__lora__target_parameters="gate.bias"),
             "tuning.lora.target_parameters"),
            ("tp_dropout", dict(_TP_RUN, tuning__lora__dropout=0.1), "dropout"),
            ("tp_no_params", dict(_TP_RUN, tuning__lora__target_parameters="",
                                  tuning__lora__init_adapter=str(dist_work / "tp-init")),
             "target_parameters")]:
        if "init_adapter" in str(over) and not (dist_work / "tp-init").exists():
            ftref.build_adapter(dist_work / "model", dist_work / "tp-init",
                                target_modules=["q_proj", "shared_expert_gate"], seed=23,
                                target_parameters=["mlp.gate.weight",
                                                   "mlp.experts.gate_up_proj",
                                                   "mlp.experts.down_proj"])
        cfg = rankrun.write_config(dist_work, name, {"train.max_steps": 1}, **over)
        out = rankrun.run(cfg, 1, check=False)
        assert out.returncode != 0 and needle in out.stderr, out.stderr[-2000:]


# --- the memory plan on real ft-train processes, and the auto batch size ---------------


@pytest.mark.parametrize("mode,strategy,np_", [("full", "none", 1), ("lora", "none", 1),
                                               ("full", "zero3", 2), ("lora", "model_parallel", 2),
                                               ("lora-tp", "none", 1)])
def test_memory_check_exact(dist_work, mode, strategy, np_):
    """ft-train --measure: planned == measured on every rank and category (the shared
    expert, its gate, the dense layer; sharded and split by parameter count; lora-tp: the
    router's and the experts' pairs of tuning.lora.target_parameters)."""
    import rankrun
    from test_memcheck import assert_exact

    over = {"tuning__lora__target_modules": "all-linear"} if mode == "lora" else {}
    name = f"mem_{mode}_{strategy}"
    if mode == "lora-tp":
        over, mode = dict(_TP_RUN), "lora"
    if strategy != "none":
        over["dist__strategy"] = strategy
    cfg = rankrun.write_config(dist_work, name, {"train.max_steps": 2}, mode=mode, **over)
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
