"""LoRA on the token embedding and on lm_head, as PEFT makes it: the embedding's pair is
PEFT's Embedding layer (lora_embedding_A [r, vocab], lora_embedding_B [hidden, r],
h0 += s A^T[ids] B^T before the family's embedding scale, no dropout), lm_head's a linear
layer's (lora_A [r, hidden], lora_B [vocab, r], before granite's logits scaling and
gemma2's soft-cap). PEFT also saves the base weights of a targeted embedding / head
(<module>.base_layer.weight) and loads them into the base: we load them likewise, and
write them back when an adapter brought them (PEFT loads an adapter without them keeping
the base model's own, which are then the same).

Both directions, every family with an untied head (llama, mistral, qwen2, qwen3, granite,
olmo2, phi3):
  - PEFT's adapter -> ours: logits and loss (1e-5), every gradient (1e-4);
  - five AdamW steps (1e-5), then our saved adapter -> PeftModel.from_pretrained with no
    missing or unexpected keys, our values, our logits.
Tied embeddings (gemma, gemma2, smollm3, the tied llama / qwen3 / phi4 shapes): PEFT
without ensure_weight_tying (its default) wraps the embedding and lm_head apart, each with
its own pair over the one tied base weight, and saves that weight under both modules'
base_layer keys (loading keeps the head's, the module it fills last): the same both
directions. With ensure_weight_tying PEFT hands lm_head the embedding's pair transposed, as
two more parameters on the same storage (two AdamW states stepping one tensor; merged
twice): the same both directions. LoRA there beside modules_to_save: see
test_outer_tied_with_modules_to_save. DoRA on them (with ensure_weight_tying too):
test_dora.py. ft-merge: test_tools_peft.py."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

import ftref
from adapter_ref import B, adapter_case, assert_saved_loads_in_peft, five_steps, \
    held_adapter, load_peft_checked, train_and_save


UNTIED = ["llama_gqa", "llama_mqa_odd", "llama_bias", "mistral_sw", "qwen2", "qwen3",
          "granite", "olmo2"]
CASES = ([(m, "outer") for m in UNTIED] + [("phi3", "outer_phi"), ("llama_gqa", "outer_head"),
                                            ("llama_gqa", "outer_embed"),
                                            ("qwen2", "outer_regex")])
TIED = ["tied", "gemma", "gemma2", "smollm3", "qwen3_tied", "phi4_mini"]
CASES += ([(m, "outer") for m in TIED if m != "phi4_mini"] +
          [("phi4_mini", "outer_phi"), ("tied", "outer_head"), ("tied", "outer_embed"),
           ("gemma", "outer_regex")] +
          # ensure_weight_tying: the head's pair the embedding's
          [(m, "outer_tie") for m in ["tied", "gemma", "gemma2", "smollm3", "qwen3_tied"]] +
          [("phi4_mini", "outer_tie_phi"), ("tied", "outer_tie_head")])


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-{v}" for m, v in CASES])
def case(request, store, ft):
    model_name, variant = request.param
    c = adapter_case(store, ft, model_name, variant, f"outer-{model_name}-{variant}", pad=True)
    c.variant = variant
    return c


def test_outer_logits_loss(case):
    ftref.assert_close("logits", case.out["logits"], case.ref_logits, ftref.TOL_LOGITS)
    ftref.assert_close("loss", case.out["loss"], case.ref_loss, ftref.TOL_LOGITS)


def test_outer_grads(case):
    want = {"outer": ("lora_embedding_A", "lm_head.lora_B"), "outer_head": ("lm_head.lora_A",),
            "outer_embed": ("lora_embedding_B",), "outer_regex": ("lora_embedding_A",
                                                                  "lm_head.lora_A"),
            "outer_phi": ("lora_embedding_B", "lm_head.lora_A"),
            "outer_tie": ("lora_embedding_B", "lm_head.lora_A"),
            "outer_tie_phi": ("lora_embedding_A", "lm_head.lora_B"),
            "outer_tie_head": ("lora_embedding_A", "lm_head.lora_B")}[case.variant]
    for w in want:
        assert any(w in k for k in case.ref_grads), (w, sorted(case.ref_grads))
    ftref.assert_tensor_dict_close("grad.", case.out, case.ref_grads, ftref.TOL_GRAD)


# max_grad_norm below each run's gradient norms, so that clipping acts (test_reference.py
# checks it does, and that the runs are well-conditioned)
CLIP = {("granite", "outer_no_k"): 0.9}


def _train(model_name, variant):
    return five_steps(CLIP.get((model_name, variant), 1.0))


# (adapter seeds as test_train.py picks them: granite's seed 2 is ill-conditioned, float32
# vs float64 torch 6e-5 apart after five steps; seed 1 agrees to 1e-7)
TRAIN_RUNS = [("llama_gqa", "outer_no_k", 4), ("granite", "outer_no_k", 1),
              ("phi3", "outer_no_qkv", 1), ("tied", "outer_no_k", 1),
              ("gemma", "outer_no_k", 1), ("phi4_mini", "outer_no_qkv", 1),
              ("tied", "outer_tie_no_k", 1), ("gemma", "outer_tie_no_k", 1)]


@pytest.mark.parametrize("model_name,variant,seed", TRAIN_RUNS,
                         ids=[f"{m}-{v}" for m, v, _ in TRAIN_RUNS])
def test_outer_train_and_save_loads_in_peft(store, ft, tmp_path, model_name, variant, seed):
    r = train_and_save(store, ft, tmp_path, model_name, variant, seed,
                       _train(model_name, variant), f"outer-train-{model_name}")
    ftref.assert_tensor_dict_close("weight.", r.out, r.ref["weights"], ftref.TOL_WEIGHT)

    cfg = json.loads((r.saved / "adapter_config.json").read_text())
    assert {"embed_tokens", "lm_head"} <= set(cfg["target_modules"])
    tensors = load_file(str(r.saved / "adapter_model.safetensors"))
    # as PEFT saves them: the targeted embedding's and head's base weights beside the pairs
    base_sd = load_file(str(r.model_dir / "model.safetensors"))
    head = ("model.embed_tokens.weight" if ftref.SHAPES[model_name].cfg["tie_word_embeddings"]
            else "lm_head.weight")
    assert torch.equal(tensors["base_model.model.lm_head.base_layer.weight"],
                       base_sd[head].float())
    assert_saved_loads_in_peft(ft, r, f"outer-saved-{model_name}")


def test_outer_base_layer_is_loaded(store, ft, tmp_path):
    """An adapter's embed_tokens.base_layer.weight replaces the base's embedding, as PEFT's
    loading does."""
    import shutil

    from safetensors.torch import save_file

    model_dir = store.model("llama_gqa")
    src = store.adapter("llama_gqa", "outer")
    d = tmp_path / "adapter"
    shutil.copytree(src, d)
    t = load_file(str(d / "adapter_model.safetensors"))
    k = "base_model.model.model.embed_tokens.base_layer.weight"
    t[k] = t[k] + 0.3 * torch.randn(t[k].shape, generator=torch.Generator().manual_seed(3))
    save_file(t, str(d / "adapter_model.safetensors"), metadata={"format": "pt"})
    m = ftref.lora_mode_model(model_dir, d)
    ids, labels = ftref.make_batch(96, B, 12, 5)
    logits, loss, grads = ftref.hf_grads(m, ids, labels, key=ftref.ours_key)
    out = ft(dict(model_dir=model_dir, adapter_dir=d, mode="lora", input_ids=ids,
                  labels=labels), "outer-base-layer")
    ftref.assert_close("logits", out["logits"], logits, ftref.TOL_LOGITS)
    ftref.assert_tensor_dict_close("grad.", out, grads, ftref.TOL_GRAD)


def test_outer_tied_head_base_layer_kept(store, ft, tmp_path):
    """A tied model's adapter whose two base_layer copies differ: PEFT's loading fills the
    one tensor from the embedding's key, then the head's, which stays (both modules then
    compute with it); ours likewise."""
    import shutil

    from safetensors.torch import save_file

    model_dir = store.model("tied")
    d = tmp_path / "adapter"
    shutil.copytree(store.adapter("tied", "outer"), d)
    t = load_file(str(d / "adapter_model.safetensors"))
    k = "base_model.model.lm_head.base_layer.weight"
    t[k] = t[k] + 0.3 * torch.randn(t[k].shape, generator=torch.Generator().manual_seed(4))
    save_file(t, str(d / "adapter_model.safetensors"), metadata={"format": "pt"})
    m = ftref.lora_mode_model(model_dir, d)
    assert torch.equal(m.base_model.model.model.embed_tokens.base_layer.weight, t[k])
    ids, labels = ftref.make_batch(64, B, 12, 6)
    logits, loss, grads = ftref.hf_grads(m, ids, labels, key=ftref.ours_key)
    out = ft(dict(model_dir=model_dir, adapter_dir=d, mode="lora", input_ids=ids,
                  labels=labels), "outer-tied-base-layer")
    ftref.assert_close("logits", out["logits"], logits, ftref.TOL_LOGITS)
    ftref.assert_tensor_dict_close("grad.", out, grads, ftref.TOL_GRAD)


@pytest.mark.parametrize("targets,saved", [(["q_proj", "embed_tokens", "lm_head"], ["lm_head"]),
                                           (["q_proj", "lm_head"], ["embed_tokens"])])
def test_outer_tied_with_modules_to_save_under_weight_tying_refused(store, ft_raw, tmp_path,
                                                                    targets, saved):
    """LoRA on a tied model's embedding / head beside modules_to_save with
    ensure_weight_tying: PEFT 0.21.2 raises (it ties the listed module to the other's LoRA
    layer), and so do we, saying so. Without ensure_weight_tying (PEFT's default) both
    train apart: test_modules_to_save.py (mts_head_lora_embed, mts_embed_lora_head)."""
    import shutil

    from peft import LoraConfig, get_peft_model

    model_dir = store.model("tied")
    with pytest.raises(TypeError, match="modules_to_save cannot be applied to modules of type"):
        get_peft_model(ftref.load_hf(model_dir),
                       LoraConfig(r=4, target_modules=targets, modules_to_save=saved,
                                  ensure_weight_tying=True))
    d = tmp_path / "adapter"
    shutil.copytree(store.adapter("tied", "mts_tie"), d)
    p = d / "adapter_config.json"
    c = json.loads(p.read_text())
    c["target_modules"], c["modules_to_save"] = targets, saved
    p.write_text(json.dumps(c))
    ids, _ = ftref.make_batch(64, 1, 4, 0)
    cp, _ = ft_raw(dict(model_dir=model_dir, adapter_dir=d, mode="lora", input_ids=ids),
                   "outer-tied-mts")
    assert cp.returncode != 0
    for want in ("modules_to_save", "ensure_weight_tying", "PEFT", "adapter_config.json"):
        assert want in cp.stderr, cp.stderr


@pytest.mark.parametrize("model_name", ["llama_gqa", "tied"])
def test_outer_lora_init_dora(store, tmp_path, model_name):
    """ft-lora-init --dora with the embedding and lm_head: PEFT's magnitudes there (the
    embedding's column norms [C], the head's row norms [V]; tied: both of the one
    tensor), loading in PEFT with every key used and the base's logits. (Not on a model
    whose padding row is zero, as gemma's: the head's magnitude and norm of that row are
    then 0, and PEFT's own init gives that logit 0 / 0.)"""
    exe = ftref.tool_exe("FT_LORA_INIT", "ft-lora-init")
    model_dir = store.model(model_name)
    out = tmp_path / "adapter"
    ftref.run_tool([exe, "--model", model_dir, "--out", out, "--r", 4, "--dora", "--target",
                    "q_proj,embed_tokens,lm_head"])
    t = load_file(str(out / "adapter_model.safetensors"))
    base_sd = load_file(str(model_dir / "model.safetensors"))
    e = base_sd["model.embed_tokens.weight"].float()
    w = base_sd.get("lm_head.weight", base_sd["model.embed_tokens.weight"]).float()
    ftref.assert_close("embedding magnitude",
                       t["base_model.model.model.embed_tokens.lora_magnitude_vector"],
                       torch.linalg.norm(e, dim=0), 1e-6)
    ftref.assert_close("head magnitude", t["base_model.model.lm_head.lora_magnitude_vector"],
                       torch.linalg.norm(w, dim=1), 1e-6)
    pm = load_peft_checked(model_dir, out)
    held = held_adapter(pm)
    assert set(held) == set(t), sorted(set(held) ^ set(t))
    vocab = ftref.SHAPES[model_name].cfg["vocab_size"]
    ids, _ = ftref.make_batch(vocab, 2, 12, 0)
    ftref.assert_close("lora-init logits", ftref.hf_forward(pm, ids)[0],
                       ftref.hf_forward(ftref.load_hf(model_dir), ids)[0], ftref.TOL_LOGITS)


