"""DoRA (PEFT's use_dora): each LoRA layer y = b + m / ||W + s B A||_row (x W^T + s x A^T B^T)
with a trainable magnitude m (adapter key <module>.lora_magnitude_vector), the row norm a
constant in the gradient as PEFT takes it (peft/tuners/lora/dora.py).

Both directions, every family (fused Phi-3 modules, biases, q/k norms, soft-caps, tied
heads):
  - PEFT's adapter -> ours: logits and loss (1e-5), every gradient, the magnitude's
    included (1e-4);
  - five AdamW steps (1e-5 per tensor), then our saved adapter -> PeftModel.from_pretrained
    with no missing or unexpected keys, holding our values, and the same logits as ours;
  - ft-lora-init --dora: the magnitude PEFT initialises (the base weight's row norms).
DoRA with LoRA dropout is in test_train_semantics.py (PEFT with our masks), on a quantized
base in test_qlora.py, on the GPU in test_gpu_model.py, ft-merge in test_tools_peft.py,
the strategies in test_dist_train.py."""

import json

import pytest
import torch
from safetensors.torch import load_file

import ftref
from adapter_ref import adapter_case, assert_saved_loads_in_peft, five_steps, \
    held_adapter, load_peft_checked, train_and_save


FAMILIES = ["llama_gqa", "llama_mqa_odd", "llama_bias", "mistral_sw", "qwen2", "qwen3",
            "qwen3_tied", "tied", "granite", "gemma", "gemma2", "olmo2", "phi3",
            "phi4_mini", "smollm3"]
CASES = [(m, "dora_all") for m in FAMILIES] + [("llama_gqa", "dora_rslora")]
# on the embedding (magnitude per column, PEFT's DoraEmbeddingLayer) and on lm_head (per row;
# before granite's logits scaling and gemma2's cap), untied and tied (each module its own
# pair and magnitude over the one tensor: PEFT's default, no ensure_weight_tying)
OUTER = ([(m, "dora_outer") for m in ["llama_gqa", "qwen2", "granite", "tied", "gemma",
                                      "gemma2", "smollm3", "qwen3_tied"]] +
         [(m, "dora_outer_phi") for m in ["phi3", "phi4_mini"]] +
         [("llama_gqa", "dora_head"), ("llama_gqa", "dora_embed"), ("tied", "dora_head"),
          ("gemma", "dora_embed")])
# tied with ensure_weight_tying: the head's pair the embedding's transposed (one storage
# stepped twice, lib/model/tied_lora.c), each module its own magnitude
OUTER += ([(m, "dora_outer_tie") for m in ["tied", "gemma", "gemma2", "smollm3", "qwen3_tied"]] +
          [("phi4_mini", "dora_outer_tie_phi"), ("tied", "dora_tie_head")])
CASES += OUTER


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-{v}" for m, v in CASES])
def case(request, store, ft):
    model_name, variant = request.param
    return adapter_case(store, ft, model_name, variant, f"dora-{model_name}-{variant}", pad=False)


def test_dora_logits_loss(case):
    ftref.assert_close("logits", case.out["logits"], case.ref_logits, ftref.TOL_LOGITS)
    ftref.assert_close("loss", case.out["loss"], case.ref_loss, ftref.TOL_LOGITS)


def test_dora_grads(case):
    assert any(k.endswith(".lora_magnitude_vector") for k in case.ref_grads)
    ftref.assert_tensor_dict_close("grad.", case.out, case.ref_grads, ftref.TOL_GRAD)


# max_grad_norm below each run's gradient norms, so that clipping acts (test_reference.py
# checks it does, and that the runs are well-conditioned)
CLIP = {("gemma", "dora_no_k"): 0.7}


def _train(model_name, variant):
    return five_steps(CLIP.get((model_name, variant), 1.0))


