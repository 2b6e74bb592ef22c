"""Test 6: packed sequences. Samples packed into one row with position_ids restarting at
0 (and labels -100 at each sample's first token, as DataCollatorWithFlattening makes
them) give the logits of each sample run alone through HF (1e-5), and the gradients of
the samples run separately with the same total-token normalisation (1e-4)."""

import pytest
import torch

import ftref

# two rows of T = 16: three samples in row 0, two in row 1
LAYOUT = [[5, 7, 4], [9, 7]]
T = 16


def _samples(vocab, seed):
    g = torch.Generator().manual_seed(2000 + seed)
    return [[torch.randint(0, vocab, (n,), generator=g) for n in row] for row in LAYOUT]


def _pack(samples):
    """Each row packed by transformers' own DataCollatorWithFlattening."""
    import warnings

    from transformers import DataCollatorWithFlattening

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collate = DataCollatorWithFlattening(return_tensors="pt")
    ids, pos, labels = [], [], []
    for row in samples:
        b = collate([{"input_ids": s.tolist()} for s in row])
        assert b["input_ids"].shape == (1, T)
        ids.append(b["input_ids"][0])
        pos.append(b["position_ids"][0])
        labels.append(b["labels"][0])
    ids, pos, labels = torch.stack(ids), torch.stack(pos), torch.stack(labels)
    assert int((labels == -100).sum()) == sum(len(r) for r in LAYOUT)
    return ids, pos, labels


def _reference(model, samples):
    """Each sample alone (batch of 1, positions 0..n-1): logits laid out as in the packed
    rows, and sum_i(mean loss_i * n_i) / N with N = total counted tokens."""
    model.zero_grad(set_to_none=True)
    n_total = sum(len(s) - 1 for row in samples for s in row)
    logits_rows, total = [], 0.0
    for row in samples:
        parts = []
        for s in row:
            out = model(input_ids=s[None], labels=s[None])
            (out.loss * (len(s) - 1) / n_total).backward()
            total = total + out.loss.detach() * (len(s) - 1)
            parts.append(out.logits.detach()[0])
        logits_rows.append(torch.cat(parts))
    grads = {ftref.peft_key(n): p.grad.detach().clone() for n, p in ftref.trainable(model)}
    model.zero_grad(set_to_none=True)
    return torch.stack(logits_rows), total / n_total, grads


CASES = [("llama_gqa", None), ("llama_gqa", "all7"), ("qwen2", None), ("mistral_sw", None),
         ("olmo2", "all7"), ("qwen3", None)]


@pytest.mark.parametrize("model_name,adapter", CASES,
                         ids=[f"{m}-{a or 'full'}" for m, a in CASES])
def test_packed(store, ft, model_name, adapter):
    shape = ftref.SHAPES[model_name]
    model_dir = store.model(model_name)
    samples = _samples(ftref.make_config(shape).vocab_size, shape.seed)
    ids, pos, labels = _pack(samples)
    spec = dict(model_dir=model_dir, input_ids=ids, labels=labels, position_ids=pos)
    if adapter:
        adapter_dir = store.adapter(model_name, adapter)
        spec.update(adapter_dir=adapter_dir, mode="lora")
        m = ftref.lora_mode_model(model_dir, adapter_dir)
    else:
        spec.update(mode="full")
        m = ftref.full_mode_model(model_dir)
    ref_logits, ref_loss, ref_grads = _reference(m, samples)
    out = ft(spec, f"packed-{model_name}-{adapter or 'full'}")
    errors = [e for e in (
        ftref.check_close("packed logits vs samples alone", out["logits"], ref_logits,
                          ftref.TOL_LOGITS),
        ftref.check_close("packed loss", out["loss"], ref_loss, ftref.TOL_LOGITS)) if e]
    assert not errors, "\n".join(errors)
    ftref.assert_tensor_dict_close("grad.", out, ref_grads, ftref.TOL_GRAD)
