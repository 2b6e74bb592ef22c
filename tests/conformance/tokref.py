"""Reference side of the tokenizer conformance suite and benchmark.

Builds realistic tokenizer.json files offline by training small BPE tokenizers with the
Hugging Face `tokenizers` library on a generated, varied corpus, with the normalizer /
pre-tokenizer / model / post-processor / decoder setups of the model families ftkit
loads (GPT-2, Llama 3, Qwen2, Llama 2 / TinyLlama, Mistral), and runs the C harness
(tests/conformance/tokenize.c, `ft-tokenize`) over them.

Used by tests/conformance/test_tokenizer.py and tests/bench/bench_tokenizer.py.
"""

import json
import os
import random
import subprocess
import unicodedata
from pathlib import Path

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

# The Split regexes of the real tokenizer.json files (FORMATS.md; Qwen2's is
# transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>"]
QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SPM = "\u2581"

# ---------------------------------------------------------------------------------------
# Corpus

_WORDS = (
    "the of and to in is was that for it with as his on be at by had are but from or "
    "have an they which one you were her all she there would their we him been has when "
    "who will more no if out so said what up its about into than them can only other new "
    "some could time these two may then do first any my now such like our over man me "
    "even most made after also did many before must through back years where much your "
    "way well down should because each just those people how too little state good very "
    "make world still own see men work long get here between both life being under never "
    "day same another know while last might us great old year off come since against go "
    "came right used take three tokenizer gradient matrix kernel adapter training "
    "learning optimizer checkpoint internationalization misunderstanding "
    "supercalifragilistic antidisestablishmentarianism"
).split()
_CONTRACTIONS = ["don't", "I'm", "you're", "we've", "they'll", "he'd", "it's", "Can't",
                 "WON'T", "I'LL", "THEY'RE", "She'S", "isn't", "o'clock", "rock'n'roll"]
_ACCENTED = ["café", "naïve", "Zürich", "São Paulo", "Ångström", "straße", "façade",
             "résumé", "El Niño", "İstanbul", "Łódź", "Dvořák", "crème brûlée", "Øresund",
             "jalapeño", "Tiếng Việt", "ǅemal", "Ærøskøbing"]
_OTHER_SCRIPTS = ["Привет, мир! Как дела?", "Γειά σου Κόσμε", "مرحبا بالعالم",
                  "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "გამარჯობა",
                  "Բարեւ աշխարհ", "ಕನ್ನಡ ಭಾಷೆ", "안녕하세요 세계", "こんにちは、世界！",
                  "カタカナのテキスト", "你好，世界。今天天气很好！", "漢字とひらがな混じり文",
                  "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕥𝕖𝕩𝕥", "ʻŌlelo Hawaiʻi"]
_EMOJI = ["😀", "👍", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🏳️\u200d🌈", "🇺🇸", "🇯🇵",
          "❤️", "🔥", "✨", "🤖", "👩🏿\u200d💻", "🧑\u200d🤝\u200d🧑", "☕", "🎉🎉🎉", "🫠"]
_COMBINING = ["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "Z\u0351\u0352\u0353",
              "cafe\u0301", "A\u030a", "\u1100\u1161\u11a8", "i\u0307"]
