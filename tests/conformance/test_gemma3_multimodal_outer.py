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
