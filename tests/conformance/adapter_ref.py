"""What test_dora.py, test_lora_outer.py and test_modules_to_save.py share: the case of
one adapter variant (PEFT's logits, loss and gradients beside the harness's), the five
AdamW steps of a training run, and the check that an adapter we saved loads in PEFT with
every key used and our values and logits."""

import warnings

import torch
from safetensors.torch import load_file

import ftref

B = 2


class Case:
    pass


def adapter_case(store, ft, model_name, variant, tag, pad, shape=None, key=ftref.ours_key):
    """PEFT's logits, loss and gradients (our key names: key) of the store's adapter
    variant on a batch, and the harness's output on it. pad: plant the model's pad token
    in the rows (its embedding row has no gradient). shape: T and seed (default:
    ftref.SHAPES[model_name])."""
    c = Case()
    shape = shape or ftref.SHAPES[model_name]
    c.model_dir = store.model(model_name)
    c.adapter_dir = store.adapter(model_name, variant)
    m = ftref.lora_mode_model(c.model_dir, c.adapter_dir)
    text = m.config.get_text_config()  # (a multimodal model's text model's)
    ids, labels = ftref.make_batch(text.vocab_size, B, shape.T, shape.seed + 1,
                                   pad=text.pad_token_id if pad else None)
    c.ref_logits, c.ref_loss, c.ref_grads = ftref.hf_grads(m, ids, labels, key=key)
    c.out = ft(dict(model_dir=c.model_dir, adapter_dir=c.adapter_dir, mode="lora",
                    input_ids=ids, labels=labels), tag)
    return c


def five_steps(max_grad_norm):
    """The training runs' AdamW settings (max_grad_norm below a run's gradient norms, so
    that clipping acts: test_reference.py checks it does)."""
    return dict(steps=5, lr=1e-2, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01,
                warmup_steps=2, scheduler="cosine", max_grad_norm=max_grad_norm)


class TrainRun:
    pass


def train_and_save(store, ft, tmp_path, model_name, variant, seed, train, tag, shape=None,
                   key=ftref.ours_key):
    """Five AdamW steps of the store's adapter variant (adapter seed `seed`) in torch and in
    the harness, which saves its adapter to tmp_path/saved; the losses are checked here,
    the weights (r.out against r.ref["weights"], our names: key) by the caller. shape: as
    adapter_case's."""
    r = TrainRun()
    shape = shape or ftref.SHAPES[model_name]
    r.model_dir = store.model(model_name)
    r.adapter_dir = store.adapter(model_name, variant, seed=seed)
    r.ids, labels = ftref.make_batch(shape.cfg["vocab_size"], B, shape.T, shape.seed + 2)
    r.ref = ftref.reference_train(ftref.lora_mode_model(r.model_dir, r.adapter_dir), r.ids,
                                  labels, train, key=key)
    r.saved = tmp_path / "saved"
    r.out = ft(dict(model_dir=r.model_dir, adapter_dir=r.adapter_dir, mode="lora",
                    input_ids=r.ids, labels=labels, train=train, save_adapter=r.saved), tag)
    ftref.assert_close("losses", r.out["losses"], r.ref["losses"], ftref.TOL_LOSSES)
    return r


def held_adapter(pm, base_layers=False):
    """{adapter file key: tensor} of what a PeftModel holds; base_layers: with the base
    weights of its embedding / lm_head pairs (which PEFT saves beside them)."""
    out = {}
    for k, p in pm.state_dict().items():
        if ".modules_to_save.default." in k:
            out["base_model.model." + ftref.ours_key(k)] = p
        elif ".lora_" in k:
            out[ftref.peft_key(k)] = p
        elif base_layers and ".base_layer." in k and ("embed_tokens" in k or "lm_head" in k):
            out[k] = p
    return out


def load_peft_checked(model_dir, adapter_dir):
    """PeftModel.from_pretrained, failing on any missing / unexpected key warning."""
    from peft import PeftModel

    base = ftref.load_hf(model_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm = PeftModel.from_pretrained(base, str(adapter_dir))
    pm.eval()
    bad = [str(w.message) for w in caught
           if "missing" in str(w.message).lower() or "unexpected" in str(w.message).lower()]
    assert not bad, bad
    return pm


def assert_saved_loads_in_peft(ft, r, tag):
    """Ours -> PEFT: the adapter the run saved loads with no missing or unexpected key,
    PEFT holds exactly the file's tensors (the embedding's / head's base weights PEFT saves
    beside their pairs included), and its logits are ours from the saved adapter."""
    tensors = load_file(str(r.saved / "adapter_model.safetensors"))
    pm = load_peft_checked(r.model_dir, r.saved)
    held = held_adapter(pm, base_layers=True)
    assert set(held) == set(tensors), sorted(set(held) ^ set(tensors))
    for k, t in tensors.items():
        assert torch.equal(held[k], t), f"{k}: peft holds other values than the file"
    ours = ft(dict(model_dir=r.model_dir, adapter_dir=r.saved, mode="lora", input_ids=r.ids),
              tag)
    ftref.assert_close("saved adapter logits (PEFT vs ours)", ours["logits"],
                       ftref.hf_forward(pm, r.ids)[0], ftref.TOL_LOGITS)