def test_outer_lora_init_tied(store, tmp_path):
    """ft-lora-init on a tied model: each module its own pair (ensure_weight_tying false,
    PEFT's default), every key used by PEFT, the base's logits."""
    exe = ftref.tool_exe("FT_LORA_INIT", "ft-lora-init")
    model_dir = store.model("gemma")
    out = tmp_path / "adapter"
    ftref.run_tool([exe, "--model", model_dir, "--out", out, "--r", 4, "--target",
                    "q_proj,embed_tokens,lm_head"])
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert sorted(cfg["target_modules"]) == ["embed_tokens", "lm_head", "q_proj"]
    assert cfg["ensure_weight_tying"] is False
    t = load_file(str(out / "adapter_model.safetensors"))
    assert "base_model.model.lm_head.lora_A.weight" in t
    assert "base_model.model.model.embed_tokens.lora_embedding_B" in t
    pm = load_peft_checked(model_dir, out)
    held = held_adapter(pm)
    assert set(held) == set(t), sorted(set(held) ^ set(t))
    ids, _ = ftref.make_batch(96, 2, 12, 0)
    ftref.assert_close("lora-init logits", ftref.hf_forward(pm, ids)[0],
                       ftref.hf_forward(ftref.load_hf(model_dir), ids)[0], ftref.TOL_LOGITS)


