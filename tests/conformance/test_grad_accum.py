"""Test 7: gradient accumulation. grad_accum=2 over 4 rows equals grad_accum=1 (ours vs
ours, 1e-5: fp32 reduction order, see ftref.TOL_SELF) and HF's full-batch gradients (1e-4). The two micro-batches count different
numbers of tokens, so averaging per micro-batch would be caught."""

import pytest

import ftref

B, T = 4, 12


def _batch(vocab, seed):
    ids, labels = ftref.make_batch(vocab, B, T, seed, n_ignore=0)
    labels[0, :7] = -100   # micro-batch 0 (rows 0, 1) counts far fewer tokens
    labels[1, 3:9] = -100
    labels[3, 5] = -100
    return ids, labels


@pytest.mark.parametrize("model_name,adapter", [("llama_gqa", None), ("llama_gqa", "all7"),
                                                ("qwen2", None)],
                         ids=["llama_gqa-full", "llama_gqa-lora", "qwen2-full"])
def test_grad_accum(store, ft, model_name, adapter):
    shape = ftref.SHAPES[model_name]
    model_dir = store.model(model_name)
    ids, labels = _batch(ftref.make_config(shape).vocab_size, shape.seed + 4)
    counted = (labels[:, 1:] != -100).sum(dim=1)
    assert counted[:2].sum() != counted[2:].sum()
    spec = dict(model_dir=model_dir, input_ids=ids, labels=labels)
    if adapter:
        adapter_dir = store.adapter(model_name, adapter)
        spec.update(adapter_dir=adapter_dir, mode="lora")
        m = ftref.lora_mode_model(model_dir, adapter_dir)
    else:
        spec.update(mode="full")
        m = ftref.full_mode_model(model_dir)
    ref_logits, ref_loss, ref_grads = ftref.hf_grads(m, ids, labels, key=ftref.peft_key)
    tag = f"accum-{model_name}-{adapter or 'full'}"
    one = ft(dict(spec, grad_accum=1), tag + "-1")
    two = ft(dict(spec, grad_accum=2), tag + "-2")

    errors = []
    for k in ["logits", "loss"] + sorted(k for k in one if k.startswith("grad.")):
        if k not in two:
            errors.append(f"grad_accum=2 output lacks {k}")
            continue
        m_ = ftref.check_close(f"grad_accum 2 vs 1: {k}", two[k], one[k], ftref.TOL_SELF)
        if m_:
            errors.append(m_)
    for what, ours, ref, tol in [("logits (grad_accum=2) vs HF", two["logits"], ref_logits,
                                  ftref.TOL_LOGITS),
                                 ("loss (grad_accum=2) vs HF", two["loss"], ref_loss,
                                  ftref.TOL_LOGITS)]:
        m_ = ftref.check_close(what, ours, ref, tol)
        if m_:
            errors.append(m_)
    assert not errors, "\n".join(errors)
    ftref.assert_tensor_dict_close("grad.", two, ref_grads, ftref.TOL_GRAD)
    ftref.assert_tensor_dict_close("grad.", one, ref_grads, ftref.TOL_GRAD)
