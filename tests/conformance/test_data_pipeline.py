"""Data pipeline: ids and labels from ftkit's dataset loader (lib/data/data.c, through
`ft-data load`) against a Python reference that follows data.h's rules with transformers:

  prompt_completion  ids = tok(prompt + completion).input_ids + [eos] (unless already
                     last); labels -100 on the first len(tok(prompt).input_ids) tokens, as
                     TRL's SFTTrainer completion-only loss makes them.
  text               ids = tok(text).input_ids + [eos] (unless already last); all counted.
  chat               ids = tok(apply_chat_template(messages, tokenize=False),
                     add_special_tokens=False); assistant turn k counts
                     [len(ids(render(messages[:k], add_generation_prompt=True))),
                      len(ids(render(messages[:k+1])))).
Every sample is truncated to max_seq_len; samples left with no counted label (at position
>= 1) are dropped.

The tokenizer is a tiny byte-level BPE trained offline with `tokenizers`, with the Qwen /
Llama 3 special tokens added so the templates tokenize as they do for the real models.

Run:  FT_DATA=$PWD/build/tests/ft-data .venv/bin/python -m pytest -q \
          tests/conformance/test_data_pipeline.py
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
FT_DATA = os.environ.get("FT_DATA")
pytestmark = pytest.mark.skipif(not FT_DATA, reason="FT_DATA (the ft-data harness) not set")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
            "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

CORPUS = [
    "Hello, who are you? I am a small model trained for tests.",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "Ünïcödé ✓ 日本語 🙂 Réponse: «ok» and more text to merge.",
    "user assistant system You are a helpful assistant.",
] * 20

# (family, template fixture, bos, eos, prepend bos in the post-processor)
FAMILIES = {
    "qwen": ("qwen2.5.jinja", None, "<|im_end|>", False),
    "llama3": ("llama3.1.jinja", "<|begin_of_text|>", "<|eot_id|>", True),
}


def _build(family, root):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    fixture, bos, eos, add_bos = FAMILIES[family]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(CORPUS, trainer)
    if add_bos:
        tk.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tk.token_to_id(bos))])
    else:
        tk.post_processor = processors.ByteLevel(trim_offsets=False)
    # model_max_length left unset: transformers then writes 1e30 as an integer literal into
    # tokenizer_config.json, which the C tokenizer must read.
    kw = {"eos_token": eos}
    if bos:
        kw["bos_token"] = bos
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, **kw)
    hf.chat_template = (HERE / "templates" / fixture).read_text()
    d = root / family
    hf.save_pretrained(d)
    return hf, d


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    root = tmp_path_factory.mktemp("data_tok")
    return {f: _build(f, root) for f in FAMILIES}


def _counted(labels):
    return any(x != -100 for x in labels[1:])


def _finish(samples, max_len):
    out = []
    for ids, labels in samples:
        ids, labels = ids[:max_len] if max_len else ids, labels[:max_len] if max_len else labels
        if _counted(labels):
            out.append((ids, labels))
    return out


def _ref_pc(hf, prompt, completion, train_on_all):
    ids = hf(prompt + completion).input_ids
    if not ids or ids[-1] != hf.eos_token_id:
        ids = ids + [hf.eos_token_id]
    labels = list(ids)
    if not train_on_all:
        n = len(hf(prompt).input_ids)
        labels[:n] = [-100] * min(n, len(labels))
    return ids, labels


def _ref_chat(hf, msgs, train_on_all):
    def enc(k, agp):
        text = hf.apply_chat_template(msgs[:k], tokenize=False, add_generation_prompt=agp)
        return hf(text, add_special_tokens=False).input_ids

    ids = enc(len(msgs), False)
    if train_on_all:
        return ids, list(ids)
    labels = [-100] * len(ids)
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        a, b = enc(k, True), enc(k + 1, False)
        assert ids[:len(a)] == a and ids[:len(b)] == b
        labels[len(a):len(b)] = ids[len(a):len(b)]
    return ids, labels


def _ours(d, data_path, *args):
    out = subprocess.run([FT_DATA, "load", str(d), str(data_path), *args],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [(r["input_ids"], r["labels"]) for r in map(json.loads, out.stdout.splitlines())]


PC = [
    {"prompt": "Hello, who are you?", "completion": " I am a small model."},
    {"prompt": "Ünïcödé ✓ ", "completion": "日本語 🙂"},
    {"prompt": "", "completion": "The quick brown fox"},
    {"prompt": "fox", "completion": "<|im_end|>"},
]

CHATS = [
    [{"role": "user", "content": "Hello, who are you?"},
     {"role": "assistant", "content": "I am a small model."}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Ünïcödé ✓"},
     {"role": "assistant", "content": "ok 🙂"},
     {"role": "user", "content": "more"},
     {"role": "assistant", "content": "The quick brown fox jumps over the lazy dog."}],
]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("train_on_all", [False, True])
@pytest.mark.parametrize("max_len", [0, 12])
def test_prompt_completion(toks, tmp_path, family, train_on_all, max_len):
    hf, d = toks[family]
    p = tmp_path / "pc.jsonl"
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in PC))
    args = (["--train-on-all"] if train_on_all else []) + \
        (["--max-seq-len", str(max_len)] if max_len else [])
    want = _finish([_ref_pc(hf, r["prompt"], r["completion"], train_on_all) for r in PC],
                   max_len)
    assert want and _ours(d, p, *args) == want


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("train_on_all", [False, True])
def test_chat(toks, tmp_path, family, train_on_all):
    hf, d = toks[family]
    p = tmp_path / "chat.jsonl"
    p.write_text("".join(json.dumps({"messages": m}, ensure_ascii=False) + "\n"
                         for m in CHATS))
    args = ["--train-on-all"] if train_on_all else []
    want = _finish([_ref_chat(hf, m, train_on_all) for m in CHATS], 0)
    got = _ours(d, p, *args)
    assert len(want) == len(CHATS) and got == want


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_text(toks, tmp_path, family):
    hf, d = toks[family]
    texts = ["Hello, who are you?", "Ünïcödé ✓ 日本語 🙂", "ends with eos<|im_end|>"]
    p = tmp_path / "text.jsonl"
    p.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts))
    want = []
    for t in texts:
        ids = hf(t).input_ids
        if ids[-1] != hf.eos_token_id:
            ids = ids + [hf.eos_token_id]
        want.append((ids, list(ids)))
    assert _ours(d, p) == want


FT_TRAIN = os.environ.get("FT_TRAIN")


ROW = 256


def _dump(tmp_path, d, records, *settings):
    """ft-train --dump-data - with the records piped in on stdin (data.train_path: -)."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"model:\n  name: {d}\n  max_seq_len: {ROW}\n"
                   "train:\n  batch_size: 2\ndata:\n  train_path: \"-\"\n  shuffle: false\n")
    args = [FT_TRAIN, "--config", str(cfg), "--dump-data", "-"]
    for s in settings:
        args += ["--set", s]
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    out = subprocess.run(args, input=data, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.mark.skipif(not FT_TRAIN, reason="FT_TRAIN (bin/ft-train) not set")
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_dump_data_padded(toks, tmp_path, family):
    """Rows as the model sees them: batches of 2 right-padded with pad (= eos here) and
    labels -100, in file order when shuffling is off."""
    hf, d = toks[family]
    want = _finish([_ref_pc(hf, r["prompt"], r["completion"], False) for r in PC], ROW)
    rows = _dump(tmp_path, d, PC)
    assert len(rows) == len(want)
    for b in range(0, len(want), 2):
        width = max(len(ids) for ids, _ in want[b:b + 2])
        for (ids, labels), row in zip(want[b:b + 2], rows[b:b + 2]):
            pad = width - len(ids)
            assert row["input_ids"] == ids + [hf.eos_token_id] * pad
            assert row["labels"] == labels + [-100] * pad
            assert "position_ids" not in row


@pytest.mark.skipif(not FT_TRAIN, reason="FT_TRAIN (bin/ft-train) not set")
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_dump_data_packed(toks, tmp_path, family):
    """Packed rows: samples laid end to end, positions restarting at 0 for each sample, the
    first label of each sample -100 (DataCollatorWithFlattening), no sample split."""
    hf, d = toks[family]
    chats = [{"messages": m} for m in CHATS] * 3
    want = _finish([_ref_chat(hf, m["messages"], False) for m in chats], ROW)
    rows = _dump(tmp_path, d, chats, "data.packing=true", "data.format=chat")
    got_ids, got_labels = [], []
    for row in rows:
        assert len(row["input_ids"]) == ROW and len(row["labels"]) == ROW
        starts = [i for i, p in enumerate(row["position_ids"]) if p == 0]
        for a, b in zip(starts, starts[1:] + [ROW]):
            assert row["position_ids"][a:b] == list(range(b - a))
            got_ids.append(row["input_ids"][a:b])
            got_labels.append(row["labels"][a:b])
    samples = [(i, l) for i, l in zip(got_ids, got_labels) if any(x != -100 for x in l)]
    assert len(samples) == len(want)
    for (ids, labels), (gi, gl) in zip(want, samples):
        assert gi == ids and gl == [-100] + labels[1:]


def _alpaca_prompt(instruction, inp):
    """The Stanford Alpaca prompt format."""
    if inp:
        return ("Below is an instruction that describes a task, paired with an input that "
                "provides further context. Write a response that appropriately completes the "
                f"request.\n\n### Instruction:\n{instruction}\n\n### Input:\n{inp}\n\n"
                "### Response:\n")
    return ("Below is an instruction that describes a task. Write a response that "
            f"appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n"
            "### Response:\n")


ALPACA = [
    {"instruction": "Say hello.", "input": "", "output": "Hello, who are you?"},
    {"instruction": "Translate", "input": "Ünïcödé ✓", "output": "日本語 🙂"},
    {"instruction": "Count", "output": "0123456789"},
]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("train_on_all", [False, True])
def test_alpaca(toks, tmp_path, family, train_on_all):
    hf, d = toks[family]
    p = tmp_path / "alpaca.jsonl"
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ALPACA))
    want = _finish([_ref_pc(hf, _alpaca_prompt(r["instruction"], r.get("input", "")),
                            r["output"], train_on_all) for r in ALPACA], 0)
    args = ["--train-on-all"] if train_on_all else []
    assert len(want) == len(ALPACA) and _ours(d, p, *args) == want


def test_tokens_format_needs_no_tokenizer(tmp_path):
    """Pre-tokenized records pass through as given (labels default to the ids), with no
    tokenizer in the directory at all."""
    recs = [{"input_ids": [5, 6, 7]}, {"input_ids": [1, 2, 3, 4], "labels": [-100, -100, 3, 4]}]
    p = tmp_path / "tokens.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    empty = tmp_path / "no_tokenizer"
    empty.mkdir()
    got = _ours(empty, p, "--format", "tokens")
    assert got == [([5, 6, 7], [5, 6, 7]), ([1, 2, 3, 4], [-100, -100, 3, 4])]
