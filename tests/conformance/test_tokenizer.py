"""Tokenizer conformance: ftkit's C tokenizer (lib/tokenizer/tokenizer.h, through the ft-tokenize
harness) against the Hugging Face `tokenizers` library, token for token.

Run:  FT_TOKENIZE=$PWD/build/tests/ft-tokenize .venv/bin/python -m pytest -q \
          tests/conformance/test_tokenizer.py

Tokenizers are trained offline, once per session, on a generated corpus (tokref.py) with
the exact component setups of GPT-2, Llama 3, Qwen2, Llama 2 / TinyLlama and Mistral.
"""

import json
import random
import unicodedata

import pytest
from tokenizers import Tokenizer

import tokref

NAMES = tokref.TOKENIZER_NAMES
MAX_REPORTED = 12


@pytest.fixture(scope="session")
def exe():
    path, why = tokref.ft_exe()
    if why:
        pytest.fail(why, pytrace=False)
    return path


@pytest.fixture(scope="session")
def corpora():
    """(training corpus, held-out test corpus)."""
    return tokref.corpus_lines(1, 3000), tokref.corpus_lines(2, 1200)


@pytest.fixture(scope="session")
def toks(tmp_path_factory, corpora):
    return tokref.Store(tmp_path_factory.mktemp("tokenizers"), corpora[0])


@pytest.fixture(scope="session")
def texts(corpora):
    """Everything encode is checked on: held-out edge cases, unseen corpus lines, a slice
    of the training corpus, the NFC and NFD forms of some lines, and whole paragraphs."""
    train, test = corpora
    out = list(tokref.HELD_OUT) + test + train[:300]
    out += [unicodedata.normalize("NFD", x) for x in test[:100]]
    out += [unicodedata.normalize("NFC", x) for x in test[:100]]
    out += ["\n".join(test[i:i + 8]) for i in range(0, 240, 8)]
    out += ["".join(test[i:i + 5]) for i in range(0, 100, 5)]
    return out


def _compare(hf, texts, want, got, what):
    bad = [(t, w, g) for t, w, g in zip(texts, want, got) if w != g]
    if bad:
        lines = [f"{what}: {len(bad)} of {len(texts)} inputs differ from tokenizers"]
        lines += [tokref.describe_mismatch(hf, t, w, g) for t, w, g in bad[:MAX_REPORTED]]
        pytest.fail("\n".join(lines), pytrace=False)


def _ft(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except tokref.FtError as e:
        why = str(e)
    pytest.fail(why, pytrace=False)


# ---------------------------------------------------------------------------------------
# encode


@pytest.mark.parametrize("special", [True, False], ids=["special", "no-special"])
@pytest.mark.parametrize("name", NAMES)
def test_encode_matches_tokenizers(exe, toks, texts, name, special):
    hf = toks.hf(name)
    want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=special)]
    got = _ft(tokref.ft_encode, exe, toks.dir(name), texts, special)
    _compare(hf, texts, want, got, f"{name} encode(add_special_tokens={special})")


@pytest.mark.parametrize("name", ["gpt2", "llama2"])
def test_string_merges_same_ids(exe, toks, texts, name):
    """tokenizers < 0.20 wrote merges as "a b" strings, >= 0.20 as [a, b] pairs: both load
    and give identical ids (in tokenizers and in ours)."""
    pairs = json.loads((toks.dir(name) / "tokenizer.json").read_text("utf-8"))
    strs = json.loads((toks.dir(name + "-strmerges") / "tokenizer.json").read_text("utf-8"))
    assert isinstance(pairs["model"]["merges"][0], list)
    assert isinstance(strs["model"]["merges"][0], str)
    a = [e.ids for e in toks.hf(name).encode_batch(texts)]
    b = [e.ids for e in toks.hf(name + "-strmerges").encode_batch(texts)]
    assert a == b
    got_pairs = _ft(tokref.ft_encode, exe, toks.dir(name), texts)
    got_strs = _ft(tokref.ft_encode, exe, toks.dir(name + "-strmerges"), texts)
    _compare(toks.hf(name), texts, got_pairs, got_strs, f"{name}: pair merges vs string merges")


