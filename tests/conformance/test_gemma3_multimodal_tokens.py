"""Tokens added to the multimodal gemma3 checkpoint (Gemma3ForConditionalGeneration), as
test_added_tokens.py checks them for the causal LMs: the user's recipe is
tokenizer.add_special_tokens, model.resize_token_embeddings(len(tokenizer)) (which on
this model sets config.text_config.vocab_size; the top level has no vocab_size), then
PEFT.

  - ft-train's model.add_special_tokens: the new rows start at the mean of the old rows
    (transformers' mean_resizing draw is within its noise of it); our starting adapter
    gives PEFT's gradients (1e-4) on the resized base; five AdamW steps equal torch's on
    that PEFT model (losses and every tensor, 1e-5); the saved adapter and tokenizer load
    by the recipe with no missing or unexpected keys to our logits (1e-5); ft-merge's
    checkpoint says text_config.vocab_size as transformers' save of the resized model
    does, carries the vision tower and the grown tokenizer, and loads in
    Gemma3ForConditionalGeneration to PEFT's logits; ft-eval reads the adapter (and its
    tokenizer) to PEFT's loss;
  - PEFT's own adapter for the resized model (modules_to_save tied and untied, LoRA on
    the grown embedding and head with their base_layer): ours reads it to PEFT's logits,
    loss (1e-5) and gradients (1e-4), and ft-eval to PEFT's loss;
  - every dist.strategy on 2 ranks equals one process.

The tiny model's image token is inside the vocabulary, as Gemma 3's is (262144 of
262208): transformers replaces an image token id at or past the vocabulary it was built
with (Gemma3Model.vocab_size, which resize_token_embeddings leaves as it was) by 0, which
would make its first added token unusable."""

import json
import subprocess

import pytest
import torch
from safetensors import safe_open

import ftref
import rankrun
from test_added_tokens import ADD, TRAIN, adapter_tensors, batch, config, losses, \
    no_key_warnings, resized_base, strategy_equals_one_process, write_data, write_tokenizer
from test_gemma3_multimodal import TEXT, load_mm, make_mm_dir
from test_gemma3_multimodal_outer import EMBED, QV, ours_key

V = TEXT["vocab_size"]
IMAGE_TOKEN = 92


def mm_tok_dir(d, name="model", **top):
    m = make_mm_dir(d, name, image_token_index=IMAGE_TOKEN, **top)
    write_tokenizer(m, V)
    return m


class Case:
    pass


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """The model with a tokenizer, a batch using the new tokens, our starting adapter (a
    run at learning rate 0) and our five-step run."""
    c = Case()
    c.d = tmp_path_factory.mktemp("g3mm_tokens")
    c.model = mm_tok_dir(c.d)
    # (batch seed 36: float32 and float64 torch agree to 1.0e-6 after the five steps;
    # seed 31 to 1.0e-5, the tolerance)
    c.ids, c.labels = batch(V, 36)
    c.data = write_data(c.d / "train.jsonl", c.ids, c.labels)
    out = rankrun.run(config(c.d, "init", c.model, c.data, train__learning_rate=0,
                             train__max_steps=1))
    assert f"vocabulary {V} -> {V + 2}" in out.stderr, out.stderr[-3000:]
    assert "modules_to_save: embed_tokens" in out.stderr, out.stderr[-3000:]
    c.init = c.d / "runs" / "init"
    rankrun.run(config(c.d, "five", c.model, c.data))
    c.run = c.d / "runs" / "five"
    c.start = adapter_tensors(c.init)
    c.rows = {"V": V, "embed": c.start[f"base_model.model.{ours_embed()}"]}
    return c


def ours_embed():
    return "model.language_model.embed_tokens.weight"


def peft_from(c, adapter, trainable=False):
    from peft import PeftModel

    m = PeftModel.from_pretrained(resized_base(c.model, V + 2, c.rows), str(adapter),
                                  is_trainable=trainable)
    m.eval()
    return m


def test_adapter_names(case):
    """The starting adapter: the grown embedding trained in full under PEFT's key (the
    tied head's key holding it again), the pairs under the language model's paths."""
    t = case.start
    assert t["base_model.model.model.language_model.embed_tokens.weight"].shape == (V + 2, 32)
    assert torch.equal(t["base_model.model.lm_head.weight"],
                       t["base_model.model.model.language_model.embed_tokens.weight"])
    assert all(k.startswith("base_model.model.model.language_model.layers.")
               for k in t if ".lora_" in k)
    cfg = json.loads((case.init / "final" / "adapter_config.json").read_text())
    assert cfg["modules_to_save"] == ["embed_tokens"] and cfg["ensure_weight_tying"] is True


