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
import os
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
    assert f"vocabulary {c.V} -> {c.V + 2} (model.add_special_tokens; new rows: the mean of " \
        "the old rows, as resize_token_embeddings(len(tokenizer)))" in out.stderr, \
        out.stderr[-3000:]
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


# ---- full fine-tuning, resuming, training from such an adapter -------------------------


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    c = Case()
    c.d = tmp_path_factory.mktemp("at_llama")
    c.model, c.V = family_dir(None, c.d, "llama")
    c.ids, c.labels = batch(c.V, 3)
    c.data = write_data(c.d / "train.jsonl", c.ids, c.labels)
    return c


def test_full_fine_tuning(llama):
    """tuning.mode full: five AdamW steps = torch's on transformers' resized model (the new
    rows set to the mean, weight decay 0: ours and torch's treat norms alike then); the
    final dir loads in transformers (vocab_size grown, no missing or unexpected keys)
    with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    c = llama
    # (lr 1e-3 for full fine-tuning, as test_train.py: at 1e-2 AdamW's normalised steps
    # turn rounding-level gradient differences of near-zero entries into 1e-5 weight ones)
    train = dict(TRAIN, weight_decay=0, lr=1e-3)
    rankrun.run(config(c.d, "full", c.model, c.data, mode="full", train__weight_decay=0,
                       train__learning_rate=train["lr"]))
    final = c.d / "runs" / "full" / "final"
    assert json.loads((final / "config.json").read_text())["vocab_size"] == c.V + 2
    tok = AutoTokenizer.from_pretrained(str(final))
    assert len(tok) == c.V + 2 and tok.convert_tokens_to_ids(ADD) == [c.V, c.V + 1]
    old = ftref.load_hf(c.model)
    rows = {"V": c.V,
            "embed": torch.cat([old.get_input_embeddings().weight.detach(),
                                old.get_input_embeddings().weight.detach().double().mean(0)
                                .float().expand(2, -1)]),
            "head": torch.cat([old.lm_head.weight.detach(),
                               old.lm_head.weight.detach().double().mean(0).float()
                               .expand(2, -1)])}
    ref = ftref.reference_train(resized_base(c.model, c.V + 2, rows), c.ids, c.labels,
                                train)
    ftref.assert_close("losses", torch.tensor(losses(c.d / "runs" / "full"),
                                              dtype=torch.float64), ref["losses"],
                       ftref.TOL_LOSSES)
    ours = load_file(str(final / "model.safetensors"))
    assert set(ours) == set(ref["weights"]), sorted(set(ours) ^ set(ref["weights"]))
    for k, w in ref["weights"].items():
        ftref.assert_close(f"weight {k}", ours[k], w, ftref.TOL_WEIGHT)
    m, info = AutoModelForCausalLM.from_pretrained(str(final), dtype=torch.float32,
                                                   output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert m.get_input_embeddings().weight.shape[0] == c.V + 2


def test_resume(llama):
    """A run with added tokens resumed from its checkpoint (which holds the tokenizer
    too) ends with the uninterrupted run's adapter, bit for bit."""
    c = llama
    over = dict(train__save_steps=2)
    rankrun.run(config(c.d, "whole", c.model, c.data, **over))
    part = c.d / "runs" / "part"
    part.mkdir(parents=True)
    shutil.copytree(c.d / "runs" / "whole" / "checkpoint-2", part / "checkpoint-2")
    assert (part / "checkpoint-2" / "tokenizer.json").exists()
    out = rankrun.run(config(c.d, "part", c.model, c.data, **over), 1, "--resume", "auto")
    assert "resumed from" in out.stderr
    a = adapter_tensors(c.d / "runs" / "whole")
    b = adapter_tensors(part)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("how", ["tokens", "tokenizer"])
