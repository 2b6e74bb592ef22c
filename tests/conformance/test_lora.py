"""Test 3: LoRA. Adapters made by peft (random A and B), loaded by the harness from
adapter_model.safetensors + adapter_config.json; logits/loss with the adapter applied
(1e-5) and the gradient of every lora_A / lora_B (1e-4, PEFT adapter key names) vs PEFT's
autograd."""

import pytest

import ftref

B = 2

CASES = [
    ("llama_gqa", "qv"),
    ("llama_gqa", "all7"),
    ("llama_gqa", "all-linear"),
    ("llama_gqa", "all-linear-literal"),
    ("llama_gqa", "rslora"),
    ("llama_gqa", "o_down"),
    ("llama_gqa", "regex"),
    ("llama_gqa", "regex_layers"),
    ("llama_gqa", "paths"),
    ("llama_gqa", "layers_to_transform"),
    ("qwen2", "all7"),
    ("llama_mqa_odd", "all7"),
    ("head_dim16", "all7"),
    ("tied", "qv"),
    ("granite", "all7"),
    ("gemma", "all7"),
    ("gemma", "all-linear"),
    ("phi3", "all4"),
    ("phi3", "all-linear"),
    ("phi3", "all-linear-literal"),
    ("phi3", "phi_paths"),
    ("phi3_longrope", "all4"),
    ("llama_yarn", "all7"),
    ("phi4_mini", "qkv_down"),
    ("phi3_sw_partial", "all-linear"),
    ("smollm3", "all7"),
    ("smollm3_interval", "qv"),
    ("gemma2", "all7"),
    ("gemma3", "all7"),
    ("gemma3_legacy", "all-linear"),
    ("olmo2", "all7"),
    ("olmo2", "all-linear"),
    ("qwen3", "all7"),
    ("qwen3_tied", "qv"),
]


class Case:
    pass


def _reference(store, model_name, variant):
    c = Case()
    c.shape = ftref.SHAPES[model_name]
    c.model_dir = store.model(model_name)
    c.adapter_dir = store.adapter(model_name, variant)
    m = ftref.lora_mode_model(c.model_dir, c.adapter_dir)
    c.ids, c.labels = ftref.make_batch(m.config.vocab_size, B, c.shape.T, c.shape.seed + 1)
    c.ref_logits, c.ref_loss, c.ref_grads = ftref.hf_grads(m, c.ids, c.labels, key=ftref.peft_key)
    c.spec = dict(model_dir=c.model_dir, adapter_dir=c.adapter_dir, mode="lora",
                  input_ids=c.ids, labels=c.labels)
    return c


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-{v}" for m, v in CASES])
def case(request, store, ft):
    model_name, variant = request.param
    c = _reference(store, model_name, variant)
    c.out = ft(c.spec, f"lora-{model_name}-{variant}")
    return c


def test_lora_logits_loss(case):
    ftref.assert_close("lora logits", case.out["logits"], case.ref_logits, ftref.TOL_LOGITS)
    ftref.assert_close("lora loss", case.out["loss"], case.ref_loss, ftref.TOL_LOGITS)


def test_lora_grads(case):
    assert all(".lora_A.weight" in k or ".lora_B.weight" in k for k in case.ref_grads)
    ftref.assert_tensor_dict_close("grad.", case.out, case.ref_grads, ftref.TOL_GRAD)


@pytest.mark.parametrize("variant,keywords", [
    ("patterns", ("rank_pattern", "alpha_pattern")),
    ("dora", ("use_dora", "dora", "DoRA")),
])
def test_lora_honour_or_reject(store, ft_raw, variant, keywords):
    """An adapter with rank_pattern/alpha_pattern (or DoRA) must either be honoured (same
    logits/grads as PEFT) or rejected with a non-zero exit and a message naming the key."""
    c = _reference(store, "llama_gqa", variant)
    cp, out_path = ft_raw(c.spec, f"lora-{variant}")
    if cp.returncode != 0:
        assert any(k in cp.stderr for k in keywords), (
            f"rejected, but stderr names none of {keywords}:\n{cp.stderr}")
        return
    from safetensors.torch import load_file

    out = load_file(str(out_path))
    ftref.assert_close(f"{variant} logits", out["logits"], c.ref_logits, ftref.TOL_LOGITS)
    ftref.assert_tensor_dict_close("grad.", out, c.ref_grads, ftref.TOL_GRAD)