_CODE = [
    "def forward(self, x):\n    return self.proj(x) * 2  # scale\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "if x != None and y >= 0x7FFF:\n        raise ValueError(f\"bad {x!r}\")\n",
    "const auto& v = m->find(key); // C++\n",
    "SELECT id, name FROM users WHERE age > 21 ORDER BY name;\n",
    "    let mut v: Vec<u32> = Vec::with_capacity(1024);\n",
    "<div class=\"row\"><span id='x'>&nbsp;</span></div>\n",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "$ ls -la /usr/local/bin | grep -E '^d' && echo \"done\" >> log.txt\n",
    "x = [i**2 for i in range(10) if i % 3 == 0]\n",
    "    \t    mixed indentation\n",
    "https://example.com/path?query=1&b=%20#frag\n",
    "user@example.org, +1 (555) 010-9999, 2024-06-30T12:34:56Z\n",
]
_WS = ["  ", "   ", "\t", "\t\t", " \t ", "\n", "\n\n", "\r\n", "    ", "        ",
       "\u00a0", "\u3000", " \n ", "  \n\n  "]
_PUNCT = ["...", "!!", "?!", "--", "—", "–", "«»", "“quoted”", "‘single’", "(parens)",
          "[brackets]", "{braces}", "#hashtag", "@mention", "$100", "€50", "£3", "¥1000",
          "100%", "a/b", "C:\\path\\to", "::", "->", "=>", "!=", "<=", "&&", "||"]


def _number(rng):
    k = rng.randrange(8)
    if k == 0:
        return str(rng.randrange(10))
    if k == 1:
        return str(rng.randrange(10 ** rng.randrange(2, 12)))
    if k == 2:
        return f"{rng.uniform(-1000, 1000):.{rng.randrange(1, 6)}f}"
    if k == 3:
        return f"{rng.randrange(1, 10**7):,}"
    if k == 4:
        return f"{rng.randrange(1900, 2100)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    if k == 5:
        return "".join(rng.choice("0123456789") for _ in range(rng.randrange(10, 30)))
    if k == 6:
        return rng.choice(["٣٤٥", "½", "Ⅻ", "x²", "१२३", "①②", "3.0e-8", "0xDEADBEEF"])
    return f"v{rng.randrange(10)}.{rng.randrange(20)}.{rng.randrange(100)}"


def _cjk(rng, n):
    out = []
    for _ in range(n):
        k = rng.randrange(5)
        if k < 3:
            out.append(chr(rng.randrange(0x4E00, 0x4E00 + 600)))   # common-ish Han
        elif k == 3:
            out.append(chr(rng.randrange(0x3041, 0x3097)))         # hiragana
        else:
            out.append(chr(rng.randrange(0xAC00, 0xAC00 + 300)))   # Hangul syllables
        if rng.random() < 0.1:
            out.append(rng.choice("，。！？、：「」"))
    return "".join(out)


def _word(rng):
    r = rng.random()
    if r < 0.70:
        w = rng.choice(_WORDS)
        c = rng.random()
        if c < 0.12:
            w = w.capitalize()
        elif c < 0.14:
            w = w.upper()
        return w
    if r < 0.76:
        return rng.choice(_CONTRACTIONS)
    if r < 0.82:
        return rng.choice(_ACCENTED)
    if r < 0.88:
        return _number(rng)
    if r < 0.91:
        return rng.choice(_PUNCT)
    if r < 0.94:
        return rng.choice(_EMOJI)
    if r < 0.96:
        return rng.choice(_COMBINING)
    if r < 0.98:
        return _cjk(rng, rng.randrange(1, 6))
    return rng.choice(_OTHER_SCRIPTS).split()[0]


def _sentence(rng):
    n = rng.randrange(3, 18)
    parts = []
    for i in range(n):
        parts.append(_word(rng))
        if i < n - 1:
            parts.append(" " if rng.random() < 0.93 else rng.choice(_WS))
    s = "".join(parts)
    s = s[:1].upper() + s[1:]
    return s + rng.choice([".", ".", ".", "!", "?", ":", ";", ",", "", "..."])


def corpus_lines(seed, n_lines):
    """n_lines varied text lines (no newline at the end; some contain newlines)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        r = rng.random()
        if r < 0.55:
            line = " ".join(_sentence(rng) for _ in range(rng.randrange(1, 4)))
        elif r < 0.67:
            line = rng.choice(_CODE).rstrip("\n")
        elif r < 0.74:
            line = _cjk(rng, rng.randrange(5, 40))
        elif r < 0.79:
            line = rng.choice(_OTHER_SCRIPTS) + " " + _sentence(rng)
        elif r < 0.84:
            line = " ".join(rng.choice(_EMOJI) + " " + rng.choice(_WORDS) for _ in range(4))
        elif r < 0.88:
            line = " ".join(_number(rng) for _ in range(rng.randrange(2, 8)))
        elif r < 0.92:
            line = rng.choice(_WS) * rng.randrange(1, 4) + _sentence(rng) + rng.choice(_WS)
        elif r < 0.95:
            line = "\n".join(_sentence(rng) for _ in range(rng.randrange(2, 4)))
        elif r < 0.97:
            line = unicodedata.normalize("NFD", _sentence(rng) + " " + rng.choice(_ACCENTED))
        else:
            line = " ".join(rng.choice(_COMBINING) for _ in range(5))
        lines.append(line)
    return lines


# Held-out strings: edge cases the corpus does not cover systematically.
HELD_OUT = [
    "", " ", "  ", "     ", " " * 50, "\n", "\n\n\n", "\t", "\t\t x", " \n ", "\r\n", "\r",
    "a", "A", "hello world", " hello", "hello ", "hello  world", "Hello, World!",
    "1234567890", "12345678901234567890123", "3.14159", "1,000,000", "-42", "007",
    "don't I'LL we've THEY'RE she'S", "it'ſ", "'s", "''", "'''s",
    "Hello мир 世界 مرحبا नमस्ते 😀",
    "👨\u200d👩\u200d👧\u200d👦 👍🏽 👍🏿 🏳️\u200d🌈 🇺🇸🇯🇵 ❤️\u200d🔥",
    "e\u0301", "\u0301", "   \u0301", "cafe\u0301 caf\u00e9", "n\u0303o\u0308",
    "\u212b", "\u00c5", "A\u030a", "\ufb01", "\u1e9b\u0323",
    unicodedata.normalize("NFD", "한국어 텍스트"), "한국어 텍스트",
    "\u00a0nbsp\u00a0", "ideo\u3000space", "zw\u200bsp", "nel\u0085x", "line\u2028sep",
    "thin\u2009space", "mongol\u180evs", "bom\ufeffx", "\ufffd", "\x00", "a\x00b", "\x7f\x01",
    "tab\tsep\tvalues", "trailing spaces   ", "   leading spaces", "  \n\n  mixed\t \n",
    "a" * 300, "ab" * 200, "😀" * 20, "1" * 25, "世界" * 30,
    "def f(x):\n    return x**2  # comment\n", "    \n\n    indented", "x\r\ny\r\n",
    "٣٤٥ ½ Ⅻ x² १२३ ①", "สวัสดีครับ", "नमस्ते", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "İstanbul ǅ ǈ",
    "\ue000private", "\U0001fae8 \U0001e030", "\U000e0001tag", "a\u0378b",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "a<|endoftext|>b", " <|endoftext|> ", "<|endoftext|><|endoftext|>", "<|im_start",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "x <|eot_id|> y", "<|end_of_text|>", "<s>hello</s>world", " <s> </s> ", "</s></s>",
    "<unk>", "<0x41>", "hello <mask> world", "[TOOL]  call", "x[TOOL]y", "CUSTOM CUSTOMx",
    "a CUSTOM b", "hello world hello  world", "<tool_call>\n{\"a\": 1}\n</tool_call>",
    "▁already▁spm", "▁", "Ġ", "\u0120x",
    # combining marks newer than tokenizers' Unicode normalization tables (U+0898..089F
    # Unicode 14, U+1DF6 Unicode 10, U+07FD Unicode 11): NFC must not reorder them
    "\u0899\u0898", "a\u0301\u0898\u0328\u0898", "a\u0301\u1df6", "x\u0301\u07fd",
    # U+180E MONGOLIAN VOWEL SEPARATOR: not White_Space since Unicode 6.3 (\s)
    "a\u180e'd", "x  \u180ey",
]


# ---------------------------------------------------------------------------------------
# Tokenizer builders


def _bpe_trainer(vocab_size, specials=(), byte_alphabet=True, limit_alphabet=None):
    kw = dict(vocab_size=vocab_size, special_tokens=list(specials), show_progress=False,
              min_frequency=2)
    if byte_alphabet:
        kw["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    if limit_alphabet is not None:
        kw["limit_alphabet"] = limit_alphabet
    return trainers.BpeTrainer(**kw)


def _save(tok, d, edit=None):
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    p = d / "tokenizer.json"
    tok.save(str(p))
    if edit is not None:
        j = json.loads(p.read_text(encoding="utf-8"))
        edit(j)
        p.write_text(json.dumps(j, ensure_ascii=False, indent=2), encoding="utf-8")
    return d


def _special(content, **kw):
    kw.setdefault("special", True)
    kw.setdefault("normalized", False)
    return AddedToken(content, **kw)


def build_gpt2(d, corpus, vocab_size=1500):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.train_from_iterator(corpus, _bpe_trainer(vocab_size, ["<|endoftext|>"]))
    return _save(tok, d)


def build_gpt2_added(d, corpus, vocab_size=1500):
    """GPT-2 with added tokens of every kind: lstrip special (RoBERTa's <mask>), an
    rstrip non-special, a single_word one, a normalized one containing a space, and a
    ChatML special."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.train_from_iterator(corpus, _bpe_trainer(vocab_size, ["<|endoftext|>"]))
    tok.add_special_tokens([_special("<mask>", lstrip=True), _special("<|im_start|>"),
                            _special("<|im_end|>")])
    tok.add_tokens([AddedToken("[TOOL]", rstrip=True, special=False, normalized=False),
                    AddedToken("CUSTOM", single_word=True, special=False, normalized=False),
                    AddedToken("hello world", special=False, normalized=True)])
    return _save(tok, d)


def _llama3_pre():
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])


