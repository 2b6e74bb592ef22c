"""The embedding and lm_head of the multimodal gemma3 checkpoint (Gemma3ForConditionalGeneration)
as PEFT 0.21.2 adapts them, against PEFT on the tiny model of test_gemma3_multimodal.py.

The names: the text model's embedding is the module model.language_model.embed_tokens
(checkpoint language_model.model.embed_tokens.weight), its head the top-level lm_head
(checkpoint language_model.lm_head.weight; tied by default: absent). PEFT's keys follow
the modules: base_model.model.model.language_model.embed_tokens.lora_embedding_A,
....embed_tokens.weight (modules_to_save), ....embed_tokens.base_layer.weight, and
base_model.model.lm_head.lora_A.weight, base_model.model.lm_head.weight, as a causal LM's.
A list naming q_proj would wrap the vision tower's q_proj too, so the adapters here name
the language model's modules by regex, as ft-lora-init and ft-train write them; PEFT's
ensure_weight_tying writes the embedding's path (model.language_model.embed_tokens) into
target_modules / modules_to_save, which we read.

Both directions, the tied checkpoint and an untied one (tie_word_embeddings false):
  - PEFT's adapter -> ours: logits and loss (1e-5), every gradient (1e-4): LoRA on the
    embedding and head (each module its own pair; with ensure_weight_tying the head's the
    embedding's transposed), DoRA there (and on the layers), modules_to_save (tied with
    ensure_weight_tying: one copy; without: the model untied, as PEFT's separate copies),
    LoRA on one of the two beside the other in modules_to_save;
  - five AdamW steps (1e-5), then our saved adapter -> PeftModel.from_pretrained with no
    missing or unexpected keys, our values, our logits;
  - ft-merge: loads in Gemma3ForConditionalGeneration to merge_and_unload's logits
    (1e-5), vision tower and projector carried byte for byte, an untied head written
    with tie_word_embeddings false; transformers' own merged output (its untied head
    saved as lm_head.weight) reads back in ours;
  - refused as PEFT refuses it: LoRA on one of the two beside the other in
    modules_to_save under ensure_weight_tying.
Added tokens (ft-train's model.add_special_tokens) on this model: test_gemma3_multimodal_tokens.py.
"""

import json
import subprocess
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import ftref
from adapter_ref import adapter_case, assert_saved_loads_in_peft, five_steps, \
    held_adapter, load_peft_checked, train_and_save
from test_gemma3_multimodal import SEED, TEXT, load_mm, make_mm_dir