@pytest.mark.parametrize("tying,dora", [("true", False), ("false", False), ("true", True)])
def test_outer_lora_init_weight_tying(store, tmp_path, tying, dora):
    """ft-lora-init --ensure-weight-tying on a tied model: true gives PEFT's tied pair (the
    head's the embedding's transposed: PEFT's init of the head, A kaiming-uniform, B = 0,
    fills both), false a pair each; --dora beside it a magnitude on each module; loading in
    PEFT with every key used, the base's logits."""
    exe = ftref.tool_exe("FT_LORA_INIT", "ft-lora-init")
    model_dir = store.model("tied")
    out = tmp_path / "adapter"
    ftref.run_tool([exe, "--model", model_dir, "--out", out, "--r", 4, "--target",
                    "q_proj,embed_tokens,lm_head", "--ensure-weight-tying", tying] +
                   (["--dora"] if dora else []))
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["ensure_weight_tying"] is (tying == "true")
    assert cfg["use_dora"] is dora
    t = load_file(str(out / "adapter_model.safetensors"))
    eb = t["base_model.model.model.embed_tokens.lora_embedding_B"]
    ha = t["base_model.model.lm_head.lora_A.weight"]
    assert torch.equal(eb.T, ha) == (tying == "true")
    assert float(ha.abs().max()) <= 1 / math.sqrt(32)
    pm = load_peft_checked(model_dir, out)
    held = held_adapter(pm)
    assert set(held) == set(t), sorted(set(held) ^ set(t))
    for k, v in t.items():
        assert torch.equal(held[k], v), k
    ids, _ = ftref.make_batch(64, 2, 12, 0)
    ftref.assert_close("lora-init logits", ftref.hf_forward(pm, ids)[0],
                       ftref.hf_forward(ftref.load_hf(model_dir), ids)[0], ftref.TOL_LOGITS)