TRAIN_RUNS = [("llama_gqa", "dora_no_k", 4), ("qwen2", "dora_no_k", 3),
              ("phi3", "dora_no_qkv", 1), ("gemma", "dora_no_k", 2),
              ("llama_gqa", "dora_outer_no_k", 4), ("tied", "dora_outer_no_k", 1),
              ("gemma", "dora_outer_no_k", 2), ("phi4_mini", "dora_outer_no_qkv", 2),
              ("tied", "dora_outer_tie_no_k", 1), ("gemma", "dora_outer_tie_no_k", 3),
              ("phi4_mini", "dora_outer_tie_no_qkv", 2)]


@pytest.mark.parametrize("model_name,variant,seed", TRAIN_RUNS,
                         ids=[f"{m}-{v}" for m, v, _ in TRAIN_RUNS])
def test_dora_train_and_save_loads_in_peft(store, ft, tmp_path, model_name, variant, seed):
    r = train_and_save(store, ft, tmp_path, model_name, variant, seed,
                       _train(model_name, variant), f"dora-train-{model_name}")
    assert any(k.endswith(".lora_magnitude_vector") for k in r.ref["weights"])
    ftref.assert_tensor_dict_close("weight.", r.out, r.ref["weights"], ftref.TOL_WEIGHT)

    cfg = json.loads((r.saved / "adapter_config.json").read_text())
    assert cfg["use_dora"] is True
    assert_saved_loads_in_peft(ft, r, f"dora-saved-{model_name}")


@pytest.mark.parametrize("model_name", ["llama_gqa", "phi3"])
def test_dora_lora_init(store, tmp_path, model_name):
    """ft-lora-init --dora: PEFT's init (magnitude = ||W||_row, B = 0), loading in PEFT with
    every key used and the base's logits."""
    exe = ftref.tool_exe("FT_LORA_INIT", "ft-lora-init")
    model_dir = store.model(model_name)
    out = tmp_path / "adapter"
    ftref.run_tool([exe, "--model", model_dir, "--out", out, "--r", 4, "--dora"])
    assert json.loads((out / "adapter_config.json").read_text())["use_dora"] is True
    tensors = load_file(str(out / "adapter_model.safetensors"))
    base_sd = load_file(str(model_dir / "model.safetensors"))
    mags = {k: t for k, t in tensors.items() if k.endswith(".lora_magnitude_vector")}
    assert len(mags) == len(ftref.linear_modules(ftref.SHAPES[model_name])) * 2
    for k, t in mags.items():
        w = base_sd[k.removeprefix("base_model.model.").replace(".lora_magnitude_vector",
                                                                ".weight")]
        ftref.assert_close(k, t, torch.linalg.norm(w.float(), dim=1), 1e-6)
    pm = load_peft_checked(model_dir, out)
    held = held_adapter(pm)
    assert set(held) == set(tensors)
    vocab = ftref.SHAPES[model_name].cfg["vocab_size"]
    ids, _ = ftref.make_batch(vocab, 2, 12, 0)
    ftref.assert_close("lora-init logits", ftref.hf_forward(pm, ids)[0],
                       ftref.hf_forward(ftref.load_hf(model_dir), ids)[0], ftref.TOL_LOGITS)


def test_dora_setting_mismatch_refused(store, ft_raw, tmp_path):
    """An adapter saved with DoRA is refused by a model without it, naming use_dora."""
    import shutil

    src = store.adapter("llama_gqa", "dora_all")
    d = tmp_path / "adapter"
    shutil.copytree(src, d)
    p = d / "adapter_config.json"
    c = json.loads(p.read_text())
    c["use_dora"] = "yes"
    p.write_text(json.dumps(c))
    ids, _ = ftref.make_batch(96, 1, 4, 0)
    cp, _ = ft_raw(dict(model_dir=store.model("llama_gqa"), adapter_dir=d, mode="lora",
                        input_ids=ids), "dora-bad-flag")
    assert cp.returncode != 0 and "use_dora" in cp.stderr, cp.stderr