def test_new_rows_are_the_mean(case):
    base = ftref.load_hf(case.model)
    hf = resized_base(case.model, V + 2)
    assert hf.config.text_config.vocab_size == V + 2
    old = base.get_input_embeddings().weight.detach()
    ours = case.start[f"base_model.model.{ours_embed()}"]
    assert torch.equal(ours[:V], old)
    ftref.assert_close("new rows", ours[V:], old.double().mean(0).float().expand(2, -1), 1e-6)
    worst = (hf.get_input_embeddings().weight[V:].detach() - ours[V:]).abs().max().item()
    assert worst <= 1e-3 * old.std().item()


def test_grads_against_peft(case, ft):
    ref = peft_from(case, case.init / "final", trainable=True)
    logits, loss, grads = ftref.hf_grads(ref, case.ids, case.labels, key=ours_key)
    assert "language_model.model.embed_tokens.weight" in grads
    out = ft(dict(model_dir=case.model, adapter_dir=case.init / "final", mode="lora",
                  input_ids=case.ids, labels=case.labels), "g3mm-at-grad")
    ftref.assert_close("logits", out["logits"], logits, ftref.TOL_LOGITS)
    ftref.assert_close("loss", out["loss"], loss, ftref.TOL_LOGITS)
    ftref.assert_tensor_dict_close("grad.", out, grads, ftref.TOL_GRAD)


def test_five_steps_against_peft(case):
    ref = ftref.reference_train(peft_from(case, case.init / "final", trainable=True),
                                case.ids, case.labels, TRAIN, key=ftref.ours_key)
    ftref.assert_close("losses", torch.tensor(losses(case.run), dtype=torch.float64),
                       ref["losses"], ftref.TOL_LOSSES)
    ours = {k if ".lora_" in k else k.removeprefix("base_model.model."): v
            for k, v in adapter_tensors(case.run).items()}
    assert torch.equal(ours.pop("lm_head.weight"), ours[ours_embed()])  # (the tied alias)
    assert set(ours) == set(ref["weights"]), sorted(set(ours) ^ set(ref["weights"]))
    for k, w in ref["weights"].items():
        ftref.assert_close(f"weight {k}", ours[k], w, ftref.TOL_WEIGHT)