# the language model's modules, as PEFT's re.fullmatch sees them
LAYERS = r"model\.language_model\.layers\.\d+\."
EMBED = r"model\.language_model\.embed_tokens"
QV = LAYERS + r"self_attn\.(?:q_proj|v_proj)"
NO_K = LAYERS + r"(?:self_attn\.(?:q_proj|v_proj|o_proj)|mlp\.down_proj)"
SEVEN = LAYERS + r"(?:self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj)"
VARIANTS = {
    # LoRA on the embedding and the head (tied: each module its own pair, PEFT's default)
    "outer": dict(target_modules=f"{QV}|{EMBED}|lm_head"),
    "outer_head": dict(target_modules=LAYERS + r"mlp\.down_proj|lm_head"),
    "outer_embed": dict(target_modules=f"{EMBED}|" + LAYERS + r"mlp\.up_proj"),
    # ensure_weight_tying: the head's pair the embedding's transposed (PEFT rewrites the
    # regex, or the list: ["model.language_model.embed_tokens", "embed_tokens"])
    "outer_tie": dict(target_modules=f"{QV}|{EMBED}|lm_head", ensure_weight_tying=True),
    "outer_tie_list": dict(target_modules=["embed_tokens", "lm_head"], ensure_weight_tying=True),
    "outer_tie_head": dict(target_modules=f"{QV}|lm_head", ensure_weight_tying=True),
    # DoRA there, and on the layers' modules
    "dora_outer": dict(target_modules=f"{QV}|{EMBED}|lm_head", use_dora=True),
    "dora_outer_tie": dict(target_modules=f"{QV}|{EMBED}|lm_head", use_dora=True,
                           ensure_weight_tying=True),
    # modules_to_save: tied with ensure_weight_tying one copy (PEFT writes the list
    # ["embed_tokens", "model.language_model.embed_tokens"], or for lm_head only the path)
    "mts_tie": dict(target_modules=SEVEN, modules_to_save=["embed_tokens"],
                    ensure_weight_tying=True),
    "mts_tie_head": dict(target_modules=QV, modules_to_save=["lm_head"], ensure_weight_tying=True),
    # ... without it (PEFT's default) a copy of each listed module: untied
    "mts_both": dict(target_modules=SEVEN, modules_to_save=["embed_tokens", "lm_head"]),
    "mts_head": dict(target_modules=QV, modules_to_save=["lm_head"]),
    "mts_head_lora_embed": dict(target_modules=f"{QV}|{EMBED}", modules_to_save=["lm_head"]),
    "mts_embed_lora_head": dict(target_modules=f"{QV}|lm_head", modules_to_save=["embed_tokens"]),
    # for training runs (no k_proj, as test_train.py explains)
    "outer_no_k": dict(target_modules=f"{NO_K}|{EMBED}|lm_head"),
    "outer_tie_no_k": dict(target_modules=f"{NO_K}|{EMBED}|lm_head", ensure_weight_tying=True),
    "dora_outer_no_k": dict(target_modules=f"{NO_K}|{EMBED}|lm_head", use_dora=True),
    "mts_tie_no_k": dict(target_modules=NO_K, modules_to_save=["embed_tokens"],
                         ensure_weight_tying=True),
    "mts_both_no_k": dict(target_modules=NO_K, modules_to_save=["embed_tokens", "lm_head"]),
}
SHAPE = SimpleNamespace(T=12, seed=SEED, cfg={"vocab_size": TEXT["vocab_size"]})


class MMStore:
    """The tied and the untied multimodal checkpoints and PEFT's adapters on them (made as
    conftest's store makes them: ftref.build_adapter, random pairs and trained copies)."""

    def __init__(self, root):
        self.root = root
        self._models, self._adapters = {}, {}

    def model(self, name):
        if name not in self._models:
            self._models[name] = make_mm_dir(self.root, name,
                                             tie_word_embeddings=name == "tied")
        return self._models[name]

    def adapter(self, name, variant, seed=None):
        seed = 7 if seed is None else seed
        key = (name, variant, seed)
        if key not in self._adapters:
            self._adapters[key] = ftref.build_adapter(
                self.model(name), self.root / f"adapter-{name}-{variant}-{seed}", seed=seed,
                **VARIANTS[variant])
        return self._adapters[key]


@pytest.fixture(scope="module")
def mm_store(tmp_path_factory):
    return MMStore(tmp_path_factory.mktemp("g3mm_outer"))


def ours_key(name):
    """PEFT's parameter name -> ours: a LoRA weight's adapter key, a trained copy's
    checkpoint name (model.language_model.X -> language_model.model.X, lm_head ->
    language_model.lm_head)."""
    k = ftref.ours_key(name)
    if k.startswith("model.language_model."):
        return "language_model.model." + k.removeprefix("model.language_model.")
    return "language_model." + k if k == "lm_head.weight" else k


CASES = ([("tied", v) for v in ["outer", "outer_head", "outer_embed", "outer_tie",
                                "outer_tie_list", "outer_tie_head", "dora_outer",
                                "dora_outer_tie", "mts_tie", "mts_tie_head", "mts_both",
                                "mts_head", "mts_head_lora_embed", "mts_embed_lora_head"]] +
         [("untied", v) for v in ["outer", "dora_outer", "mts_both", "mts_head"]])


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-{v}" for m, v in CASES])
def case(request, mm_store, ft):
    name, variant = request.param
    c = adapter_case(mm_store, ft, name, variant, f"g3mm-{name}-{variant}", pad=True,
                     shape=SHAPE, key=ours_key)
    c.variant = variant
    return c