def test_init_adapter_with_grown_vocabulary(llama, how):
    """Training from an adapter made with the tokens added (ours): with the same tokens
    added, or with the adapter dir as model.tokenizer (its grown tokenizer), the model
    takes its vocabulary and the run starts from its weights (a run at learning rate 0
    saves them unchanged); without either it is refused naming both vocabularies."""
    c = llama
    start = c.d / "runs" / "start"
    if not start.exists():
        rankrun.run(config(c.d, "start", c.model, c.data, train__max_steps=2))
    over = dict(tuning__lora__init_adapter=str(start / "final"),
                tuning__lora__modules_to_save="embed_tokens,lm_head",
                train__learning_rate=0, train__max_steps=1)
    if how == "tokenizer":
        over.update(model__add_special_tokens="[]", model__tokenizer=str(start / "final"))
    name = f"from_{how}"
    out = rankrun.run(config(c.d, name, c.model, c.data, **over))
    assert f"-> {c.V + 2}" in out.stderr, out.stderr[-2000:]
    a, b = adapter_tensors(start), adapter_tensors(c.d / "runs" / name)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if how == "tokens":
        bad = config(c.d, "from_none", c.model, c.data, **dict(over, model__add_special_tokens="[]"))
        out = rankrun.run(bad, check=False)
        assert out.returncode != 0
        assert "init_adapter" in out.stderr and str(c.V) in out.stderr and \
            str(c.V + 2) in out.stderr and "add_special_tokens" in out.stderr, out.stderr[-2000:]


# ---- bad values -------------------------------------------------------------------------


@pytest.mark.parametrize("value,why", [('["<a>", 3]', "non-empty string"),
                                       ('["<a>", ""]', "non-empty string"),
                                       ('"<a>"', "list"),
                                       ('{"a": "<a>"}', "list")])
def test_bad_values_refused(llama, value, why):
    c = llama
    cfg = config(c.d, "bad", c.model, c.data)
    text = cfg.read_text().replace(f"add_special_tokens: {ADD_YAML}",
                                   f"add_special_tokens: {value}")
    assert text != cfg.read_text()
    cfg.write_text(text)
    out = rankrun.run(cfg, check=False)
    assert out.returncode != 0
    assert "model.add_special_tokens" in out.stderr and why in out.stderr, out.stderr[-2000:]
    # the same through --set
    out = rankrun.run(config(c.d, "bad2", c.model, c.data), 1, "--set",
                      f"model.add_special_tokens={value}", check=False)
    assert out.returncode != 0 and "model.add_special_tokens" in out.stderr, out.stderr


def test_tokens_fit_in_the_vocabulary(llama, tmp_path):
    """Tokens the model's vocabulary already has room for (config.json's vocab_size above
    the tokenizer's): no resize, the new ids index the existing rows, which train."""
    c = llama
    m = ftref.copy_model_dir(c.model, tmp_path / "m")
    n = c.V - 4
    write_tokenizer(m, n)  # the tokenizer is 4 short of the model: ids n, n+1 are new
    ids, labels = batch(n, 5)
    data = write_data(tmp_path / "train.jsonl", ids, labels)
    out = rankrun.run(config(tmp_path, "fit", m, data, train__weight_decay=0))
    assert "which the model's vocabulary holds" in out.stderr, out.stderr[-2000:]
    w = adapter_tensors(tmp_path / "runs" / "fit")
    emb = w["base_model.model.model.embed_tokens.weight"]
    assert emb.shape[0] == c.V
    old = ftref.load_hf(m).get_input_embeddings().weight.detach()
    assert not torch.equal(emb[n:n + 2], old[n:n + 2])  # trained
    assert torch.equal(emb[n + 2:], old[n + 2:])  # (no token uses them: no gradient)