@pytest.mark.parametrize("name", ["llama2", "llama3"])
def test_long_document(exe, toks, corpora, name):
    """One ~250 KB string: without a pre-tokenizer (Llama 2) the whole text is a single
    BPE word, which a quadratic merge loop would make slow."""
    text = " ".join(corpora[1]) + "\n\n" + "\n".join(corpora[0][:1000])
    hf = toks.hf(name)
    want = hf.encode(text).ids
    got = _ft(tokref.ft_encode, exe, toks.dir(name), [text])[0]
    if got != want:
        _compare(hf, [text[:200] + "..."], [want], [got], f"{name} long document")


def test_tokenizer_file_path_accepted(exe, toks):
    """TOKENIZER_PATH may be the directory or tokenizer.json itself."""
    d = toks.dir("llama3")
    texts = ["Hello world", "x <|eot_id|> y"]
    a = _ft(tokref.ft_encode, exe, d, texts)
    b = _ft(tokref.ft_encode, exe, d / "tokenizer.json", texts)
    assert a == b == [e.ids for e in toks.hf("llama3").encode_batch(texts)]


def test_byte_fallback_exercised(toks, texts):
    """Guards the suite itself: the SentencePiece-style vocab lacks some characters, so
    byte fallback runs; and the Llama 3 vocab has pre-tokens that merges would not rebuild
    (ignore_merges matters) or at least the flag is set."""
    hf = toks.hf("llama2")
    fallback = [t for t in texts if any(x.startswith("<0x") for x in hf.encode(t).tokens)]
    assert len(fallback) > 50
    j = json.loads((toks.dir("llama3") / "tokenizer.json").read_text("utf-8"))
    assert j["model"]["ignore_merges"] is True


def _ignore_merges_json(ignore):
    """A tiny byte-level tokenizer where merges alone would give "a" + "bc" for "abc" but
    the vocab holds "abc": ignore_merges decides."""
    from tokenizers.pre_tokenizers import ByteLevel
    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    for t in ["ab", "bc", "abc", "Ġa", "Ġab", "Ġabc"]:
        vocab[t] = len(vocab)
    merges = [["b", "c"], ["a", "b"], ["ab", "c"], ["Ġ", "a"], ["Ġa", "b"], ["Ġab", "c"]]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": tokref.LLAMA3_PATTERN},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore,
                  "vocab": vocab, "merges": merges},
    }


@pytest.mark.parametrize("ignore", [True, False], ids=["ignore_merges", "use_merges"])
def test_ignore_merges(exe, tmp_path, ignore):
    p = tmp_path / "tokenizer.json"
    p.write_text(json.dumps(_ignore_merges_json(ignore)), encoding="utf-8")
    hf = Tokenizer.from_file(str(p))
    texts = ["abc", "abc abc", "xabc", "abcabc", "bc ab abc"]
    want = [e.ids for e in hf.encode_batch(texts)]
    # the fixture really distinguishes the two modes
    assert (hf.encode("abc").tokens == ["abc"]) == ignore
    got = _ft(tokref.ft_encode, exe, p, texts)
    _compare(hf, texts, want, got, f"ignore_merges={ignore}")


# ---------------------------------------------------------------------------------------
# decode


@pytest.mark.parametrize("skip", [False, True], ids=["keep-special", "skip-special"])
@pytest.mark.parametrize("name", NAMES)
def test_decode_matches_tokenizers(exe, toks, texts, name, skip):
    """decode(ids) for the ids tokenizers gives each text (with special tokens added), so
    that decode is checked independently of encode."""
    hf = toks.hf(name)
    ids = [e.ids for e in hf.encode_batch(texts, add_special_tokens=True)]
    want = hf.decode_batch(ids, skip_special_tokens=skip)
    got = _ft(tokref.ft_decode, exe, toks.dir(name), ids, skip)
    bad = [(t, i, w, g) for t, i, w, g in zip(texts, ids, want, got) if w != g]
    if bad:
        msg = [f"{name} decode(skip_special_tokens={skip}): {len(bad)} of {len(ids)} differ"]
        for t, i, w, g in bad[:MAX_REPORTED]:
            msg.append(f"  text {t!r}\n    ids {i}\n    expected {w!r}\n    got      {g!r}")
        pytest.fail("\n".join(msg), pytrace=False)