def test_outer_logits_loss(case):
    ftref.assert_close("logits", case.out["logits"], case.ref_logits, ftref.TOL_LOGITS)
    ftref.assert_close("loss", case.out["loss"], case.ref_loss, ftref.TOL_LOGITS)


def test_outer_grads(case):
    outer = [k for k in case.ref_grads if "embed_tokens" in k or "lm_head" in k]
    assert outer, sorted(case.ref_grads)
    if VARIANTS[case.variant].get("use_dora"):
        assert any(k.endswith(".lora_magnitude_vector") for k in outer), outer
    ftref.assert_tensor_dict_close("grad.", case.out, case.ref_grads, ftref.TOL_GRAD)


# (the adapter seeds: float32 and float64 torch agree to 5e-7 after five steps, see
# test_training_references_are_well_conditioned; untied outer_no_k's seed 2 does not: 8e-5)
TRAIN_RUNS = [("tied", "outer_no_k", 1), ("tied", "outer_tie_no_k", 2),
              ("tied", "dora_outer_no_k", 1), ("tied", "mts_tie_no_k", 3),
              ("tied", "mts_both_no_k", 1), ("untied", "outer_no_k", 4),
              ("untied", "mts_both_no_k", 2)]


def test_training_references_are_well_conditioned(mm_store):
    """As test_reference.py checks the other families' runs: float32 vs float64 torch
    agree to 5e-7 (PEFT built on a float64 base), and the clipping threshold clips."""
    from peft import PeftModel

    for name, variant, seed in TRAIN_RUNS:
        model_dir, adapter_dir = mm_store.model(name), mm_store.adapter(name, variant, seed)
        ids, labels = ftref.make_batch(TEXT["vocab_size"], 2, SHAPE.T, SHAPE.seed + 2)
        train = five_steps(1.0)
        a = ftref.reference_train(ftref.lora_mode_model(model_dir, adapter_dir), ids, labels,
                                  train, key=ours_key)
        m64 = PeftModel.from_pretrained(ftref.load_hf(model_dir).double(), str(adapter_dir),
                                        is_trainable=True, autocast_adapter_dtype=False)
        m64.eval()
        b = ftref.reference_train(m64, ids, labels, train, key=ours_key)
        worst = max((ftref.rel_err(a["weights"][n], b["weights"][n]), n) for n in a["weights"])
        assert worst[0] < 5e-7, (name, variant, worst)
        assert ftref.rel_err(a["losses"], b["losses"]) < 5e-7
        assert max(a["norms"]) > train["max_grad_norm"]


@pytest.mark.parametrize("name,variant,seed", TRAIN_RUNS, ids=[f"{m}-{v}" for m, v, _ in TRAIN_RUNS])
def test_outer_train_and_save_loads_in_peft(mm_store, ft, tmp_path, name, variant, seed):
    r = train_and_save(mm_store, ft, tmp_path, name, variant, seed, five_steps(1.0),
                       f"g3mm-train-{name}-{variant}", shape=SHAPE, key=ours_key)
    ftref.assert_tensor_dict_close("weight.", r.out, r.ref["weights"], ftref.TOL_WEIGHT)
    cfg = json.loads((r.saved / "adapter_config.json").read_text())
    # a regex over the language model's modules (PEFT's re.fullmatch leaves the vision
    # tower alone), naming the embedding / head where they carry pairs
    assert isinstance(cfg["target_modules"], str), cfg["target_modules"]
    tensors = load_file(str(r.saved / "adapter_model.safetensors"))
    assert not any("vision" in k for k in tensors)
    assert_saved_loads_in_peft(ft, r, f"g3mm-saved-{name}-{variant}")


def _batch():
    return ftref.make_batch(TEXT["vocab_size"], 2, SHAPE.T, SHAPE.seed + 3)


def _peft(model_dir, adapter):
    from peft import PeftModel

    pm = PeftModel.from_pretrained(load_mm(model_dir), str(adapter))
    pm.eval()
    return pm


