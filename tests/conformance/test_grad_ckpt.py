"""Test 5: gradient checkpointing changes memory, not numbers: with grad_ckpt on and off
our harness gives bit-identical logits, loss and gradients (torch.equal), full and LoRA."""

import pytest
import torch

import ftref

CASES = [
    ("llama_gqa", None),
    ("qwen2", None),
    ("mistral_sw", None),
    ("llama_gqa", "all7"),
    ("tied", "qv"),
    # post-norms (the MLP's needs its input recomputed) and q/k norms
    ("olmo2", None),
    ("olmo2", "all7"),
    ("qwen3", "all7"),
]


@pytest.mark.parametrize("model_name,adapter", CASES,
                         ids=[f"{m}-{a or 'full'}" for m, a in CASES])
def test_grad_ckpt_identical(store, ft, model_name, adapter):
    shape = ftref.SHAPES[model_name]
    vocab = ftref.make_config(shape).vocab_size
    ids, labels = ftref.make_batch(vocab, 2, shape.T, shape.seed + 3)
    spec = dict(model_dir=store.model(model_name), input_ids=ids, labels=labels)
    if adapter:
        spec.update(adapter_dir=store.adapter(model_name, adapter), mode="lora")
    else:
        spec.update(mode="full")
    tag = f"ckpt-{model_name}-{adapter or 'full'}"
    off = ft(dict(spec, grad_ckpt=False), tag + "-off")
    on = ft(dict(spec, grad_ckpt=True), tag + "-on")
    grads = sorted(k for k in off if k.startswith("grad."))
    assert grads, "no grad.* tensors"
    assert sorted(k for k in on if k.startswith("grad.")) == grads
    bad = []
    for k in ["logits", "loss"] + grads:
        if not torch.equal(on[k], off[k]):
            bad.append(f"{k}: {ftref.describe(on[k], off[k])}")
    assert not bad, "grad_ckpt on != off:\n" + "\n".join(bad)