@pytest.mark.parametrize("name", ["gpt2", "llama3", "qwen2", "llama2", "mistral",
                                  "mistral-llamadec"])
def test_decode_random_ids(exe, toks, name):
    """Arbitrary id sequences: byte-level decoding of broken UTF-8 (U+FFFD replacement),
    byte-fallback runs that are not UTF-8, special tokens in the middle, lone bytes."""
    hf = toks.hf(name)
    n = hf.get_vocab_size(with_added_tokens=True)
    rng = random.Random(7)
    ids = [[rng.randrange(n) for _ in range(rng.randrange(0, 12))] for _ in range(400)]
    if name in ("llama2", "mistral", "mistral-llamadec"):
        byte_ids = list(range(3, 259))
        ids += [[rng.choice(byte_ids) for _ in range(rng.randrange(1, 6))] for _ in range(200)]
        ids += [[0x80 + 3], [0xE4 + 3, 0xB8 + 3], [0xE4 + 3, 0xB8 + 3, 0x96 + 3],
                [0xE4 + 3, 1, 0xB8 + 3, 0x96 + 3], [0x41 + 3, 0xFF + 3, 0x42 + 3], [0, 0, 0]]
    for skip in (False, True):
        want = hf.decode_batch(ids, skip_special_tokens=skip)
        got = _ft(tokref.ft_decode, exe, toks.dir(name), ids, skip)
        bad = [(i, w, g) for i, w, g in zip(ids, want, got) if w != g]
        if bad:
            msg = [f"{name} decode(random ids, skip_special_tokens={skip}): "
                   f"{len(bad)} of {len(ids)} differ"]
            for i, w, g in bad[:MAX_REPORTED]:
                msg.append(f"  ids {i} tokens {[hf.id_to_token(x) for x in i]}\n"
                           f"    expected {w!r}\n    got      {g!r}")
            pytest.fail("\n".join(msg), pytrace=False)


@pytest.mark.parametrize("name", NAMES)
def test_id_to_token(exe, toks, name):
    hf = toks.hf(name)
    n = hf.get_vocab_size(with_added_tokens=True)
    ids = [list(range(i, min(n, i + 100))) for i in range(0, n, 100)] + [[n, n + 5]]
    got = _ft(tokref.ft_tokens, exe, toks.dir(name), ids)
    want = [[hf.id_to_token(x) for x in row] for row in ids]
    assert got == want


# ---------------------------------------------------------------------------------------
# tokenizer_config.json / special_tokens_map.json


@pytest.mark.parametrize("name", ["gpt2", "llama3", "qwen2", "llama2", "mistral"])
def test_info_matches_transformers(exe, toks, name):
    from transformers import PreTrainedTokenizerFast
    d = toks.dir(name)
    ref = PreTrainedTokenizerFast.from_pretrained(str(d))
    hf = toks.hf(name)
    probe = ["<s>", "</s>", "<|im_start|>", "<|eot_id|>", "<|endoftext|>", "Ġthe", "▁the",
             "not-a-token"]
    info = _ft(tokref.ft_info, exe, d, probe)
    with_sp, without = hf.encode("x").ids, hf.encode("x", add_special_tokens=False).ids
    expected = {
        "vocab_size": hf.get_vocab_size(with_added_tokens=True),
        "bos_id": -1 if ref.bos_token_id is None else ref.bos_token_id,
        "eos_id": -1 if ref.eos_token_id is None else ref.eos_token_id,
        "pad_id": -1 if ref.pad_token_id is None else ref.pad_token_id,
        "bos_token": ref.bos_token,
        "eos_token": ref.eos_token,
        "adds_bos": len(with_sp) == len(without) + 1 and with_sp[1:] == without
                    and with_sp[0] == ref.bos_token_id,
        "chat_template": ref.chat_template,
        "token_ids": {t: (-1 if hf.token_to_id(t) is None else hf.token_to_id(t))
                      for t in probe},
    }
    assert info == expected