def _load_checked(d):
    from transformers import Gemma3ForConditionalGeneration

    m, info = Gemma3ForConditionalGeneration.from_pretrained(
        str(d), dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    m.eval()
    return m


MERGES = [("tied", "outer"), ("tied", "outer_tie"), ("tied", "dora_outer_tie"),
          ("tied", "mts_tie"), ("tied", "mts_both"), ("tied", "mts_head_lora_embed"),
          ("untied", "dora_outer"), ("untied", "mts_both")]


@pytest.mark.parametrize("name,variant", MERGES, ids=[f"{m}-{v}" for m, v in MERGES])
def test_merge_loads_with_vision_carried(mm_store, tmp_path, name, variant):
    """ft-merge's output loads in Gemma3ForConditionalGeneration (no missing or unexpected
    key) to merge_and_unload's logits, the vision tower and projector byte for byte, and
    says tie_word_embeddings as transformers' save of merge_and_unload does (false where
    PEFT's separate copies untied the head)."""
    model_dir, adapter = mm_store.model(name), mm_store.adapter(name, variant)
    out = tmp_path / "merged"
    ftref.run_tool([ftref.tool_exe("FT_MERGE", "ft-merge"), "--model", model_dir, "--adapter",
                    adapter, "--out", out])
    ids, _ = _batch()
    ref_model = _peft(model_dir, adapter).merge_and_unload()
    ref_model.save_pretrained(tmp_path / "hf_merged")
    with torch.no_grad():
        ref = ref_model(input_ids=ids).logits
        merged = _load_checked(out)(input_ids=ids).logits
    ftref.assert_close("merged multimodal logits", merged, ref, ftref.TOL_LOGITS)
    with safe_open(str(model_dir / "model.safetensors"), "pt") as a, \
            safe_open(str(out / "model.safetensors"), "pt") as b:
        carried = [k for k in a.keys() if not k.startswith("language_model.")]
        assert any(k.startswith("vision_tower.") for k in carried)
        assert any(k.startswith("multi_modal_projector.") for k in carried)
        untied = ["language_model.lm_head.weight"] if "language_model.lm_head.weight" not in \
            a.keys() and "lm_head" in str(VARIANTS[variant].get("modules_to_save")) and \
            not VARIANTS[variant].get("ensure_weight_tying") else []
        assert set(b.keys()) == set(a.keys()) | set(untied)
        for k in carried:
            x, y = a.get_tensor(k), b.get_tensor(k)
            assert x.dtype == y.dtype and torch.equal(x, y), k
    got = json.loads((out / "config.json").read_text())
    want = json.loads((tmp_path / "hf_merged" / "config.json").read_text())
    assert got["tie_word_embeddings"] == want["tie_word_embeddings"]
    src = json.loads((model_dir / "config.json").read_text())
    assert got["vision_config"] == src["vision_config"]
    assert got["text_config"] == src["text_config"]


def test_transformers_merged_untied_head_reads(mm_store, ft, tmp_path):
    """transformers saves the head that merge_and_unload untied (modules_to_save without
    ensure_weight_tying) as lm_head.weight, not language_model.lm_head.weight: ours reads
    that checkpoint to transformers' logits, and merges an adapter into it with the head
    written once."""
    model_dir = mm_store.model("tied")
    hf = _peft(model_dir, mm_store.adapter("tied", "mts_both")).merge_and_unload()
    d = tmp_path / "hf_merged"
    hf.save_pretrained(d)
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" in f.keys() and "language_model.lm_head.weight" not in f.keys()
    ids, labels = _batch()
    ref_logits, ref_loss = ftref.hf_forward(_load_checked(d), ids, labels)
    out = ft(dict(model_dir=d, input_ids=ids, labels=labels, mode="eval"), "g3mm-hf-merged")
    ftref.assert_close("logits", out["logits"], ref_logits, ftref.TOL_LOGITS)
    ftref.assert_close("loss", out["loss"], ref_loss, ftref.TOL_LOGITS)
    merged = tmp_path / "merged"
    ftref.run_tool([ftref.tool_exe("FT_MERGE", "ft-merge"), "--model", d, "--adapter",
                    mm_store.adapter("untied", "outer"), "--out", merged])
    with safe_open(str(merged / "model.safetensors"), "pt") as f:
        heads = [k for k in f.keys() if k.endswith("lm_head.weight")]
    assert heads == ["language_model.lm_head.weight"], heads
    _load_checked(merged)


@pytest.mark.parametrize("targets,saved", [(["embed_tokens", "lm_head"], ["lm_head"]),
                                           (["lm_head"], ["embed_tokens"])])
def test_lora_beside_modules_to_save_under_weight_tying_refused(mm_store, ft_raw, tmp_path,
                                                                targets, saved):
    """LoRA on the tied embedding / head beside modules_to_save with ensure_weight_tying:
    PEFT 0.21.2 raises (it ties the listed module to the other's LoRA layer), and so do
    we, saying so (as for every tied family: test_lora_outer.py)."""
    import shutil

    from peft import LoraConfig, get_peft_model

    layer = "model.language_model.layers.0.mlp.up_proj"
    with pytest.raises(TypeError, match="modules_to_save cannot be applied to modules of type"):
        get_peft_model(load_mm(mm_store.model("tied")),
                       LoraConfig(r=4, target_modules=[layer] + targets, modules_to_save=saved,
                                  ensure_weight_tying=True))
    d = tmp_path / "adapter"
    shutil.copytree(mm_store.adapter("tied", "mts_tie"), d)
    p = d / "adapter_config.json"
    c = json.loads(p.read_text())
    c["target_modules"], c["modules_to_save"] = [layer] + targets, saved
    p.write_text(json.dumps(c))
    ids, _ = _batch()
    cp, _ = ft_raw(dict(model_dir=mm_store.model("tied"), adapter_dir=d, mode="lora",
                        input_ids=ids), "g3mm-tied-mts")
    assert cp.returncode != 0
    for want in ("modules_to_save", "ensure_weight_tying", "PEFT", "adapter_config.json"):
        assert want in cp.stderr, cp.stderr


@pytest.mark.parametrize("args", [["--target", "q_proj,embed_tokens,lm_head"],
                                  ["--target", "q_proj,lm_head", "--ensure-weight-tying",
                                   "true"],
                                  ["--target", "v_proj,embed_tokens", "--dora"],
                                  ["--target", "all-linear", "--modules-to-save",
                                   "embed_tokens,lm_head", "--ensure-weight-tying", "false"]],
                         ids=["outer", "tie", "dora_embed", "mts_untie"])
def test_lora_init_loads_in_peft(mm_store, tmp_path, args):
    """ft-lora-init with the embedding and head: a regex naming the language model's
    modules only, loading in PEFT on Gemma3ForConditionalGeneration with every key used
    and nothing outside the language model wrapped, to the base's logits. (DoRA not on
    the head: the padding row of the tied embedding is zero, and PEFT's own init gives
    that logit 0 / 0.)"""
    model_dir = mm_store.model("tied")
    out = tmp_path / "init"
    ftref.run_tool([ftref.tool_exe("FT_LORA_INIT", "ft-lora-init"), "--model", model_dir,
                    "--out", out, "--r", 4] + args)
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert isinstance(cfg["target_modules"], str), cfg["target_modules"]
    pm = load_peft_checked(model_dir, out)
    wrapped = [n for n, mod in pm.named_modules()
               if hasattr(mod, "lora_A") or hasattr(mod, "modules_to_save")]
    assert wrapped and not any("vision" in n or "projector" in n for n in wrapped), wrapped
    assert any(n.endswith("language_model.embed_tokens") for n in wrapped), wrapped
    t = load_file(str(out / "adapter_model.safetensors"))
    held = held_adapter(pm)
    assert set(held) == set(t), sorted(set(held) ^ set(t))
    ids, _ = _batch()
    ftref.assert_close("lora-init logits", ftref.hf_forward(pm, ids)[0],
                       ftref.hf_forward(load_mm(model_dir), ids)[0], ftref.TOL_LOGITS)