def test_outer_lora_init(store, tmp_path):
    """ft-lora-init --target q_proj,embed_tokens,lm_head: PEFT's init (the embedding's A = 0
    and B ~ N(0, 1); the head's A kaiming-uniform and B = 0), loading in PEFT with every key
    used and the base's logits."""
    exe = ftref.tool_exe("FT_LORA_INIT", "ft-lora-init")
    model_dir = store.model("llama_gqa")
    out = tmp_path / "adapter"
    ftref.run_tool([exe, "--model", model_dir, "--out", out, "--r", 8, "--target",
                    "q_proj,embed_tokens,lm_head"])
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert sorted(cfg["target_modules"]) == ["embed_tokens", "lm_head", "q_proj"]
    t = load_file(str(out / "adapter_model.safetensors"))
    ea = t["base_model.model.model.embed_tokens.lora_embedding_A"]
    eb = t["base_model.model.model.embed_tokens.lora_embedding_B"]
    assert tuple(ea.shape) == (8, 96) and torch.count_nonzero(ea) == 0
    assert tuple(eb.shape) == (32, 8) and 0.8 < float(eb.std()) < 1.2 and abs(float(eb.mean())) < 0.2
    hb = t["base_model.model.lm_head.lora_B.weight"]
    assert tuple(hb.shape) == (96, 8) and torch.count_nonzero(hb) == 0
    pm = load_peft_checked(model_dir, out)
    held = held_adapter(pm)
    assert set(held) == set(t), sorted(set(held) ^ set(t))
    ids, _ = ftref.make_batch(96, 2, 12, 0)
    ftref.assert_close("lora-init logits", ftref.hf_forward(pm, ids)[0],
                       ftref.hf_forward(ftref.load_hf(model_dir), ids)[0], ftref.TOL_LOGITS)