# ---------------------------------------------------------------------------------------
# raw input and errors


def test_raw_mode_matches_json_mode(exe, toks, texts):
    one_line = [t for t in texts if "\n" not in t][:400]
    for name in ("qwen2", "llama2"):
        a = _ft(tokref.ft_encode, exe, toks.dir(name), one_line)
        b = _ft(tokref.ft_encode_raw, exe, toks.dir(name), [t.encode() for t in one_line])
        assert a == b, name


@pytest.mark.parametrize("bad", [b"abc\xff", b"\xc3\x28", b"\xe4\xb8", b"\xed\xa0\x80x",
                                 b"\xf8\x88\x80\x80\x80", b"\xc0\xaf", b"ok \x80 ok"],
                         ids=["ff", "bad-continuation", "truncated", "surrogate",
                              "5-byte", "overlong", "lone-continuation"])
@pytest.mark.parametrize("name", ["gpt2", "llama2"])
def test_invalid_utf8_is_an_error(exe, toks, name, bad):
    proc = tokref.run_ft(exe, ["encode", toks.dir(name), "--raw"], b"fine\n" + bad + b"\n",
                         check=False)
    assert proc.returncode == 1, proc
    err = proc.stderr.decode("utf-8", "replace")
    assert err.startswith("ft-tokenize: error: ")
    assert "utf-8" in err.lower() or "utf8" in err.lower(), err


def _mutated(toks, tmp_path, name, mutate):
    j = json.loads((toks.dir(name) / "tokenizer.json").read_text("utf-8"))
    mutate(j)
    d = tmp_path / "tok"
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")
    return d


def _expect_error(exe, d, *needles):
    proc = tokref.run_ft(exe, ["encode", d], b'"hello"\n', check=False)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 1, (proc.returncode, err)
    assert err.startswith("ft-tokenize: error: "), err
    for n in needles:
        alts = n if isinstance(n, tuple) else (n,)
        assert any(a.lower() in err.lower() for a in alts), (n, err)
    return err


COMPONENT = ("pre_tokenizer", "pre-tokenizer", "pretokenizer")


def test_unknown_pre_tokenizer(exe, toks, tmp_path):
    d = _mutated(toks, tmp_path, "gpt2", lambda j: j.update(pre_tokenizer={"type": "Foo"}))
    _expect_error(exe, d, "Foo", COMPONENT)


def test_unknown_pre_tokenizer_in_sequence(exe, toks, tmp_path):
    def m(j):
        j["pre_tokenizer"]["pretokenizers"].insert(1, {"type": "Foo"})
    d = _mutated(toks, tmp_path, "llama3", m)
    _expect_error(exe, d, "Foo")


def test_whitespace_pre_tokenizer_rejected_or_exact(exe, toks, tmp_path):
    """A real pre-tokenizer the loader may not implement: either an error naming it or
    exactly tokenizers' ids, never an approximation."""
    d = _mutated(toks, tmp_path, "gpt2", lambda j: j.update(pre_tokenizer={"type": "Whitespace"}))
    texts = ["Hello, world! It's 2024.", "  spaced   out  ", "a-b_c"]
    proc = tokref.run_ft(exe, ["encode", d], tokref._jsonl(texts), check=False)
    if proc.returncode != 0:
        _expect_error(exe, d, "Whitespace")
    else:
        hf = Tokenizer.from_file(str(d / "tokenizer.json"))
        got = [json.loads(x) for x in proc.stdout.decode().split("\n")[:-1]]
        assert got == [e.ids for e in hf.encode_batch(texts)]


def test_unknown_normalizer(exe, toks, tmp_path):
    d = _mutated(toks, tmp_path, "qwen2", lambda j: j.update(normalizer={"type": "FooNorm"}))
    _expect_error(exe, d, "FooNorm", "normalizer")