def build_llama3(d, corpus, vocab_size=1500):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _llama3_pre()
    tok.train_from_iterator(corpus, _bpe_trainer(vocab_size))
    tok.add_special_tokens([_special(s) for s in LLAMA3_SPECIALS])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
            special_tokens=[("<|begin_of_text|>", bos)])])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)

    def edit(j):
        j["model"]["ignore_merges"] = True
    return _save(tok, d, edit)


def build_qwen2(d, corpus, vocab_size=1500):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.train_from_iterator(corpus, _bpe_trainer(vocab_size))
    tok.add_special_tokens([_special(s) for s in QWEN2_SPECIALS])
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False),
                    AddedToken("</tool_call>", special=False, normalized=False),
                    # matched on the NFC-normalized text: "cafe\u0301" finds it too
                    AddedToken("café", special=False, normalized=True)])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                              use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                     use_regex=False)
    return _save(tok, d)


def _spm_model(corpus, vocab_size, limit_alphabet):
    """A SentencePiece-like BPE vocab as LlamaConverter lays it out: <unk>=0, <s>=1,
    </s>=2, <0x00>..<0xFF> = 3..258, then the learned pieces. Trained with a splitting
    Metaspace pre-tokenizer (SentencePiece never merges across U+2581) and a limited
    alphabet so that rare characters fall back to bytes."""
    tt = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tt.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPM, prepend_scheme="always",
                                                split=True)
    tt.train_from_iterator(corpus, _bpe_trainer(vocab_size - 256, ["<unk>", "<s>", "</s>"],
                                                byte_alphabet=False,
                                                limit_alphabet=limit_alphabet))
    m = json.loads(tt.to_str())["model"]
    learned = sorted(m["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = 3 + b
    for piece, _ in learned:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    assert SPM in vocab
    merges = [tuple(p) if isinstance(p, list) else tuple(p.split(" ")) for p in m["merges"]]
    return vocab, merges


def _spm_tokenizer(vocab, merges):
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>",
                               byte_fallback=True, fuse_unk=True))
    tok.add_special_tokens([_special("<unk>"), _special("<s>"), _special("</s>")])
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", 1)])
    return tok


