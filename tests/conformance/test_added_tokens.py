"""Tokens added by ft-train (run config model.add_special_tokens), as a TRL / PEFT user adds
them: tokenizer.add_special_tokens({"additional_special_tokens": [...]}), then
model.resize_token_embeddings(len(tokenizer)) (mean_resizing: new rows = the mean of the
old ones), then get_peft_model with the embedding and the head trained in full
(modules_to_save; PEFT's save_embedding_layers for a resized vocabulary).

- the tokenizer: ours encodes text with the added tokens as transformers' does (each one
  whole), a token already in the vocabulary keeps its id, and the saved tokenizer files
  load in AutoTokenizer with the same vocabulary;
- the new rows start at the mean of the old rows: exactly ours; transformers' draw from
  N(mean, 1e-9 cov) (where cov is positive definite) is within 1e-3 of the old rows'
  standard deviation of it (its noise is sqrt(1e-9) = 3.2e-5 of it per element);
- llama, a tied llama, qwen2 and gemma (tied): our run's starting adapter (learning rate
  0) gives PEFT's gradients (1e-4) on the resized base; five AdamW steps of ft-train equal
  torch's on that PEFT model (losses and every tensor, 1e-5); the saved adapter loads with
  AutoTokenizer + resize_token_embeddings(len(tok)) + PeftModel.from_pretrained with no
  missing or unexpected keys, to our logits (1e-5); ft-merge of it loads in transformers
  with the new vocab_size to PEFT's logits; ft-eval reads it to PEFT's loss;
- full fine-tuning: the final model dir has the grown vocab_size, the tokenizer files and
  five AdamW steps of torch's weights;
- resuming a run with added tokens gives the uninterrupted run's adapter; training from
  such an adapter (init_adapter) works with the same tokens added or its tokenizer;
- every dist.strategy on 2 ranks equals one process;
- bad values of the key are refused naming it."""

import json
import math
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ftref
import rankrun

ADD = ["<|im_start|>", "<|im_end|>"]
ADD_YAML = json.dumps(ADD)
B, T = 2, 12
TRAIN = dict(steps=5, lr=1e-2, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01,
             warmup_steps=2, scheduler="cosine", max_grad_norm=1.0)
FAMILIES = ["llama", "tied", "qwen2", "gemma"]


def write_tokenizer(model_dir, V):
    """A tokenizer of exactly V tokens (single characters, whitespace split)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = "abcdefghijklmnopqrstuvwxyz.,"
    chars += "".join(chr(0x4E00 + i) for i in range(V - len(chars)))
    tk = Tokenizer(models.BPE({c: i for i, c in enumerate(chars)}, []))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=".",
                            pad_token=",").save_pretrained(model_dir)


def family_dir(store, d, family):
    if family in ("llama", "tied"):
        m = rankrun.make_model(d, family, tied=family == "tied")
    else:
        m = ftref.copy_model_dir(store.model(family), d / family)
    V = json.loads((m / "config.json").read_text())["vocab_size"]
    write_tokenizer(m, V)
    return m, V


def batch(V, seed):
    """B rows of T tokens using the two new ids as inputs and labels (HF labels)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=g)
    ids[0, 1], ids[0, 6], ids[1, 2], ids[1, 9] = V, V + 1, V + 1, V
    labels = ids.clone()
    labels[:, :2] = -100
    labels[1, 5] = V  # a new token as a label only
    return ids, labels


def write_data(path, ids, labels):
    path.write_text("".join(json.dumps({"input_ids": i.tolist(), "labels": l.tolist()}) + "\n"
                            for i, l in zip(ids, labels)))
    return path