def test_unknown_decoder(exe, toks, tmp_path):
    def m(j):
        j["decoder"]["decoders"][1] = {"type": "FooDec"}
    d = _mutated(toks, tmp_path, "llama2", m)
    _expect_error(exe, d, "FooDec")


def test_unknown_post_processor(exe, toks, tmp_path):
    d = _mutated(toks, tmp_path, "gpt2", lambda j: j.update(post_processor={"type": "FooPost"}))
    _expect_error(exe, d, "FooPost")


def test_unknown_model_type(exe, toks, tmp_path):
    def m(j):
        j["model"]["type"] = "Unigram"
    d = _mutated(toks, tmp_path, "gpt2", m)
    _expect_error(exe, d, "Unigram")


def test_bpe_dropout_rejected(exe, toks, tmp_path):
    """BPE dropout makes tokenizers' output random: an option that cannot be honoured."""
    def m(j):
        j["model"]["dropout"] = 0.5
    d = _mutated(toks, tmp_path, "gpt2", m)
    _expect_error(exe, d, "dropout")


def test_missing_tokenizer_json(exe, tmp_path):
    d = tmp_path / "no-tokenizer-here"
    d.mkdir()
    proc = tokref.run_ft(exe, ["encode", d], b'"x"\n', check=False)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 1, err
    assert err.startswith("ft-tokenize: error: ")
    assert str(d) in err, err


def test_malformed_tokenizer_json(exe, tmp_path):
    d = tmp_path / "broken"
    d.mkdir()
    (d / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {', encoding="utf-8")
    proc = tokref.run_ft(exe, ["encode", d], b'"x"\n', check=False)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 1, err
    assert "tokenizer.json" in err, err


def test_decode_out_of_range_id(exe, toks):
    n = toks.hf("llama3").get_vocab_size(with_added_tokens=True)
    for bad in (n, -1, 10 ** 6):
        proc = tokref.run_ft(exe, ["decode", toks.dir("llama3")], f"[1,{bad}]\n".encode(),
                             check=False)
        assert proc.returncode == 1, (bad, proc)
        assert proc.stderr.decode().startswith("ft-tokenize: error: ")


def test_bench_subcommand(exe, toks, corpora, tmp_path):
    f = tmp_path / "bench.txt"
    lines = corpora[1][:200]
    f.write_bytes("".join(x + "\n" for x in lines).encode("utf-8"))
    r = _ft(tokref.ft_bench, exe, toks.dir("llama3"), f, 2)
    assert r["bytes"] == f.stat().st_size and r["repeat"] == 2
    assert r["seconds"] > 0 and r["mb_per_s"] > 0
    # lines are encoded separately, each with its newline, without special tokens
    hf = toks.hf("llama3")
    chunks = [x + "\n" for x in f.read_bytes().decode("utf-8").split("\n")[:-1]]
    want = sum(len(e.ids) for e in hf.encode_batch(chunks, add_special_tokens=False))
    assert r["tokens"] == want


# ---------------------------------------------------------------------------------------
# fuzz

_FUZZ_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
                  "<|eot_id|>", "<s>", "</s>", "<unk>", "<mask>", "[TOOL]", "CUSTOM",
                  "hello world", "<tool_call>", "</tool_call>", "<|im_", "<0x41>", "▁"]


@pytest.mark.parametrize("name", ["gpt2", "gpt2-added", "llama3", "qwen2", "llama2",
                                  "mistral"])
def test_encode_fuzz(exe, toks, name):
    """Random strings over many Unicode blocks and every whitespace character (regex
    classes \\s \\p{L} \\p{N}, case-insensitive contractions), with special and added
    tokens spliced in; encoded with and without special tokens, then decoded."""
    hf = toks.hf(name)
    texts = tokref.fuzz_strings(1234, 1500, _FUZZ_SPECIALS)
    for special in (True, False):
        want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=special)]
        got = _ft(tokref.ft_encode, exe, toks.dir(name), texts, special)
        _compare(hf, texts, want, got, f"{name} fuzz encode(add_special_tokens={special})")
    ids = [e.ids for e in hf.encode_batch(texts)]
    for skip in (False, True):
        want = hf.decode_batch(ids, skip_special_tokens=skip)
        got = _ft(tokref.ft_decode, exe, toks.dir(name), ids, skip)
        bad = [(t, w, g) for t, w, g in zip(texts, want, got) if w != g]
        if bad:
            pytest.fail(f"{name} fuzz decode(skip_special_tokens={skip}): {len(bad)} differ\n"
                        + "\n".join(f"  text {t!r}\n    expected {w!r}\n    got      {g!r}"
                                    for t, w, g in bad[:MAX_REPORTED]), pytrace=False)


