"""Tests 1 and 2: forward (logits, loss) and full-mode gradients vs transformers, on every
model shape in ftref.SHAPES (GQA, MQA with 3 heads, tied embeddings, Qwen2 biases, llama3
RoPE scaling, Mistral sliding window, explicit head_dim, attention/MLP bias, bf16 and fp16
checkpoints, a sharded checkpoint, Granite's multipliers, Gemma's norms and GeGLU, OLMo2's
post-norms and whole-projection q/k norms, Qwen3's per-head q/k norms, tied and untied)."""

import pytest

import ftref

B = 2


class Case:
    pass


@pytest.fixture(scope="module", params=list(ftref.SHAPES))
def case(request, store, ft):
    """One shape: HF's logits/loss/grads, and our eval-mode and full-mode outputs."""
    shape = ftref.SHAPES[request.param]
    c = Case()
    c.shape = shape
    c.model_dir = store.model(shape.name)
    model = ftref.full_mode_model(c.model_dir)
    c.pad = model.get_input_embeddings().padding_idx
    c.ids, c.labels = ftref.make_batch(model.config.vocab_size, B, shape.T, shape.seed,
                                       pad=c.pad)
    c.ref_logits, c.ref_loss, c.ref_grads = ftref.hf_grads(model, c.ids, c.labels)
    spec = dict(model_dir=c.model_dir, input_ids=c.ids, labels=c.labels)
    c.eval_out = ft(dict(spec, mode="eval"), f"{shape.name}-eval")
    c.full_out = ft(dict(spec, mode="full"), f"{shape.name}-full")
    return c


def test_eval_logits(case):
    ftref.assert_close(f"[{case.shape.name}] eval logits", case.eval_out["logits"],
                       case.ref_logits, ftref.TOL_LOGITS)


def test_eval_loss(case):
    assert "loss" in case.eval_out, "no 'loss' tensor in the output"
    assert tuple(case.eval_out["loss"].shape) == (), \
        f"loss must be a scalar (shape []), got {tuple(case.eval_out['loss'].shape)}"
    ftref.assert_close(f"[{case.shape.name}] eval loss", case.eval_out["loss"], case.ref_loss,
                       ftref.TOL_LOGITS)


def test_eval_has_no_grads(case):
    extra = sorted(k for k in case.eval_out if k.startswith("grad."))
    assert not extra, f"eval mode wrote gradients: {extra[:5]}"


def test_full_logits_loss(case):
    ftref.assert_close(f"[{case.shape.name}] full-mode logits", case.full_out["logits"],
                       case.ref_logits, ftref.TOL_LOGITS)
    ftref.assert_close(f"[{case.shape.name}] full-mode loss", case.full_out["loss"],
                       case.ref_loss, ftref.TOL_LOGITS)


def test_full_grads(case):
    """Every parameter's gradient (HF state-dict names; tied: embed only) within 1e-4."""
    if case.shape.cfg.get("tie_word_embeddings"):
        assert "model.embed_tokens.weight" in case.ref_grads
        assert "lm_head.weight" not in case.ref_grads
    ftref.assert_tensor_dict_close("grad.", case.full_out, case.ref_grads, ftref.TOL_GRAD)
    if case.pad is not None:  # the batch holds the padding id: the lookup gives its row
        assert (case.ids == case.pad).any()  # no gradient (tied: the head's only)
        if not case.shape.cfg.get("tie_word_embeddings"):
            assert not case.ref_grads["model.embed_tokens.weight"][case.pad].any()


def test_some_shape_has_a_padding_row(store):
    """test_full_grads checks the embedding's padding_idx on the shapes that have one."""
    assert any(s.cfg.get("pad_token_id") is not None for s in ftref.SHAPES.values())