def config(d, name, model_dir, data, mode="lora", **over):
    cfg = {
        "model.name": str(model_dir), "model.max_seq_len": T,
        "model.add_special_tokens": ADD_YAML,
        "tuning.mode": mode, "tuning.lora.r": 4, "tuning.lora.alpha": 8,
        "tuning.lora.dropout": 0.0, "tuning.lora.target_modules": "o_proj,down_proj",
        "train.batch_size": B, "train.grad_accum": 1, "train.max_steps": TRAIN["steps"],
        "train.learning_rate": TRAIN["lr"], "train.warmup_steps": TRAIN["warmup_steps"],
        "train.lr_scheduler": TRAIN["scheduler"], "train.weight_decay": TRAIN["weight_decay"],
        "train.max_grad_norm": TRAIN["max_grad_norm"], "train.logging_steps": 1,
        "train.save_steps": 1000, "train.output_dir": str(d / "runs" / name),
        "data.train_path": str(data), "data.format": "tokens", "data.shuffle": "false",
    }
    cfg.update({k.replace("__", "."): v for k, v in over.items()})
    return rankrun.write_config(d, name, cfg)


def losses(run_dir):
    rows = [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r and "step" in r]


def adapter_tensors(run_dir, sub="final"):
    return load_file(str(Path(run_dir) / sub / "adapter_model.safetensors"))


def file_key_to_ours(k):
    return k if ".lora_" in k else k.removeprefix("base_model.model.")


def resized_base(model_dir, V_new, rows=None):
    """transformers' base resized to V_new (mean_resizing), the new rows set to rows
    ({"embed": t, "head": t}) when given."""
    base = ftref.load_hf(model_dir)
    torch.manual_seed(5)
    base.resize_token_embeddings(V_new)
    if rows:
        with torch.no_grad():
            V = rows["V"]
            base.get_input_embeddings().weight[V:] = rows["embed"][V:]
            if "head" in rows and not base.config.tie_word_embeddings:
                base.get_output_embeddings().weight[V:] = rows["head"][V:]
    return base


def no_key_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    bad = [str(w.message) for w in caught
           if "missing" in str(w.message).lower() or "unexpected" in str(w.message).lower()]
    assert not bad, bad
    return out


# ---- the tokenizer ------------------------------------------------------------------


def test_tokenizer_matches_transformers(tmp_path):
    """ft-train's saved tokenizer (tokens added to a tokenizer that has an added eos, a
    token of the vocabulary among them) = transformers' after add_special_tokens: the
    same ids, the vocabulary grows by the new tokens only, and our tokenizer encodes text
    with them to transformers' ids (the C tokenizer reading the saved files)."""
    from transformers import AutoTokenizer

    model_dir, V = family_dir(None, tmp_path, "llama")
    toks = ADD + ["a", "."]  # "a" is in the vocabulary, "." an added token already
    rows = ["<|im_start|>abc d<|im_end|>", "x<|im_end|><|im_start|>y. a"] * 4
    data = tmp_path / "text.jsonl"
    data.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    cfg = config(tmp_path, "tok", model_dir, data, model__add_special_tokens=json.dumps(toks),
                 data__format="text", train__max_steps=1, model__max_seq_len=32)
    out = rankrun.run(cfg)
    assert "vocabulary 64 -> 66" in out.stderr, out.stderr[-2000:]
    final = tmp_path / "runs" / "tok" / "final"
    ours = AutoTokenizer.from_pretrained(str(final))
    ref = AutoTokenizer.from_pretrained(str(model_dir))
    assert ref.add_special_tokens({"additional_special_tokens": toks}) == 3
    assert len(ours) == len(ref) == V + 2
    assert ours.get_vocab() == ref.get_vocab()
    assert ref.convert_tokens_to_ids(toks) == [V, V + 1, 0, ref.convert_tokens_to_ids(".")]
    saved = json.loads((final / "tokenizer.json").read_text())["added_tokens"]
    assert [t["id"] for t in saved] == sorted(t["id"] for t in saved)
    assert {t["content"] for t in saved if t["special"]} >= set(toks)
    # the C tokenizer: on the saved files, and adding the tokens itself on load
    import os
    import subprocess
    exe = ftref.tool_exe("FT_TOKENIZE", "ft-tokenize")
    texts = rows[:2] + ["<|im_start|><|im_start|>ab", "no tokens here", "a<|im_end|>."]
    want = [ref(r, add_special_tokens=False).input_ids for r in texts]
    assert sum(i >= V for ids in want for i in ids) >= 6
    stdin = "".join(json.dumps(r) + "\n" for r in texts)
    for path, add in ((final, ""), (model_dir, json.dumps(toks))):
        p = subprocess.run([exe, "encode", str(path), "--no-special"], input=stdin,
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, FT_TOKENIZE_ADD=add))
        assert p.returncode == 0, p.stderr
        assert [json.loads(l) for l in p.stdout.splitlines()] == want, (path, p.stdout)


