"""Checks on the reference side only (no harness): that each model shape really exercises
what it is meant to, and that the comparisons are well conditioned. If one of these fails,
the other tests would not mean what they claim."""

import json

import torch
from safetensors import safe_open

import ftref
from conftest import LORA_VARIANTS


def _logits(model_dir, shape, **config_override):
    m = ftref.load_hf(model_dir)
    for k, v in config_override.items():
        setattr(m.config, k, v)
    ids, _ = ftref.make_batch(m.config.vocab_size, 2, shape.T, shape.seed)
    return ftref.hf_forward(m, ids)[0]


def test_mistral_sliding_window_is_honoured_by_hf_eager(store):
    """transformers 4.46 eager attention applies Mistral's sliding window (key j visible
    from query i iff i - window < j <= i): logits differ from sliding_window=None after
    the first `window` positions and are identical before."""
    shape = ftref.SHAPES["mistral_sw"]
    d = store.model(shape.name)
    cfg = json.loads((d / "config.json").read_text())
    w = cfg["sliding_window"]
    assert w == 4 and w < shape.T
    with_w = _logits(d, shape)
    without = _logits(d, shape, sliding_window=None)
    assert torch.equal(with_w[:, :w], without[:, :w])
    assert ftref.rel_err(with_w[:, w:], without[:, w:]) > 1e-2


def _without_rope_scaling(cfg):
    """Drops the scaling under both names (rope_scaling, transformers 5's rope_parameters,
    which also carries rope_theta)."""
    cfg["rope_scaling"] = None
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}


def test_llama3_rope_scaling_changes_logits(store, tmp_path):
    shape = ftref.SHAPES["llama3_rope"]
    d = store.model(shape.name)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["rope_parameters"]["rope_type"] == "llama3"  # transformers 5's name
    plain = ftref.copy_model_dir(d, tmp_path / "noscale")
    _without_rope_scaling(cfg)
    (plain / "config.json").write_text(json.dumps(cfg))
    e = ftref.rel_err(_logits(d, shape), _logits(plain, shape))
    assert e > 1e-3, f"llama3 rope scaling changes logits by only {e:.2e}"


def test_linear_rope_scaling_changes_logits(store, tmp_path):
    shape = ftref.SHAPES["rope_linear"]
    d = store.model(shape.name)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["rope_scaling"] == {"type": "linear", "factor": 2.0}
    plain = ftref.copy_model_dir(d, tmp_path / "noscale")
    _without_rope_scaling(cfg)
    (plain / "config.json").write_text(json.dumps(cfg))
    e = ftref.rel_err(_logits(d, shape), _logits(plain, shape))
    assert e > 1e-3, f"linear rope scaling changes logits by only {e:.2e}"


def test_qwen2_disabled_window_is_ignored_by_hf(store):
    """config.json carries sliding_window 4 < T with use_sliding_window false: HF ignores
    the window, so ours must too."""
    d = store.model("qwen2")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["sliding_window"] == 4 and cfg["use_sliding_window"] is False
    assert ftref.load_hf(d).config.sliding_window is None