# ---------------------------------------------------------------------------------------
# component variants: honoured exactly, or rejected with an error naming them
# (a Strip decoder with right=1 and a BPE continuing_subword_prefix are left out:
# tokenizers itself panics on them with these vocabularies)


def _variants():
    from tokenizers import Regex, normalizers, pre_tokenizers, processors
    P, N, PP = pre_tokenizers, normalizers, processors
    split = lambda b, inv=False: P.Split(Regex(tokref.LLAMA3_PATTERN), behavior=b, invert=inv)  # noqa: E731
    bl = P.ByteLevel(add_prefix_space=False, use_regex=False)
    v = {
        # (base tokenizer, attribute, new component, name the error must mention)
        "bytelevel-prefix-space": ("gpt2", "pre_tokenizer",
                                   P.ByteLevel(add_prefix_space=True, use_regex=True), "ByteLevel"),
        "split-merged-prev": ("llama3", "pre_tokenizer",
                              P.Sequence([split("merged_with_previous"), bl]), "Split"),
        "split-merged-next": ("llama3", "pre_tokenizer",
                              P.Sequence([split("merged_with_next"), bl]), "Split"),
        "split-removed": ("llama3", "pre_tokenizer", P.Sequence([split("removed"), bl]), "Split"),
        "split-contiguous": ("llama3", "pre_tokenizer",
                             P.Sequence([split("contiguous"), bl]), "Split"),
        "split-invert": ("llama3", "pre_tokenizer",
                         P.Sequence([split("isolated", True), bl]), "Split"),
        "split-string": ("llama3", "pre_tokenizer",
                         P.Sequence([P.Split(" ", behavior="merged_with_next"), bl]), "Split"),
        "digits": ("llama3", "pre_tokenizer",
                   P.Sequence([P.Digits(individual_digits=True), bl]), "Digits"),
        "punctuation": ("llama3", "pre_tokenizer", P.Sequence([P.Punctuation(), bl]),
                        "Punctuation"),
        "whitespace-split": ("llama3", "pre_tokenizer", P.Sequence([P.WhitespaceSplit(), bl]),
                             "WhitespaceSplit"),
        "metaspace-always": ("mistral", "pre_tokenizer",
                             P.Metaspace(prepend_scheme="always", split=False), "Metaspace"),
        "metaspace-never": ("mistral", "pre_tokenizer",
                            P.Metaspace(prepend_scheme="never", split=False), "Metaspace"),
        "metaspace-split": ("mistral", "pre_tokenizer",
                            P.Metaspace(prepend_scheme="first", split=True), "Metaspace"),
        "nfkc": ("qwen2", "normalizer", N.NFKC(), "NFKC"),
        "nfd": ("qwen2", "normalizer", N.NFD(), "NFD"),
        "nfkd": ("qwen2", "normalizer", N.NFKD(), "NFKD"),
        "lowercase": ("qwen2", "normalizer", N.Sequence([N.NFC(), N.Lowercase()]), "Lowercase"),
        "strip": ("qwen2", "normalizer", N.Strip(left=True, right=True), "Strip"),
        "replace-regex": ("qwen2", "normalizer", N.Replace(Regex(r"\s+"), " "), "Replace"),
        "prepend-only": ("llama2", "normalizer", N.Prepend("▁"), "Prepend"),
        "template-eos": ("llama3", "post_processor",
                         PP.TemplateProcessing(single="<|begin_of_text|> $A <|end_of_text|>",
                                               pair="$A $B",
                                               special_tokens=[("<|begin_of_text|>", 1500),
                                                               ("<|end_of_text|>", 1501)]),
                         "TemplateProcessing"),
        "roberta-processing": ("gpt2", "post_processor",
                               PP.RobertaProcessing(("<|endoftext|>", 0), ("<|endoftext|>", 0)),
                               "Roberta"),
        "bert-processing": ("gpt2", "post_processor",
                            PP.BertProcessing(("<|endoftext|>", 0), ("<|endoftext|>", 0)), "Bert"),
    }
    return v


