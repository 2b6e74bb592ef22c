"""The spec's defaults: labels default to input_ids; mode defaults to eval, or lora when
adapter_dir is given; explicit position_ids 0..T-1 change nothing."""

import torch

import ftref


def _ids(shape, seed):
    return ftref.make_batch(ftref.make_config(shape).vocab_size, 2, shape.T, seed)[0]


def test_defaults_eval_and_labels(store, ft):
    shape = ftref.SHAPES["llama_gqa"]
    d = store.model(shape.name)
    ids = _ids(shape, 40)
    logits, loss = ftref.hf_forward(ftref.load_hf(d), ids, labels=ids)
    out = ft(dict(model_dir=d, input_ids=ids), "defaults-eval")
    assert not [k for k in out if k.startswith("grad.")], "default mode must be eval"
    ftref.assert_close("logits", out["logits"], logits, ftref.TOL_LOGITS)
    ftref.assert_close("loss (labels default to input_ids)", out["loss"], loss,
                       ftref.TOL_LOGITS)


def test_defaults_lora_with_adapter(store, ft):
    shape = ftref.SHAPES["llama_gqa"]
    d = store.model(shape.name)
    ad = store.adapter(shape.name, "qv")
    ids = _ids(shape, 41)
    m = ftref.lora_mode_model(d, ad)
    logits, loss, grads = ftref.hf_grads(m, ids, ids, key=ftref.peft_key)
    out = ft(dict(model_dir=d, adapter_dir=ad, input_ids=ids), "defaults-lora")
    ftref.assert_close("logits", out["logits"], logits, ftref.TOL_LOGITS)
    ftref.assert_close("loss", out["loss"], loss, ftref.TOL_LOGITS)
    ftref.assert_tensor_dict_close("grad.", out, grads, ftref.TOL_GRAD)


def test_explicit_sequential_positions(store, ft):
    shape = ftref.SHAPES["llama_gqa"]
    d = store.model(shape.name)
    ids = _ids(shape, 42)
    pos = torch.arange(shape.T).repeat(2, 1)
    base = ft(dict(model_dir=d, input_ids=ids, mode="full"), "positions-none")
    expl = ft(dict(model_dir=d, input_ids=ids, position_ids=pos, mode="full"), "positions-0..T-1")
    for k in sorted(base):
        ftref.assert_close(f"{k} with position_ids 0..T-1 vs without", expl[k], base[k],
                           ftref.TOL_SELF)