# ---- LoRA against PEFT, per family ------------------------------------------------------


class Case:
    pass


@pytest.fixture(scope="module", params=FAMILIES)
def case(request, store, tmp_path_factory):
    """One family: its model with a tokenizer, the batch, our starting adapter (a run at
    learning rate 0) and our five-step run."""
    c = Case()
    c.family = request.param
    c.d = tmp_path_factory.mktemp(f"at_{c.family}")
    c.model, c.V = family_dir(store, c.d, c.family)
    c.tied = json.loads((c.model / "config.json").read_text()).get("tie_word_embeddings",
                                                                    False)
    c.ids, c.labels = batch(c.V, 11 + len(c.family))
    c.data = write_data(c.d / "train.jsonl", c.ids, c.labels)
    c.init = c.d / "runs" / "init"
    out = rankrun.run(config(c.d, "init", c.model, c.data, train__learning_rate=0,
                             train__max_steps=1))
    assert f"vocabulary {c.V} -> {c.V + 2}" in out.stderr, out.stderr[-3000:]
    mts = "embed_tokens" if c.tied else "embed_tokens, lm_head"
    assert f"modules_to_save: {mts}" in out.stderr, out.stderr[-3000:]
    c.run = c.d / "runs" / "five"
    rankrun.run(config(c.d, "five", c.model, c.data))
    c.start = adapter_tensors(c.init)
    emb = c.start["base_model.model.model.embed_tokens.weight"]
    rows = {"V": c.V, "embed": emb}
    if not c.tied:
        rows["head"] = c.start["base_model.model.lm_head.weight"]
    c.rows = rows
    return c


def peft_from(c, adapter, trainable=False):
    from peft import PeftModel

    m = PeftModel.from_pretrained(resized_base(c.model, c.V + 2, c.rows), str(adapter),
                                  is_trainable=trainable)
    m.eval()
    return m


def test_new_rows_are_the_mean(case):
    """The starting embedding (and untied head) hold the checkpoint's rows and, for the
    new tokens, their mean; transformers' mean_resizing rows are within its noise of it."""
    from safetensors.torch import load_file as lf

    base = ftref.load_hf(case.model)
    hf = resized_base(case.model, case.V + 2)
    pairs = [("model.embed_tokens.weight", base.get_input_embeddings().weight,
              hf.get_input_embeddings().weight)]
    if not case.tied:
        pairs.append(("lm_head.weight", base.get_output_embeddings().weight,
                      hf.get_output_embeddings().weight))
    for name, old, resized in pairs:
        ours = case.start["base_model.model." + name]
        assert ours.shape == (case.V + 2, old.shape[1])
        assert torch.equal(ours[:case.V], old.detach())
        mean = old.detach().double().mean(0).float()
        ftref.assert_close(f"{name} new rows", ours[case.V:], mean.expand(2, -1), 1e-6)
        std = old.detach().std().item()
        worst = (resized[case.V:].detach() - ours[case.V:]).abs().max().item()
        assert worst <= 1e-3 * std, (name, worst, std)
    del lf


def test_grads_against_peft(case, ft):
    """Our starting adapter on the grown vocabulary: logits, loss (1e-5) and every
    trainable tensor's gradient (1e-4) = PEFT's on the resized base."""
    ref = peft_from(case, case.init / "final", trainable=True)
    logits, loss, grads = ftref.hf_grads(ref, case.ids, case.labels, key=ftref.ours_key)
    assert "model.embed_tokens.weight" in grads
    assert ("lm_head.weight" in grads) == (not case.tied)
    out = ft(dict(model_dir=case.model, adapter_dir=case.init / "final", mode="lora",
                  input_ids=case.ids, labels=case.labels), f"at-grad-{case.family}")
    ftref.assert_close("logits", out["logits"], logits, ftref.TOL_LOGITS)
    ftref.assert_close("loss", out["loss"], loss, ftref.TOL_LOGITS)
    ftref.assert_tensor_dict_close("grad.", out, grads, ftref.TOL_GRAD)