_VARIANTS = list(_variants())
_MODEL_VARIANTS = {
    # BPE model options: (base, {model key: value}, name the error must mention)
    "no-byte-fallback": ("llama2", {"byte_fallback": False}, "byte_fallback"),
    "no-fuse-unk": ("llama2", {"byte_fallback": False, "fuse_unk": False}, "fuse_unk"),
    "end-of-word-suffix": ("gpt2", {"end_of_word_suffix": "</w>"}, "end_of_word_suffix"),
    "llama3-use-merges": ("llama3", {"ignore_merges": False}, "ignore_merges"),
}


def _check_variant(exe, d, texts, needle):
    hf = Tokenizer.from_file(str(d / "tokenizer.json"))
    proc = tokref.run_ft(exe, ["encode", d], tokref._jsonl(texts), check=False)
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace")
        assert proc.returncode == 1 and err.startswith("ft-tokenize: error: "), err
        assert needle.lower() in err.lower(), f"rejected without naming {needle!r}: {err}"
        return "rejected"
    got = [json.loads(x) for x in proc.stdout.decode().split("\n")[:-1]]
    want = [e.ids for e in hf.encode_batch(texts)]
    _compare(hf, texts, want, got, f"variant accepted but differs ({needle})")
    ids = want
    for skip in (False, True):
        w = hf.decode_batch(ids, skip_special_tokens=skip)
        g = _ft(tokref.ft_decode, exe, d, ids, skip)
        bad = [(t, a, b) for t, a, b in zip(texts, w, g) if a != b]
        if bad:
            pytest.fail(f"variant decode(skip={skip}) differs ({needle}):\n" + "\n".join(
                f"  text {t!r}\n    expected {a!r}\n    got      {b!r}" for t, a, b in bad[:8]),
                pytrace=False)
    return "exact"


@pytest.fixture(scope="session")
def variant_texts(corpora):
    return (list(tokref.HELD_OUT) + corpora[1][:300]
            + tokref.fuzz_strings(99, 300, _FUZZ_SPECIALS))


@pytest.mark.parametrize("variant", _VARIANTS)
def test_component_variant(exe, toks, variant_texts, tmp_path, variant):
    base, attr, comp, needle = _variants()[variant]
    hf = toks.hf(base)
    setattr(hf, attr, comp)
    d = tmp_path / variant
    d.mkdir()
    hf.save(str(d / "tokenizer.json"))
    print(f"[{variant}: {_check_variant(exe, d, variant_texts, needle)}]", end=" ")


@pytest.mark.parametrize("variant", list(_MODEL_VARIANTS))
def test_model_option_variant(exe, toks, variant_texts, tmp_path, variant):
    base, opts, needle = _MODEL_VARIANTS[variant]
    d = _mutated(toks, tmp_path, base, lambda j: j["model"].update(opts))
    print(f"[{variant}: {_check_variant(exe, d, variant_texts, needle)}]", end=" ")