def test_checkpoint_layouts(store):
    tied = store.model("tied")
    with safe_open(str(tied / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()
    sh = store.model("sharded")
    idx = json.loads((sh / "model.safetensors.index.json").read_text())
    shards = sorted(set(idx["weight_map"].values()))
    assert len(shards) >= 2 and not (sh / "model.safetensors").exists(), shards
    for name, dt in [("bf16_ckpt", torch.bfloat16), ("fp16_ckpt", torch.float16)]:
        with safe_open(str(store.model(name) / "model.safetensors"), "pt") as f:
            dts = {f.get_tensor(k).dtype for k in f.keys()}
        assert dts == {dt}, (name, dts)
    hd = ftref.load_hf(store.model("head_dim16"))
    assert tuple(hd.model.layers[0].self_attn.q_proj.weight.shape) == (64, 32)
    mqa = ftref.load_hf(store.model("llama_mqa_odd"))
    assert tuple(mqa.model.layers[0].self_attn.k_proj.weight.shape) == (8, 24)
    bias = ftref.load_hf(store.model("llama_bias"))
    assert bias.model.layers[0].mlp.down_proj.bias is not None
    assert bias.model.layers[0].self_attn.o_proj.bias is not None
    q = ftref.load_hf(store.model("qwen2"))
    assert q.model.layers[0].self_attn.q_proj.bias is not None
    assert q.model.layers[0].self_attn.o_proj.bias is None


def test_peft_variants_build(store):
    """peft 0.13.2 (on this torch) builds and reloads every adapter variant; rsLoRA uses
    alpha/sqrt(r); all-linear covers the seven projections and not lm_head."""
    for v in LORA_VARIANTS:
        ad = store.adapter("llama_gqa", v)
        m = ftref.lora_mode_model(store.model("llama_gqa"), ad)
        names = [n for n, _ in ftref.trainable(m)]
        assert names, v
        ids, _ = ftref.make_batch(m.config.vocab_size, 2, 12, 0)
        base_logits = ftref.hf_forward(ftref.load_hf(store.model("llama_gqa")), ids)[0]
        assert ftref.rel_err(ftref.hf_forward(m, ids)[0], base_logits) > 1e-3, v
        if v in ("all-linear", "all-linear-literal"):
            mods = {n.split(".")[-4] for n in names if ".lora_A." in n}
            assert mods == set(ftref.SEVEN), mods
        if v == "rslora":
            layer = m.base_model.model.model.layers[0].self_attn.q_proj
            assert abs(layer.scaling["default"] - 8 / 2.0) < 1e-12
    cfg = json.loads((store.adapter("llama_gqa", "all-linear-literal")
                      / "adapter_config.json").read_text())
    assert cfg["target_modules"] == "all-linear"


def test_training_reference_is_well_conditioned(store):
    """float32 vs float64 runs of the reference optimizer loop agree far below the 1e-5
    tolerance (so a failure there is not noise), and the clipping threshold used by
    test_train really clips."""
    from test_train import RUNS, make_train_inputs

    for run in RUNS:
        model_dir, adapter_dir, ids, labels, train = make_train_inputs(store, run)
        res = {}
        for dt in (torch.float32, torch.float64):
            m = (ftref.full_mode_model(model_dir) if adapter_dir is None
                 else ftref.lora_mode_model(model_dir, adapter_dir))
            res[dt] = ftref.reference_train(m, ids, labels, train, key=ftref.peft_key, dtype=dt)
        a, b = res[torch.float32], res[torch.float64]
        worst = max((ftref.rel_err(a["weights"][n], b["weights"][n]), n) for n in a["weights"])
        print(f"{run['id']}: float32 vs float64 worst weight {worst[0]:.2e} ({worst[1]}), "
              f"norms {[round(x, 3) for x in a['norms']]}")
        assert worst[0] < 5e-7, (run["id"], worst)
        assert ftref.rel_err(a["losses"], b["losses"]) < 5e-7
        if train["max_grad_norm"] > 0:
            assert max(a["norms"]) > train["max_grad_norm"], (run["id"], a["norms"])


def test_packing_reference_is_not_trivial(store):
    """Without the packing semantics (plain causal attention over the whole row) the
    logits differ from the samples-alone reference: the packed test can fail."""
    from test_packing import _pack, _reference, _samples

    shape = ftref.SHAPES["llama_gqa"]
    samples = _samples(ftref.make_config(shape).vocab_size, shape.seed)
    ids, pos, labels = _pack(samples)
    assert pos[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3]
    assert labels[0, 5].item() == -100 and labels[0, 6].item() == ids[0, 6].item()
    m = ftref.full_mode_model(store.model("llama_gqa"))
    ref_logits, _, _ = _reference(m, samples)
    plain, _ = ftref.hf_forward(m, ids)
    assert ftref.rel_err(plain[:, 5:], ref_logits[:, 5:]) > 1e-3
    assert ftref.rel_err(plain[:, :5], ref_logits[:, :5]) < 1e-5


def _float64_peft(model_dir, adapter_dir):
    from peft import PeftModel

    m = PeftModel.from_pretrained(ftref.load_hf(model_dir).double(), str(adapter_dir),
                                  is_trainable=True, autocast_adapter_dtype=False)
    m.eval()
    return m


def test_adapter_kinds_training_references_are_well_conditioned(store):
    """The same for the training runs of DoRA, modules_to_save and LoRA on the embedding
    and the head (test_dora.py, test_modules_to_save.py, test_lora_outer.py): float32 vs
    float64 agree to 5e-7, and their clipping threshold clips."""
    import adapter_ref
    import test_dora
    import test_lora_outer
    import test_modules_to_save

    clipped = []
    for mod in (test_dora, test_modules_to_save, test_lora_outer):
        for model_name, variant, seed in mod.TRAIN_RUNS:
            shape = ftref.SHAPES[model_name]
            model_dir = store.model(model_name)
            adapter_dir = store.adapter(model_name, variant, seed=seed)
            ids, labels = ftref.make_batch(shape.cfg["vocab_size"], adapter_ref.B, shape.T,
                                           shape.seed + 2)
            train = mod._train(model_name, variant)
            a, b = (ftref.reference_train(ftref.lora_mode_model(model_dir, adapter_dir), ids,
                                          labels, train, key=ftref.ours_key, dtype=dt)
                    for dt in (torch.float32, torch.float64))
            if "outer_tie" in variant:
                # (ensure_weight_tying: lm_head's pair is views of the embedding's, which a
                # model's .to(float64) turns into copies of their own; PEFT builds the
                # tied pair in float64 from a float64 base instead)
                b = ftref.reference_train(_float64_peft(model_dir, adapter_dir), ids, labels,
                                          train, key=ftref.ours_key)
            worst = max((ftref.rel_err(a["weights"][n], b["weights"][n]), n)
                        for n in a["weights"])
            print(f"{model_name}-{variant}: float32 vs float64 worst weight {worst[0]:.2e} "
                  f"({worst[1]}), norms {[round(x, 3) for x in a['norms']]}")
            assert worst[0] < 5e-7, (model_name, variant, worst)
            assert ftref.rel_err(a["losses"], b["losses"]) < 5e-7
            clipped.append(max(a["norms"]) > train["max_grad_norm"])
    assert all(clipped), clipped