# ---- every strategy on two ranks ---------------------------------------------------------


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "fsdp",
                                      "model_parallel"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_strategies_equal_one_process(tmp_path_factory, strategy, tied):
    """Tokens added under every dist.strategy on two ranks = one process (data parallel:
    batch 8 on one rank against 4 per rank; model parallel: the same batch)."""
    import test_dist_train as dt

    d = tmp_path_factory.getbasetemp() / f"at_dist_{'tied' if tied else 'untied'}"
    if not d.exists():
        d.mkdir()
        family_dir(None, d, "tied" if tied else "llama")
        g = torch.Generator().manual_seed(9)
        rows = []
        for _ in range(32):
            ids = torch.randint(1, 66, (10,), generator=g).tolist()
            rows.append({"input_ids": ids, "labels": [-100] * 3 + ids[3:]})
        (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = d / ("tied" if tied else "llama")
    run = strategy_equals_one_process(d, model, strategy)
    w = dt.weights(run)
    assert w["base_model.model.model.embed_tokens.weight"].shape[0] == 66
    assert (run / "final" / "tokenizer.json").exists()


def strategy_equals_one_process(d, model, strategy):
    """Four steps of ft-train adding the tokens, on d/train.jsonl, under strategy on 2 ranks
    against one process (batch 8 = 2 x 4; model_parallel: 4, its ranks share the batch;
    the reference run kept in d for the next strategy); returns the 2-rank run's dir."""
    import test_dist_train as dt

    dp = strategy != "model_parallel"
    common = dict(train__max_steps=4, train__warmup_steps=1, train__max_grad_norm=0,
                  train__weight_decay=0, train__lr_scheduler="cosine")
    ref = d / "runs" / f"ref_{'dp' if dp else 'mp'}"
    if not ref.exists():
        rankrun.run(config(d, ref.name, model, d / "train.jsonl", model__max_seq_len=16,
                           train__batch_size=8 if dp else 4, **common))
    name = f"np2_{strategy}"
    rankrun.run(config(d, name, model, d / "train.jsonl", model__max_seq_len=16,
                       train__batch_size=4, dist__strategy=strategy, **common), 2)
    dt.assert_same_run(ref, d / "runs" / name, w_atol=5e-4)
    return d / "runs" / name


def test_dpo(llama, tmp_path):
    """DPO with tokens added: in full fine-tuning the reference (the frozen start) has the
    grown vocabulary too and the run trains; in LoRA modes (the new rows trained as
    modules_to_save, the reference their originals) it trains too, against TRL in
    test_dpo_tokens.py."""
    c = llama
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [
        {"prompt": "<|im_start|>abc d", "chosen": " ef<|im_end|>", "rejected": " gh"},
        {"prompt": "xy <|im_start|>", "chosen": " z<|im_end|>", "rejected": " w."}] * 2))
    over = dict(data__format="auto", train__objective="dpo", train__max_steps=2,
                model__max_seq_len=32)
    out = rankrun.run(config(tmp_path, "dpo_full", c.model, data, mode="full", **over))
    assert f"vocabulary {c.V} -> {c.V + 2}" in out.stderr, out.stderr[-2000:]
    final = tmp_path / "runs" / "dpo_full" / "final"
    assert json.loads((final / "config.json").read_text())["vocab_size"] == c.V + 2
    out = rankrun.run(config(tmp_path, "dpo_lora", c.model, data, **over))
    assert "modules_to_save: embed_tokens, lm_head" in out.stderr, out.stderr[-2000:]
    w = adapter_tensors(tmp_path / "runs" / "dpo_lora")
    assert w["base_model.model.model.embed_tokens.weight"].shape[0] == c.V + 2


# ---- the GPU (the emulated device: FT_EMU=1 with the emulated build's FT_TRAIN) -----------


@pytest.mark.skipif(not (os.environ.get("FT_EMU") == "1" or torch.cuda.is_available()),
                    reason="no CUDA GPU (and not the emulated device: FT_EMU unset)")
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", ["llama", "tied"])
def test_gpu_equals_cpu(tmp_path, family, bf16):
    """Tokens added on the GPU: the grown embedding and head (mean rows, uploaded) train
    as on the CPU: the losses and the saved adapter of five steps equal the CPU run's
    (fp32: 1e-5 relative per tensor; bf16: 8e-2 per tensor and 1e-2 for the losses, its
    8-bit mantissa), with the same keys and the grown tokenizer saved."""
    model, V = family_dir(None, tmp_path, family)
    ids, labels = batch(V, 21)
    data = write_data(tmp_path / "train.jsonl", ids, labels)
    env = {"FT_EMU_DEVICES": "1"} if os.environ.get("FT_EMU") == "1" else None
    rankrun.run(config(tmp_path, "cpu", model, data, train__device="cpu"))
    rankrun.run(config(tmp_path, "gpu", model, data, train__device="cuda",
                       train__bf16="true" if bf16 else "false"), env=env)
    # bf16: test_gpu_model.py's tolerances of the loss and of the gradients (the updates
    # are made of them)
    tol_w, tol_l = (8e-2, 1e-2) if bf16 else (1e-5, 1e-5)
    a, b = adapter_tensors(tmp_path / "runs" / "cpu"), adapter_tensors(tmp_path / "runs" / "gpu")
    assert a.keys() == b.keys()
    for k in a:
        ftref.assert_close(f"gpu {k}", b[k], a[k], tol_w)
    ftref.assert_close("gpu losses", torch.tensor(losses(tmp_path / "runs" / "gpu")),
                       torch.tensor(losses(tmp_path / "runs" / "cpu")), tol_l)
    assert b["base_model.model.model.embed_tokens.weight"].shape[0] == V + 2
    assert (tmp_path / "runs" / "gpu" / "final" / "tokenizer.json").exists()