# Code points that tokenizers' regex engine (newer Unicode tables) puts in a category and
# the system PCRE2 (Unicode 14) does not know: letters (U+1C89 Lu, U+A7CB, Cyrillic
# Extended-D U+1E030.., Todhri U+105C0, CJK Extension H U+31350 Lo), Garay digits
# (U+10D40 Nd), symbols (U+2427 So), format characters (U+13439 Cf).
_NEW_UNICODE = ["\u1c89", "\u1c8a", "\ua7cb", "\U0001e030", "\U0001e06d", "\U000105c0",
                "\U00031350", "\U00010d40", "\U00010d49", "\u2427", "\U00013439"]
_CLASS_PATTERNS = [r"\p{L}+", r"\p{Lu}", r"\P{L}+", r"\p{^L}+", r"\p{N}+", r"\p{Nd}",
                   r"[^\s\p{L}\p{N}]+", r"[\p{Lu}\p{Ll}]+", r"\d+", r"\D+", r"[\d]+",
                   r"\p{S}+", r"\p{Cf}+", r"\p{Cn}+", r"\P{Cn}+", r"[\P{Cn}x]+",
                   r"'(?:s|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+"]


@pytest.mark.parametrize("pattern", _CLASS_PATTERNS)
def test_unicode_classes_follow_tokenizers(exe, toks, tmp_path, pattern):
    """Regex classes (\\p{X} of a general category, \\d) hold the code points that
    tokenizers' Unicode tables add (lib/tokenizer/tok_regex.c)."""
    from tokenizers import Regex, pre_tokenizers as P
    hf = toks.hf("qwen2")
    # "removed": what the class matches is dropped, so every code point it holds shows
    hf.pre_tokenizer = P.Sequence([P.Split(Regex(pattern), behavior="removed"),
                                   P.ByteLevel(add_prefix_space=False, use_regex=False)])
    d = tmp_path / "tok"
    d.mkdir()
    hf.save(str(d / "tokenizer.json"))
    texts = [f"ab{c}{c}'s 12{c}3 {c}x." for c in _NEW_UNICODE] + ["".join(_NEW_UNICODE) + "'re"]
    want = [e.ids for e in hf.encode_batch(texts)]
    got = tokref.ft_encode(exe, d, texts)
    _compare(hf, texts, want, got, f"/{pattern}/")


@pytest.mark.parametrize("pattern", [r"[\p{Cn}x]", r"[^\P{L}]", r"[\D]"])
def test_unicode_class_without_a_pcre2_spelling_is_refused(exe, toks, tmp_path, pattern):
    """A class inside [...] that would need code points taken out of a PCRE2 class (or a
    negated one that would need code points added) is refused, naming it."""
    d = _mutated(toks, tmp_path, "qwen2", lambda j: j.update(pre_tokenizer={
        "type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
        "invert": False}))
    _expect_error(exe, d, "Split", "inside a character class")


def test_normalized_added_token_decodes_as_normalized(exe, toks, tmp_path):
    """An added token with normalized=true is given back (decode, id -> token) as its
    content after the normalizer, as tokenizers >= 0.21 does: under Llama 2's normalizer
    (Prepend "▁", spaces to "▁") "▁q▁" is "▁▁q▁", which the decoder turns into " q "."""
    from tokenizers import AddedToken
    hf = toks.hf("llama2")
    hf.add_tokens([AddedToken("▁q▁", normalized=True), AddedToken("▁r▁", normalized=False),
                   AddedToken("zz", normalized=True)])
    d = tmp_path / "tok"
    d.mkdir()
    hf.save(str(d / "tokenizer.json"))
    q, r, z = (hf.token_to_id(x) for x in ("▁q▁", "▁r▁", "zz"))
    w = hf.encode("world", add_special_tokens=False).ids
    ids = [[q], [r], [z], w + [q] + w, [q] + w, w + [z] + w, w + [r] + w]
    assert hf.decode([q]) == " q "  # the case this checks: not "q " (content "▁q▁")
    for skip in (False, True):
        assert _ft(tokref.ft_decode, exe, d, ids, skip) == hf.decode_batch(
            ids, skip_special_tokens=skip)
    assert tokref.ft_tokens(exe, d, [[q, r, z]]) == [[hf.id_to_token(i) for i in (q, r, z)]]