def _llama_decoder():
    return decoders.Sequence([decoders.Replace(SPM, " "), decoders.ByteFallback(),
                              decoders.Fuse(), decoders.Strip(content=" ", left=1, right=0)])


def build_spm_family(root, corpus, vocab_size=1500, limit_alphabet=110):
    """Llama 2 (legacy normalizer), Mistral (Metaspace pre-tokenizer + decoder) and
    Mistral with the LlamaConverter decoder, sharing one trained vocab. Returns
    {name: dir}."""
    vocab, merges = _spm_model(corpus, vocab_size, limit_alphabet)
    out = {}
    tok = _spm_tokenizer(vocab, merges)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPM),
                                           normalizers.Replace(" ", SPM)])
    tok.decoder = _llama_decoder()
    out["llama2"] = _save(tok, Path(root) / "llama2")

    def meta():
        return pre_tokenizers.Metaspace(replacement=SPM, prepend_scheme="first", split=False)
    tok = _spm_tokenizer(vocab, merges)
    tok.pre_tokenizer = meta()
    tok.decoder = decoders.Metaspace(replacement=SPM, prepend_scheme="first", split=False)
    out["mistral"] = _save(tok, Path(root) / "mistral")

    tok = _spm_tokenizer(vocab, merges)
    tok.pre_tokenizer = meta()
    tok.decoder = _llama_decoder()
    out["mistral-llamadec"] = _save(tok, Path(root) / "mistral-llamadec")

    # add_eos_token=True: LlamaTokenizerFast's template with </s> after each sequence
    tok = _spm_tokenizer(vocab, merges)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPM),
                                           normalizers.Replace(" ", SPM)])
    tok.decoder = _llama_decoder()
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0 </s>:0", pair="<s>:0 $A:0 </s>:0 <s>:1 $B:1 </s>:1",
        special_tokens=[("<s>", 1), ("</s>", 2)])
    out["llama2-eos"] = _save(tok, Path(root) / "llama2-eos")
    return out