def _eval_loss(model_dir, adapter, pm, tok, tmp_path):
    """ft-eval's loss on text using the new tokens (the adapter dir's tokenizer) against
    PEFT's."""
    text = "<|im_start|>abc de<|im_end|>fg"
    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"text": text}) + "\n")
    p = subprocess.run([ftref.tool_exe("FT_EVAL", "ft-eval"), "--model", str(model_dir),
                        "--adapter", str(adapter), "--data", str(data), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    ids = tok(text).input_ids + [tok.eos_token_id]
    assert V in ids and V + 1 in ids
    _, loss = ftref.hf_forward(pm, torch.tensor([ids]), torch.tensor([ids]))
    assert got["tokens"] == len(ids) - 1, got
    ftref.assert_close("ft-eval loss", torch.tensor([got["loss"]]), loss.reshape(1).double(),
                       ftref.TOL_LOGITS)


def test_saved_adapter_loads_in_peft_merges_and_evaluates(case, ft, tmp_path):
    from peft import PeftModel
    from transformers import AutoTokenizer, Gemma3ForConditionalGeneration

    final = case.run / "final"
    tok = AutoTokenizer.from_pretrained(str(final))
    assert len(tok) == V + 2 and tok.convert_tokens_to_ids(ADD) == [V, V + 1]
    base = load_mm(case.model)
    base.resize_token_embeddings(len(tok))
    pm = no_key_warnings(lambda: PeftModel.from_pretrained(base, str(final)))
    pm.eval()
    want, _ = ftref.hf_forward(pm, case.ids)
    out = ft(dict(model_dir=case.model, adapter_dir=final, mode="lora", input_ids=case.ids),
             "g3mm-at-saved")
    ftref.assert_close("saved adapter logits", out["logits"], want, ftref.TOL_LOGITS)

    merged = tmp_path / "merged"
    ftref.run_tool([ftref.tool_exe("FT_MERGE", "ft-merge"), "--model", case.model,
                    "--adapter", final, "--out", merged])
    # the vocabulary where transformers' save of the resized model puts it
    resized = load_mm(case.model)
    resized.resize_token_embeddings(len(tok))
    resized.save_pretrained(tmp_path / "hf_resized")
    hf_cfg = json.loads((tmp_path / "hf_resized" / "config.json").read_text())
    cfg = json.loads((merged / "config.json").read_text())
    assert cfg["text_config"]["vocab_size"] == hf_cfg["text_config"]["vocab_size"] == V + 2
    assert ("vocab_size" in cfg) == ("vocab_size" in hf_cfg)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (merged / name).read_text() == (final / name).read_text(), name
    assert AutoTokenizer.from_pretrained(str(merged)).convert_tokens_to_ids(ADD) == [V, V + 1]
    m, info = Gemma3ForConditionalGeneration.from_pretrained(
        str(merged), dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    m.eval()
    ftref.assert_close("merged logits", ftref.hf_forward(m, case.ids)[0], want,
                       ftref.TOL_LOGITS)
    with safe_open(str(case.model / "model.safetensors"), "pt") as a, \
            safe_open(str(merged / "model.safetensors"), "pt") as b:
        carried = [k for k in a.keys() if not k.startswith("language_model.")]
        assert carried and set(b.keys()) == set(a.keys())
        for k in carried:
            assert torch.equal(a.get_tensor(k), b.get_tensor(k)), k
    _eval_loss(case.model, final, pm, tok, tmp_path)


PEFT_VARIANTS = {
    # tied, ensure_weight_tying: the one grown embedding trained
    "mts_tie": dict(target_modules=QV, modules_to_save=["embed_tokens"],
                    ensure_weight_tying=True),
    # PEFT's default: a copy of each, untied
    "mts_both": dict(target_modules=QV, modules_to_save=["embed_tokens", "lm_head"]),
    # LoRA on the grown embedding and head: their grown base saved as base_layer
    "outer": dict(target_modules=f"{QV}|{EMBED}|lm_head"),
}


@pytest.mark.parametrize("variant", list(PEFT_VARIANTS))
def test_peft_adapter_for_resized_vocabulary(ft, tmp_path, variant):
    """PEFT's adapter made after resize_token_embeddings (random pairs, trained copies
    moved off the base, the new rows random): ours reads it to PEFT's logits, loss and
    gradients, and ft-eval (the tokenizer saved beside it) to PEFT's loss."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoTokenizer

    model_dir = mm_tok_dir(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tok.add_special_tokens({"additional_special_tokens": ADD})
    base = load_mm(model_dir)
    torch.manual_seed(3)
    base.resize_token_embeddings(len(tok))
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                         **PEFT_VARIANTS[variant]))
    ftref.perturb_adapter_(pm, torch.Generator().manual_seed(11))
    adapter = tmp_path / "adapter"
    pm.save_pretrained(str(adapter))
    tok.save_pretrained(str(adapter))
    base = load_mm(model_dir)
    base.resize_token_embeddings(len(tok))
    ref = no_key_warnings(lambda: PeftModel.from_pretrained(base, str(adapter),
                                                            is_trainable=True))
    ref.eval()
    ids, labels = batch(V, 41)
    logits, loss, grads = ftref.hf_grads(ref, ids, labels, key=ours_key)
    out = ft(dict(model_dir=model_dir, adapter_dir=adapter, mode="lora", input_ids=ids,
                  labels=labels), f"g3mm-peft-resized-{variant}")
    ftref.assert_close("logits", out["logits"], logits, ftref.TOL_LOGITS)
    ftref.assert_close("loss", out["loss"], loss, ftref.TOL_LOGITS)
    ftref.assert_tensor_dict_close("grad.", out, grads, ftref.TOL_GRAD)
    _eval_loss(model_dir, adapter, ref, tok, tmp_path)


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "fsdp",
                                      "model_parallel"])
def test_strategies_equal_one_process(tmp_path_factory, strategy):
    """Tokens added under every dist.strategy on two ranks = one process (data parallel:
    batch 8 on one rank against 4 per rank; model parallel: the same batch): the tied
    embedding trained in full with the grown rows, the pairs on the language model."""
    import test_dist_train as dt

    d = tmp_path_factory.getbasetemp() / "g3mm_tokens_dist"
    if not d.exists():
        d.mkdir()
        mm_tok_dir(d)
        g = torch.Generator().manual_seed(9)
        rows = []
        for _ in range(32):
            ids = torch.randint(1, V + 2, (10,), generator=g).tolist()
            rows.append({"input_ids": ids, "labels": [-100] * 3 + ids[3:]})
        (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = d / "model"
    run = strategy_equals_one_process(d, model, strategy)
    w = dt.weights(run)
    assert w["base_model.model.model.language_model.embed_tokens.weight"].shape[0] == V + 2
    assert (run / "final" / "tokenizer.json").exists()


@pytest.mark.parametrize("world,strategy,over", [
    (1, "none", {}),
    (1, "none", dict(tuning__lora__target_modules="o_proj,embed_tokens,lm_head",
                     tuning__lora__ensure_weight_tying="true")),
    (2, "zero3", {})], ids=["mts", "lora_tie", "mts_zero3"])
def test_measure_equals_plan(tmp_path, world, strategy, over):
    """ft-train --measure with the tokens added (the grown embedding trained in full, or
    LoRA on it and the head under ensure_weight_tying): the memory plan's bytes equal the
    allocator's in every category on every rank (test_memcheck.py's check)."""
    from test_memcheck import assert_exact

    model = mm_tok_dir(tmp_path)
    ids, labels = batch(V, 5)
    data = write_data(tmp_path / "train.jsonl", ids, labels)
    cfg = config(tmp_path, "measure", model, data, train__max_steps=2, dist__strategy=strategy,
                 **over)
    out = rankrun.run(cfg, world, "--measure")
    assert f"vocabulary {V} -> {V + 2}" in out.stderr, out.stderr[-2000:]
    assert_exact(out.stdout, world)