def test_resize_to_multiple_of(llama, ft, tmp_path):
    """model.resize_to_multiple_of 8: the grown vocabulary (66) rounded up to 72 as
    resize_token_embeddings(len(tok), pad_to_multiple_of=8) does, the padding rows the
    mean too; the saved adapter loads that way in PEFT with no missing or unexpected keys
    to our logits. Without tokens added the key is refused."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    c = llama
    out = rankrun.run(config(tmp_path, "pad", c.model, c.data, model__resize_to_multiple_of=8))
    assert f"vocabulary {c.V} -> 72 (model.add_special_tokens; new rows: the mean of the old " \
        "rows, as resize_token_embeddings(len(tokenizer), pad_to_multiple_of))" in out.stderr, \
        out.stderr[-2000:]
    final = tmp_path / "runs" / "pad" / "final"
    w = adapter_tensors(tmp_path / "runs" / "pad")
    assert w["base_model.model.model.embed_tokens.weight"].shape[0] == 72
    assert w["base_model.model.lm_head.weight"].shape[0] == 72
    tok = AutoTokenizer.from_pretrained(str(final))
    assert len(tok) == c.V + 2
    base = ftref.load_hf(c.model)
    base.resize_token_embeddings(len(tok), pad_to_multiple_of=8)
    pm = no_key_warnings(lambda: PeftModel.from_pretrained(base, str(final)))
    pm.eval()
    ours = ft(dict(model_dir=c.model, adapter_dir=final, mode="lora", input_ids=c.ids),
              "at-pad")
    ftref.assert_close("padded adapter logits", ours["logits"], ftref.hf_forward(pm, c.ids)[0],
                       ftref.TOL_LOGITS)
    # the padding rows start at the mean (a run at learning rate 0)
    rankrun.run(config(tmp_path, "pad0", c.model, c.data, model__resize_to_multiple_of=8,
                       train__learning_rate=0, train__max_steps=1))
    e = adapter_tensors(tmp_path / "runs" / "pad0")["base_model.model.model.embed_tokens.weight"]
    mean = ftref.load_hf(c.model).get_input_embeddings().weight.detach().double().mean(0)
    ftref.assert_close("padding rows", e[c.V:], mean.float().expand(72 - c.V, -1), 1e-6)
    out = rankrun.run(config(tmp_path, "pad_bad", c.model, c.data, model__add_special_tokens="[]",
                             model__resize_to_multiple_of=8), check=False)
    assert out.returncode != 0 and "model.resize_to_multiple_of" in out.stderr, out.stderr


@pytest.mark.parametrize("targets,mts", [("o_proj,embed_tokens,lm_head", None),
                                         ("o_proj,embed_tokens", "lm_head"),
                                         ("o_proj", "lm_head")],
                         ids=["lora_both", "lora_embed", "head_only"])
def test_user_chosen_modules(llama, ft, tmp_path, targets, mts):
    """The user's choice over the default modules_to_save: LoRA on the grown embedding /
    head (their grown base saved as base_layer, as PEFT does), or modules_to_save naming
    only the head (the grown embedding saved in full, save_embedding_layers): the saved
    adapter loads by the recipe with no missing or unexpected keys to our logits."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    c = llama
    over = dict(tuning__lora__target_modules=targets)
    if mts:
        over["tuning__lora__modules_to_save"] = mts
    out = rankrun.run(config(tmp_path, "chosen", c.model, c.data, **over))
    assert "tokens: tuning.lora.modules_to_save" not in out.stderr, out.stderr[-2000:]
    final = tmp_path / "runs" / "chosen" / "final"
    w = adapter_tensors(tmp_path / "runs" / "chosen")
    rows = {k: v.shape[0] for k, v in w.items() if "lora_" not in k or "embedding_A" in k}
    assert rows and all(n == c.V + 2 for k, n in rows.items() if "embedding_A" not in k), rows
    base = ftref.load_hf(c.model)
    base.resize_token_embeddings(len(AutoTokenizer.from_pretrained(str(final))))
    pm = no_key_warnings(lambda: PeftModel.from_pretrained(base, str(final)))
    pm.eval()
    ours = ft(dict(model_dir=c.model, adapter_dir=final, mode="lora", input_ids=c.ids),
              f"at-chosen-{len(targets)}")
    ftref.assert_close("adapter logits", ours["logits"], ftref.hf_forward(pm, c.ids)[0],
                       ftref.TOL_LOGITS)