def rewrite_merges_as_strings(src_dir, dst_dir):
    """Copies tokenizer.json with merges as "a b" strings (tokenizers < 0.20 format)."""
    j = json.loads((Path(src_dir) / "tokenizer.json").read_text(encoding="utf-8"))
    merges = j["model"]["merges"]
    assert merges and isinstance(merges[0], list), "expected [a, b] merges from tokenizers>=0.20"
    for a, b in merges:
        assert " " not in a and " " not in b, (a, b)
    j["model"]["merges"] = [f"{a} {b}" for a, b in merges]
    d = Path(dst_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer.json").write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")
    return d


# tokenizer_config.json contents (bos/eos/pad and a chat template) per family.
_CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
           "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
_LLAMA3_TMPL = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + "
                "message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
                "'<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
                "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
_LLAMA2_TMPL = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}"
                "{{ ' ' + message['content'] + ' ' + eos_token }}{% endif %}{% endfor %}"
                "{# — non-ASCII in a template: «ok» #}")


def _added_token_dict(content):
    return {"__type": "AddedToken", "content": content, "lstrip": False,
            "normalized": False, "rstrip": False, "single_word": False}


def write_configs(name, d):
    """Writes tokenizer_config.json (and for Mistral special_tokens_map.json) beside
    tokenizer.json, as the real models ship them."""
    d = Path(d)
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096,
           "clean_up_tokenization_spaces": False}
    stm = None
    if name.startswith("gpt2"):
        cfg.update(bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                   unk_token="<|endoftext|>")
    elif name == "llama3":
        cfg.update(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                   chat_template=_LLAMA3_TMPL)
    elif name == "qwen2":
        cfg.update(bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                   chat_template=_CHATML)
    elif name.startswith("llama2"):
        # Llama 2's files name specials as AddedToken dicts.
        cfg.update(bos_token=_added_token_dict("<s>"), eos_token=_added_token_dict("</s>"),
                   unk_token=_added_token_dict("<unk>"), pad_token=None,
                   add_bos_token=True, add_eos_token=name == "llama2-eos", legacy=True,
                   chat_template=_LLAMA2_TMPL)
    elif name.startswith("mistral"):
        # bos/eos only in special_tokens_map.json.
        cfg.update(add_bos_token=True, add_eos_token=False, legacy=False)
        stm = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=2),
                                             encoding="utf-8")
    if stm is not None:
        (d / "special_tokens_map.json").write_text(json.dumps(stm, indent=2),
                                                   encoding="utf-8")


