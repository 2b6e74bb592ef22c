"""modules_to_save: the embedding and/or the head trained in full beside the LoRA pairs,
as PEFT does it (a trainable copy of the module; the adapter file holds the copy under the
module's own key, base_model.model.model.embed_tokens.weight / base_model.model.lm_head.weight).

Both directions, every family with untied embeddings (llama, mistral, qwen2, qwen3,
granite, olmo2, phi3):
  - PEFT's adapter -> ours: logits and loss (1e-5), the gradient of every LoRA weight and of
    the embedding and head copies (1e-4);
  - five AdamW steps (1e-5 per tensor), then our saved adapter -> PeftModel.from_pretrained
    with no missing or unexpected keys, holding our values, and the same logits as ours.
Tied embeddings (gemma, gemma2, smollm3, the tied qwen3, llama and phi3 shapes): with
ensure_weight_tying PEFT trains one copy shared by the embedding and the head (saved under
both keys), as we do, both directions likewise; without it (PEFT's default) PEFT wraps a
trainable copy of each listed module and leaves the other on the base tensor, which unties
them: the model unties its head (a copy of the embedding), both directions likewise, and
the saved adapter holds only the listed modules' keys.
ft-merge of such an adapter is in test_tools_peft.py (MERGE_CASES, TIED_UNTIE_MERGES)."""

import json

import pytest

import ftref
from adapter_ref import adapter_case, assert_saved_loads_in_peft, five_steps, \
    train_and_save


UNTIED = ["llama_gqa", "mistral_sw", "qwen2", "qwen3", "granite", "olmo2", "phi3"]
TIED = ["tied", "gemma", "gemma2", "smollm3", "qwen3_tied", "phi4_mini"]

CASES = ([("llama_gqa", "mts_head"), ("llama_gqa", "mts_embed")] +
         [(m, "mts_both") for m in UNTIED] + [(m, "mts_tie") for m in TIED] +
         [("tied", "mts_tie_head")] +
         # tied, no ensure_weight_tying: untied copies
         [(m, "mts_head_all") for m in TIED] + [("tied", "mts_both"), ("gemma2", "mts_both"),
                                               ("tied", "mts_embed"), ("qwen3_tied", "mts_embed")] +
         # ... with LoRA on the module not listed (over the base tensor)
         [("tied", "mts_head_lora_embed"), ("gemma", "mts_head_lora_embed"),
          ("tied", "mts_embed_lora_head"), ("gemma2", "mts_embed_lora_head"),
          ("llama_gqa", "mts_head_lora_embed")])


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-{v}" for m, v in CASES])
def case(request, store, ft):
    model_name, variant = request.param
    c = adapter_case(store, ft, model_name, variant, f"mts-{model_name}-{variant}", pad=True)
    c.tied = ftref.SHAPES[model_name].cfg["tie_word_embeddings"]
    return c


def test_mts_logits_loss(case):
    ftref.assert_close("logits", case.out["logits"], case.ref_logits, ftref.TOL_LOGITS)
    ftref.assert_close("loss", case.out["loss"], case.ref_loss, ftref.TOL_LOGITS)


def test_mts_grads(case):
    cfg = json.loads((case.adapter_dir / "adapter_config.json").read_text())
    tie = case.tied and cfg.get("ensure_weight_tying")
    for mod in cfg["modules_to_save"]:  # (tied: the one copy is the embedding)
        want = ("model.embed_tokens.weight" if "embed" in mod or tie
                else "lm_head.weight")
        assert want in case.ref_grads, sorted(case.ref_grads)
    ftref.assert_tensor_dict_close("grad.", case.out, case.ref_grads, ftref.TOL_GRAD)


# five steps (as test_train.py: lr 1e-2, no k_proj / qkv_proj in the pairs); the seed of
# the random adapter values picks a well-conditioned draw (see test_train.py)
TRAIN_RUNS = [("llama_gqa", "mts_both_no_k", 4), ("qwen2", "mts_both_no_k", 3),
              ("phi3", "mts_both_no_qkv", 1), ("tied", "mts_tie_no_k", 1),
              ("gemma", "mts_tie_no_k", 1), ("tied", "mts_both_no_k", 3),
              ("gemma", "mts_both_no_k", 2), ("smollm3", "mts_head_no_k", 2),
              ("tied", "mts_head_lora_embed_no_k", 1), ("tied", "mts_embed_lora_head_no_k", 1)]


# max_grad_norm below each run's gradient norms, so that clipping acts (test_reference.py
# checks it does, and that the runs are well-conditioned)
CLIP = {}


def _train(model_name, variant):
    return five_steps(CLIP.get((model_name, variant), 1.0))


@pytest.mark.parametrize("model_name,variant,seed", TRAIN_RUNS,
                         ids=[f"{m}-{v}" for m, v, _ in TRAIN_RUNS])
def test_mts_train_and_save_loads_in_peft(store, ft, tmp_path, model_name, variant, seed):
    r = train_and_save(store, ft, tmp_path, model_name, variant, seed,
                       _train(model_name, variant), f"mts-train-{model_name}")
    given = json.loads((r.adapter_dir / "adapter_config.json").read_text())
    tie = ftref.SHAPES[model_name].cfg["tie_word_embeddings"] and given["ensure_weight_tying"]
    mods = sorted(given["modules_to_save"])
    assert any(k.endswith("embed_tokens.weight") for k in r.ref["weights"]) == \
        ("embed_tokens" in mods or tie)
    assert ("lm_head.weight" in r.ref["weights"]) == ("lm_head" in mods and not tie)
    ftref.assert_tensor_dict_close("weight.", r.out, r.ref["weights"], ftref.TOL_WEIGHT)

    # ours -> PEFT: every key used, nothing missing, our values, our logits
    cfg = json.loads((r.saved / "adapter_config.json").read_text())
    assert sorted(cfg["modules_to_save"]) == (["embed_tokens"] if tie else mods)
    assert cfg["ensure_weight_tying"] == bool(tie)
    assert_saved_loads_in_peft(ft, r, f"mts-saved-{model_name}")


@pytest.mark.parametrize("entry", ["norm", "model.layers.0.mlp", "q_proj"])
def test_mts_unsupported_module_refused(store, ft_raw, tmp_path, entry):
    import shutil

    src = store.adapter("llama_gqa", "mts_head")
    d = tmp_path / "adapter"
    shutil.copytree(src, d)
    p = d / "adapter_config.json"
    c = json.loads(p.read_text())
    c["modules_to_save"] = ["lm_head", entry]
    p.write_text(json.dumps(c))
    ids, _ = ftref.make_batch(96, 1, 4, 0)
    cp, _ = ft_raw(dict(model_dir=store.model("llama_gqa"), adapter_dir=d, mode="lora",
                        input_ids=ids), f"mts-bad-{entry}")
    assert cp.returncode != 0
    assert "modules_to_save" in cp.stderr and entry in cp.stderr, cp.stderr