def test_five_steps_against_peft(case):
    """ft-train's five AdamW steps (warmup, cosine, clipping, weight decay) = torch's on
    PEFT's model from our starting adapter: the losses and every saved tensor (1e-5)."""
    ref = ftref.reference_train(peft_from(case, case.init / "final", trainable=True),
                                case.ids, case.labels, TRAIN, key=ftref.ours_key)
    ftref.assert_close("losses", torch.tensor(losses(case.run), dtype=torch.float64),
                       ref["losses"], ftref.TOL_LOSSES)
    ours = {file_key_to_ours(k): v for k, v in adapter_tensors(case.run).items()}
    if case.tied:  # (the head's key holds the one embedding again, as PEFT saves it)
        assert torch.equal(ours.pop("lm_head.weight"), ours["model.embed_tokens.weight"])
    assert set(ours) == set(ref["weights"]), sorted(set(ours) ^ set(ref["weights"]))
    for k, w in ref["weights"].items():
        ftref.assert_close(f"weight {k}", ours[k], w, ftref.TOL_WEIGHT)


def test_saved_adapter_loads_in_peft_merges_and_evaluates(case, ft, tmp_path):
    """The recipe: AutoTokenizer on the adapter dir, resize_token_embeddings(len(tok)),
    PeftModel.from_pretrained: no missing / unexpected keys, our logits; ft-merge's
    checkpoint loads in transformers with the new vocab_size to PEFT's logits and its
    tokenizer; ft-eval reads the adapter (and its tokenizer) to PEFT's loss."""
    import subprocess

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = case.run / "final"
    tok = AutoTokenizer.from_pretrained(str(final))
    assert len(tok) == case.V + 2 and tok.convert_tokens_to_ids(ADD) == [case.V, case.V + 1]
    base = ftref.load_hf(case.model)
    base.resize_token_embeddings(len(tok))
    pm = no_key_warnings(lambda: PeftModel.from_pretrained(base, str(final)))
    pm.eval()
    want, _ = ftref.hf_forward(pm, case.ids)
    out = ft(dict(model_dir=case.model, adapter_dir=final, mode="lora", input_ids=case.ids),
             f"at-saved-{case.family}")
    ftref.assert_close("saved adapter logits", out["logits"], want, ftref.TOL_LOGITS)

    merged = tmp_path / "merged"
    ftref.run_tool([ftref.tool_exe("FT_MERGE", "ft-merge"), "--model", case.model,
                    "--adapter", final, "--out", merged, "--dtype", "f32"])
    assert json.loads((merged / "config.json").read_text())["vocab_size"] == case.V + 2
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (merged / name).read_text() == (final / name).read_text(), name
    mtok = AutoTokenizer.from_pretrained(str(merged))
    assert mtok.convert_tokens_to_ids(ADD) == [case.V, case.V + 1]
    m, info = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32,
                                                   attn_implementation="eager",
                                                   output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    m.eval()
    ftref.assert_close("merged logits", ftref.hf_forward(m, case.ids)[0], want,
                       ftref.TOL_LOGITS)

    # ft-eval on text using the tokens, with the adapter dir's tokenizer
    text = "<|im_start|>abc de<|im_end|>fg"
    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"text": text}) + "\n")
    p = subprocess.run([ftref.tool_exe("FT_EVAL", "ft-eval"), "--model", str(case.model),
                        "--adapter", str(final), "--data", str(data), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    ids = tok(text).input_ids + [tok.eos_token_id]
    assert case.V in ids and case.V + 1 in ids
    _, loss = ftref.hf_forward(pm, torch.tensor([ids]), torch.tensor([ids]))
    assert got["tokens"] == len(ids) - 1, got
    ftref.assert_close("ft-eval loss", torch.tensor([got["loss"]]), loss.reshape(1).double(),
                       ftref.TOL_LOGITS)