TOKENIZER_NAMES = ["gpt2", "gpt2-strmerges", "gpt2-added", "llama3", "qwen2", "llama2",
                   "llama2-strmerges", "llama2-eos", "mistral", "mistral-llamadec"]


class Store:
    """Builds every tokenizer once (lazily) under root and hands out (dir, hf Tokenizer
    loaded from the saved tokenizer.json)."""

    def __init__(self, root, corpus, vocab_size=1500):
        self.root = Path(root)
        self.corpus = corpus
        self.vocab_size = vocab_size
        self._dirs = {}

    def dir(self, name):
        if name not in self._dirs:
            r = self.root
            if name in ("gpt2", "llama3", "qwen2", "gpt2-added"):
                b = {"gpt2": build_gpt2, "llama3": build_llama3, "qwen2": build_qwen2,
                     "gpt2-added": build_gpt2_added}[name]
                self._dirs[name] = b(r / name, self.corpus, self.vocab_size)
            elif name in ("llama2", "mistral", "mistral-llamadec", "llama2-eos"):
                self._dirs.update(build_spm_family(r, self.corpus, self.vocab_size))
            elif name.endswith("-strmerges"):
                base = name[: -len("-strmerges")]
                self._dirs[name] = rewrite_merges_as_strings(self.dir(base), r / name)
            else:
                raise KeyError(name)
            for n, d in self._dirs.items():
                if not (d / "tokenizer_config.json").exists():
                    write_configs(n, d)
        return self._dirs[name]

    def hf(self, name):
        return Tokenizer.from_file(str(self.dir(name) / "tokenizer.json"))


# ---------------------------------------------------------------------------------------
# The C harness


class FtError(Exception):
    def __init__(self, args, proc):
        self.proc = proc
        super().__init__(f"ft-tokenize {' '.join(map(str, args))} exited {proc.returncode}:\n"
                         f"{proc.stderr.decode('utf-8', 'replace')}")


def ft_exe():
    """The harness path from $FT_TOKENIZE, or (None, why)."""
    exe = os.environ.get("FT_TOKENIZE")
    if not exe:
        return None, ("FT_TOKENIZE is not set: point it at the ft-tokenize harness "
                      "(make build/tests/ft-tokenize; FT_TOKENIZE=$PWD/build/tests/ft-tokenize)")
    if not os.access(exe, os.X_OK):
        return None, f"FT_TOKENIZE={exe} is not an executable file"
    return os.path.abspath(exe), None


def run_ft(exe, args, stdin=b"", check=True, timeout=300):
    proc = subprocess.run([exe] + [str(a) for a in args], input=stdin, capture_output=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise FtError(args, proc)
    return proc


def _jsonl(items):
    return "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in items).encode("utf-8")


def ft_encode(exe, path, texts, add_special=True):
    args = ["encode", path] + ([] if add_special else ["--no-special"])
    out = run_ft(exe, args, _jsonl(texts)).stdout.decode("utf-8").split("\n")[:-1]
    assert len(out) == len(texts), f"ft-tokenize encode: {len(out)} lines for {len(texts)}"
    return [json.loads(x) for x in out]


def ft_encode_raw(exe, path, lines, add_special=True):
    """lines: bytes without newlines."""
    args = ["encode", path, "--raw"] + ([] if add_special else ["--no-special"])
    out = run_ft(exe, args, b"".join(x + b"\n" for x in lines)).stdout.decode().split("\n")[:-1]
    return [json.loads(x) for x in out]


def ft_decode(exe, path, id_lists, skip_special=False):
    args = ["decode", path] + (["--skip-special"] if skip_special else [])
    out = run_ft(exe, args, _jsonl(id_lists)).stdout.decode("utf-8").split("\n")[:-1]
    assert len(out) == len(id_lists), f"ft-tokenize decode: {len(out)} lines for {len(id_lists)}"
    return [json.loads(x) for x in out]


def ft_tokens(exe, path, id_lists):
    out = run_ft(exe, ["tokens", path], _jsonl(id_lists)).stdout.decode("utf-8").split("\n")[:-1]
    return [json.loads(x) for x in out]


def ft_info(exe, path, tokens=()):
    return json.loads(run_ft(exe, ["info", path] + list(tokens)).stdout)


def ft_bench(exe, path, file, repeat=1):
    return json.loads(run_ft(exe, ["bench", path, file, "--repeat", repeat]).stdout)


def describe_mismatch(hf, text, want, got):
    """A precise one-mismatch report: input repr, ids, tokens, first differing index."""
    i = next((k for k, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))

    def toks(ids):
        return [hf.id_to_token(x) if isinstance(x, int) else x for x in ids]
    lo = max(0, i - 3)
    shown = repr(text) if text.isascii() else f"{text!r} = {ascii(text)}"
    return (f"  input {shown}\n"
            f"    expected ids {want}\n"
            f"    got ids      {got}\n"
            f"    first difference at index {i}: expected tokens[{lo}:] {toks(want[lo:i + 4])}"
            f" got {toks(got[lo:i + 4])}")


# ---------------------------------------------------------------------------------------
# Fuzz strings

# Every White_Space code point, plus look-alikes that are not whitespace.
WHITESPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
              "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
NOT_WHITESPACE = "\u180e\u200b\u200c\u200d\u2060\ufeff\x1c\x1d\x1e\x1f"
_RANGES = [(0x20, 0x7f), (0xa0, 0x250), (0x300, 0x370), (0x370, 0x530), (0x590, 0x700),
           (0x900, 0xe00), (0x1100, 0x1200), (0x1e00, 0x2000), (0x2000, 0x2bff),
           (0x3000, 0x3100), (0x4e00, 0x4f00), (0xac00, 0xac80), (0xe000, 0xe010),
           (0xfb00, 0xfb50), (0xfe00, 0xfe10), (0xff00, 0xfff0), (0x10000, 0x10100),
           (0x1d400, 0x1d500), (0x1f300, 0x1fb00), (0x20000, 0x20010), (0xe0000, 0xe0080),
           (0x0378, 0x037a), (0x0860, 0x08a0), (0x1e030, 0x1e090), (0x31350, 0x31360)]


def fuzz_strings(seed, n, specials=()):
    """n random strings mixing ASCII words, digits, punctuation, contractions, every kind
    of whitespace, random code points from many blocks (assigned or not), combining
    marks and, when given, special/added token strings spliced in."""
    rng = random.Random(seed)

    def piece():
        k = rng.randrange(12)
        if k == 0:
            return rng.choice(_WORDS)
        if k == 1:
            return "".join(rng.choice("0123456789") for _ in range(rng.randrange(1, 9)))
        if k == 2:
            return "".join(rng.choice(WHITESPACE) for _ in range(rng.randrange(1, 4)))
        if k == 3:
            return rng.choice(NOT_WHITESPACE)
        if k == 4:
            return "'" + rng.choice(["s", "S", "t", "T", "re", "RE", "Re", "ve", "m", "M",
                                     "ll", "LL", "lL", "d", "D", "ſ", "K", "x", "", "'"])
        if k == 5:
            return rng.choice(" .,;:!?-_()[]{}<>/\\|@#$%^&*+=~`\"'")
        if k in (6, 7, 8):
            a, b = rng.choice(_RANGES)
            return "".join(chr(rng.randrange(a, b)) for _ in range(rng.randrange(1, 4)))
        if k == 9:
            return chr(rng.randrange(0x300, 0x370))
        if k == 10 and specials:
            return rng.choice(specials)
        return " "

    out = []
    for _ in range(n):
        s = "".join(piece() for _ in range(rng.randrange(1, 14)))
        out.append(s)
    return out
