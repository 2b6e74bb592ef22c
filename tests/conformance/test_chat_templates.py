"""Chat templates: ftkit's Jinja interpreter (lib/jinja/, through lib/data/chat_template.c
and the ft-data harness) against transformers' apply_chat_template, for the real templates
of every supported family (tests/conformance/templates/*.jinja, see SOURCES.md) and for
hand-written templates that exercise each construct (templates/constructs/*.jinja):

  - the rendered text equals apply_chat_template(tokenize=False), and a chat the template
    refuses (raise_exception) is refused by both, with the template's message;
  - the ids of `ft-data load` equal apply_chat_template(tokenize=True), id for id, with a
    tokenizer that has the family's special tokens;
  - the completion-only labels equal the reference: return_assistant_tokens_mask for a
    template with {% generation %} blocks, else the assistant spans found by rendering
    prefixes (test_data_pipeline.py's rule);
  - a construct the interpreter does not support is an error naming the template line;
  - ShareGPT records load as the chat they map to;
  - a named template (--template-name, data.chat_template_name) and template kwargs
    (--template-kwargs, data.chat_template_kwargs) give the ids and labels of
    apply_chat_template(chat_template=NAME, **kwargs), and the template sees every
    special token of the tokenizer's special_tokens_map.

Run:  make CUDA=0 build/tests/ft-data; FT_DATA=$PWD/build/tests/ft-data \\
          .venv/bin/python -m pytest -q tests/conformance/test_chat_templates.py
"""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
FT_DATA = os.environ.get("FT_DATA")

try:
    import jinja2  # noqa: F401  (apply_chat_template renders with it)
except ImportError as e:  # pragma: no cover
    raise ImportError("apply_chat_template needs jinja2: add it to the pins of "
                      "scripts/setup-python.sh") from e

pytestmark = pytest.mark.skipif(not FT_DATA, reason="FT_DATA (the ft-data harness) not set")

# fixture -> (bos, eos)
FIXTURES = {
    "qwen2.jinja": (None, "<|im_end|>"),
    "qwen2.5.jinja": (None, "<|im_end|>"),
    "qwen3.jinja": (None, "<|im_end|>"),
    "llama2.jinja": ("<s>", "</s>"),
    "llama3.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3.1.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3.2.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "mistral-v0.1.jinja": ("<s>", "</s>"),
    "mistral-v0.2.jinja": ("<s>", "</s>"),
    "mistral-nemo.jinja": ("<s>", "</s>"),
    "gemma2.jinja": ("<bos>", "<eos>"),
    "gemma3.jinja": ("<bos>", "<eos>"),
    "phi3.5.jinja": ("<s>", "<|endoftext|>"),
    "phi4.jinja": (None, "<|im_end|>"),
    "olmo2.jinja": ("<|endoftext|>", "<|endoftext|>"),
    "granite3.3.jinja": (None, "<|end_of_text|>"),
    "smollm3.jinja": (None, "<|im_end|>"),
}

# the special tokens of those families, added to the test tokenizer so that the
# templates' markers tokenize as single tokens, as with the real models
SPECIALS = sorted({
    "<s>", "</s>", "<bos>", "<eos>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|im_sep|>", "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
    "<|end_header_id|>", "<|eot_id|>", "<start_of_turn>", "<end_of_turn>", "<|system|>",
    "<|user|>", "<|assistant|>", "<|end|>", "<|start_of_role|>", "<|end_of_role|>",
    "[INST]", "[/INST]", "<think>", "</think>", "<tool_call>", "</tool_call>",
})

S = {"role": "system", "content": "You are terse.  "}
U1 = {"role": "user", "content": "Hello, who are you?"}
A1 = {"role": "assistant", "content": "  A model. \n"}
U2 = {"role": "user", "content": "Ünïcödé ✓ 日本語 🙂\n\tend "}
A2 = {"role": "assistant", "content": "Réponse: «ok»"}
U3 = {"role": "user", "content": ""}
A3 = {"role": "assistant", "content": "<think>\nsome thought\n</think>\n\nThe answer."}
A4 = {"role": "assistant", "content": "Plain.", "reasoning_content": "Reasoned."}
UP = {"role": "user", "content": [{"type": "text", "text": "Parts: one"},
                                  {"type": "text", "text": "two"}]}

CHATS = [
    [U1],
    [U1, A1],
    [S, U1, A1],
    [U1, A1, U2, A2],
    [S, U1, A1, U2, A2],
    [S, U2],
    [U3, A1],
    [S, U1, A1, U2],
    [U1, A3],
    [U1, A1, U2, A3],
    [S, U1, A4],
    [UP, A1],
]
# a tool call and its result (the templates that know tools render them)
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "abcdefghi", "type": "function",
     "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2.5]}}}]}
RESULT = {"role": "tool", "tool_call_id": "abcdefghi", "name": "get_weather",
          "content": "{\"sky\": \"sunny\"}"}
TOOL_CHATS = [
    [S, U1, CALL, RESULT, A2],
    [U1, CALL, RESULT, RESULT, A2, U2],
]
# chats some templates refuse (transformers raises; we must refuse too)
REFUSED = [
    [A1, U1],
    [U1, U2],
    [S, A1],
]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather «now» in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
DOCS = [{"title": "Doc A", "text": "Alpha text.", "doc_id": 1}, {"text": "Beta", "doc_id": 2}]
# template variables beyond the messages, as apply_chat_template(**kwargs) passes them
EXTRAS = [
    {},
    {"tools": TOOLS},
    {"documents": DOCS},
    {"enable_thinking": False},
]


def _hf_tokenizer(source, bos, eos, trained=None):
    """A transformers tokenizer built offline: a WordLevel one when only the text
    matters, or `trained` (a tokenizers.Tokenizer) for ids."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    if trained is None:
        vocab = {"<unk>": 0}
        for t in (bos, eos):
            if t:
                vocab.setdefault(t, len(vocab))
        trained = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    kw = {}
    if bos:
        kw["bos_token"] = bos
    if eos:
        kw["eos_token"] = eos
    hf = PreTrainedTokenizerFast(tokenizer_object=trained, **kw)
    hf.chat_template = source
    return hf


def _hf_render(hf, chat, agp, extra):
    try:
        return hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=agp,
                                      **extra)
    except Exception as e:  # jinja2 TemplateError from raise_exception, or its own error
        return {"error": str(e)}


def _ft_render(name, bos, eos, source_path, cases):
    inp = "".join(json.dumps({"messages": c, "add_generation_prompt": agp, "extra": extra})
                  + "\n" for c, agp, extra in cases)
    args = [FT_DATA, "render", name, bos or "", eos or ""]
    if source_path:
        args.append(str(source_path))
    out = subprocess.run(args, input=inp, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def _compare(name, bos, eos, path, source, cases, min_rendered):
    hf = _hf_tokenizer(source, bos, eos)
    ours = _ft_render(name, bos, eos, path, cases)
    assert len(ours) == len(cases)
    n_rendered = 0
    for (chat, agp, extra), got in zip(cases, ours):
        want = _hf_render(hf, chat, agp, extra)
        where = f"{path.name if path else name}, add_generation_prompt={agp}, extra={extra}, " \
                f"chat={chat}"
        if isinstance(want, dict):
            assert isinstance(got, dict), f"{where}: transformers raises ({want['error']}) " \
                                          f"but we rendered {got!r}"
            # a template's own raise_exception message comes through
            if "raise_exception" in got["error"]:
                assert want["error"] in got["error"], where
            continue
        assert got == want, where
        n_rendered += 1
    assert n_rendered >= min_rendered


@pytest.mark.parametrize("fixture", sorted(FIXTURES))
def test_render_matches_transformers(fixture):
    bos, eos = FIXTURES[fixture]
    path = TEMPLATES / fixture
    cases = [(c, agp, {}) for c in CHATS + REFUSED for agp in (False, True)]
    cases += [([S, U1, A1, U2], True, extra) for extra in EXTRAS[1:]]
    cases += [(c, agp, extra) for c in TOOL_CHATS for agp in (False, True)
              for extra in EXTRAS[:2]]
    cases += [([U1, A1], False, extra) for extra in EXTRAS[1:]]
    _compare("auto", bos, eos, path, path.read_text(), cases, 8)


def test_every_fixture_is_tested():
    on_disk = {p.name for p in TEMPLATES.glob("*.jinja")}
    assert on_disk == set(FIXTURES), "a fixture without a row in FIXTURES (or the reverse)"


# ---- the hand-written templates: every construct -------------------------------------

CONSTRUCT_CHATS = [
    [S, U1, A1, U2],
    [U1, A4, UP, A3],
    [{"role": "user", "content": "x", "name": "ann"},
     {"role": "assistant", "content": "", "tool_calls": [
         {"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [True, None]}}}]},
     {"role": "tool", "content": "42"}],
    [U1] * 7,
]


@pytest.mark.parametrize("fixture", sorted(p.name for p in (TEMPLATES / "constructs").glob("*.jinja")))
def test_constructs_match_transformers(fixture):
    path = TEMPLATES / "constructs" / fixture
    cases = [(c, agp, extra) for c in CONSTRUCT_CHATS for agp in (False, True)
             for extra in EXTRAS[:3]]
    _compare("auto", "<s>", "</s>", path, path.read_text(), cases, 6)


# ---- errors --------------------------------------------------------------------------

ERRORS = [
    # (template, what the error must say); every one fails in transformers too, except
    # the constructs jinja2 has and we do not (UNSUPPORTED)
    ("ok\n{% include 'other.jinja' %}", ["line 2", "unsupported statement 'include'"]),
    ("{% for m in messages %}\n{{ m | frobnicate }}\n{% endfor %}", ["line 2", "frobnicate"]),
    ("{% extends 'base' %}", ["line 1", "extends"]),
    ("a\nb\n{% if messages %}no end", ["line 3", "endif"]),
    ("{{ messages[0].role is frobbed }}", ["line 1", "frobbed"]),
    ("\n{{ 'x' % 3 }}", ["line 2", "formatting"]),
    ("{{ messages.append(1) }}", ["line 1", "append"]),
    ("{% set d = {} %}\n\n{{ d.update({'a': 1}) }}", ["line 3", "update"]),
    ("{{ raise_exception('Roles must alternate! (' ~ messages | length ~ ')') }}",
     ["Roles must alternate! (1)"]),
    ("{{ nothing.field }}", ["line 1", "'nothing' is undefined"]),
]


UNSUPPORTED = [
    ("\n{% for m in messages recursive %}{{ loop(m) }}{% endfor %}", ["line 2", "recursive"]),
    ("{{ messages | groupby('role') | list }}", ["line 1", "unsupported filter 'groupby'"]),
    ("{% set x = 1 %}\n{{ '%s' % x }}", ["line 2", "formatting"]),
]


@pytest.mark.parametrize("i", range(len(ERRORS) + len(UNSUPPORTED)))
def test_errors_name_the_line(i, tmp_path):
    src, parts = (ERRORS + UNSUPPORTED)[i]
    p = tmp_path / "t.jinja"
    p.write_text(src)
    hf = _hf_tokenizer(src, "<s>", "</s>")
    if i < len(ERRORS):
        with pytest.raises(Exception):  # transformers fails too
            hf.apply_chat_template([U1], tokenize=False)
    got = _ft_render("auto", "<s>", "</s>", p, [([U1], False, {})])[0]
    assert isinstance(got, dict), got
    for part in parts:
        assert part in got["error"], (part, got["error"])


def test_fallbacks():
    """chatml is transformers' documented ChatML template; a model without a template
    is refused under auto, with the fallbacks named."""
    chatml = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
              "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if "
              "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    cases = [(c, agp, {}) for c in CHATS if all(isinstance(m["content"], str) for m in c)
             for agp in (False, True)]
    _compare("chatml", None, "<|im_end|>", None, chatml, cases, 8)
    got = _ft_render("auto", None, None, None, [([U1], False, {})])[0]
    assert "no chat_template" in got["error"] and "chatml" in got["error"]
    out = subprocess.run([FT_DATA, "render", "llama3", "", ""], input="", capture_output=True,
                         text=True)
    assert out.returncode != 0 and "auto" in out.stderr


# ---- ids and labels through the data pipeline -----------------------------------------

CORPUS = [
    "Hello, who are you? I am a small model trained for tests.",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "Ünïcödé ✓ 日本語 🙂 Réponse: «ok» and more text to merge.",
    "user assistant system model You are a helpful assistant. Knowledge Cutoff Date",
] * 20


@pytest.fixture(scope="module")
def trained():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(CORPUS, trainer)
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    return tk.to_str()


def _ids(out):
    return out["input_ids"] if hasattr(out, "keys") else out


def _ref_labels(hf, msgs, ids, **kw):
    """Completion-only labels as transformers makes them: the {% generation %} mask, or
    the prefix rule (None when the prefix rule has no answer: ftkit must refuse). kw:
    more arguments of apply_chat_template (chat_template=NAME, tools, template kwargs)."""
    source = hf.get_chat_template(kw.get("chat_template"), kw.get("tools"))
    if re.search(r"\{%-?\s*generation\s*-?%\}", source):
        out = hf.apply_chat_template(msgs, tokenize=True, return_dict=True,
                                     return_assistant_tokens_mask=True, **kw)
        return [t if m else -100 for t, m in zip(out["input_ids"], out["assistant_masks"])]
    labels = [-100] * len(ids)
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        a = _ids(hf.apply_chat_template(msgs[:k], tokenize=True, add_generation_prompt=True,
                                        **kw))
        b = _ids(hf.apply_chat_template(msgs[:k + 1], tokenize=True, **kw))
        if ids[:len(a)] != a or ids[:len(b)] != b:
            return None
        labels[len(a):len(b)] = ids[len(a):len(b)]
    return labels


def _load(d, data, *args):
    out = subprocess.run([FT_DATA, "load", str(d), str(data), *args], capture_output=True,
                         text=True)
    return out


@pytest.mark.parametrize("fixture", sorted(FIXTURES))
def test_ids_and_labels_match_transformers(fixture, trained, tmp_path):
    from tokenizers import Tokenizer

    bos, eos = FIXTURES[fixture]
    source = (TEMPLATES / fixture).read_text()
    hf = _hf_tokenizer(source, bos, eos, Tokenizer.from_str(trained))
    d = tmp_path / "tok"
    hf.save_pretrained(d)
    n_checked = n_labels = 0
    for chat in CHATS:
        if not any(m["role"] == "assistant" for m in chat):
            continue
        if isinstance(_hf_render(hf, chat, False, {}), dict):
            continue  # the template refuses it (test_render covers that)
        want = _ids(hf.apply_chat_template(chat, tokenize=True))
        data = tmp_path / "chat.jsonl"
        data.write_text(json.dumps({"messages": chat}) + "\n")
        out = _load(d, data, "--format", "chat", "--train-on-all")
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout.splitlines()[0])
        assert got["input_ids"] == want, f"{fixture}: {chat}"
        n_checked += 1
        ref = _ref_labels(hf, chat, want)
        out = _load(d, data, "--format", "chat")
        if ref is None:
            assert out.returncode != 0 and "ambiguous" in out.stderr, (fixture, chat)
            continue
        if all(x == -100 for x in ref[1:]):
            continue  # dropped as empty by both rules
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout.splitlines()[0])
        assert got["labels"] == ref, f"{fixture}: labels of {chat}"
        n_labels += 1
    assert n_checked >= 4 and n_labels >= 1


def test_sharegpt_loads_as_the_mapped_chat(trained, tmp_path):
    from tokenizers import Tokenizer

    hf = _hf_tokenizer((TEMPLATES / "qwen2.5.jinja").read_text(), None, "<|im_end|>",
                       Tokenizer.from_str(trained))
    d = tmp_path / "tok"
    hf.save_pretrained(d)
    conv = [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Hello."}, {"from": "human", "value": "Bye"},
            {"from": "gpt", "value": "Bye."}]
    msgs = [{"role": {"system": "system", "human": "user", "gpt": "assistant"}[e["from"]],
             "content": e["value"]} for e in conv]
    (tmp_path / "sg.jsonl").write_text(json.dumps({"conversations": conv}) + "\n")
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": msgs}) + "\n")
    a = _load(d, tmp_path / "sg.jsonl")  # detected from the "conversations" key
    b = _load(d, tmp_path / "chat.jsonl", "--format", "chat")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout
    want = _ids(hf.apply_chat_template(msgs, tokenize=True))
    assert json.loads(a.stdout.splitlines()[0])["input_ids"] == want
    bad = [{"from": "human", "value": "Hi"}, {"from": "robot", "value": "beep"}]
    (tmp_path / "bad.jsonl").write_text(json.dumps({"conversations": conv}) + "\n" +
                                        json.dumps({"conversations": bad}) + "\n")
    out = _load(d, tmp_path / "bad.jsonl", "--format", "sharegpt")
    assert out.returncode != 0
    assert "bad.jsonl:2" in out.stderr and "robot" in out.stderr


def test_named_templates_tool_use(trained, tmp_path):
    """A model with several templates: chats given tools use "tool_use", the others the
    default, as apply_chat_template picks them; from the files transformers saves
    (chat_template.jinja + additional_chat_templates/) and from the older list form of
    tokenizer_config.json."""
    from tokenizers import Tokenizer

    default = (TEMPLATES / "qwen2.5.jinja").read_text()
    tool_use = (TEMPLATES / "qwen3.jinja").read_text()
    hf = _hf_tokenizer(default, None, "<|im_end|>", Tokenizer.from_str(trained))
    hf.chat_template = {"default": default, "tool_use": tool_use}
    saved = tmp_path / "saved"
    hf.save_pretrained(saved)
    listed = tmp_path / "listed"
    hf.save_pretrained(listed)
    for f in [listed / "chat_template.jinja", *(listed / "additional_chat_templates").glob("*")]:
        f.unlink()
    (listed / "additional_chat_templates").rmdir()
    cfg = json.loads((listed / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [{"name": "default", "template": default},
                            {"name": "tool_use", "template": tool_use}]
    (listed / "tokenizer_config.json").write_text(json.dumps(cfg))
    chat = [S, U1, A1]
    recs = [{"messages": chat}, {"messages": chat, "tools": TOOLS}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    want = [_ids(hf.apply_chat_template(chat, tokenize=True)),
            _ids(hf.apply_chat_template(chat, tools=TOOLS, tokenize=True))]
    assert want[0] != want[1]
    for d in (saved, listed):
        out = _load(d, tmp_path / "d.jsonl", "--format", "chat", "--train-on-all")
        assert out.returncode == 0, out.stderr
        got = [json.loads(line)["input_ids"] for line in out.stdout.splitlines()]
        assert got == want, d.name


# ---- a named template, template kwargs, the special tokens ------------------------------

def _check_ids_and_labels(hf, d, tmp_path, chats, args=(), tools=None, kw=None):
    """For each chat (a record, with "tools" when given): the ids of `ft-data load ARGS`
    equal apply_chat_template(chat, tools=tools, **kw), id for id, and the completion-only
    labels the reference's (or both refuse: the prefix rule has no answer). Returns how
    many chats had labels compared."""
    n_labels = 0
    kw = dict(kw or {})
    if tools is not None:
        kw["tools"] = tools
    for chat in chats:
        rec = {"messages": chat, **({"tools": tools} if tools is not None else {})}
        data = tmp_path / "chat.jsonl"
        data.write_text(json.dumps(rec) + "\n")
        out = _load(d, data, "--format", "chat", "--train-on-all", *args)
        try:
            want = _ids(hf.apply_chat_template(chat, tokenize=True, **kw))
        except Exception:  # the template refuses the chat: so must we
            assert out.returncode != 0, f"{args}: transformers refuses {chat}"
            continue
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout.splitlines()[0])
        assert got["input_ids"] == want, f"{args}: {chat}"
        ref = _ref_labels(hf, chat, want, **kw)
        out = _load(d, data, "--format", "chat", *args)
        if ref is None:
            assert out.returncode != 0 and "ambiguous" in out.stderr, (args, chat)
            continue
        if all(x == -100 for x in ref[1:]):
            continue  # dropped as empty by both rules
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout.splitlines()[0])
        assert got["labels"] == ref, f"{args}: labels of {chat}"
        n_labels += 1
    return n_labels


def _named_dirs(hf, tmp_path, templates):
    """The tokenizer saved with several templates in both of the forms transformers
    reads: the files of save_pretrained (chat_template.jinja for "default",
    additional_chat_templates/NAME.jinja for the others), and the older list form of
    tokenizer_config.json's chat_template."""
    hf.chat_template = dict(templates)
    saved = tmp_path / "saved"
    hf.save_pretrained(saved)
    assert (saved / "additional_chat_templates").is_dir()
    listed = tmp_path / "listed"
    hf.save_pretrained(listed)
    for f in [listed / "chat_template.jinja", *(listed / "additional_chat_templates").glob("*")]:
        f.unlink(missing_ok=True)
    (listed / "additional_chat_templates").rmdir()
    cfg = json.loads((listed / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [{"name": k, "template": v} for k, v in templates.items()]
    (listed / "tokenizer_config.json").write_text(json.dumps(cfg))
    return saved, listed


NAMED_CHATS = [[S, U1, A1], [U1, A1, U2, A2], [UP, A1]]


def test_named_template_matches_transformers(trained, tmp_path):
    """--template-name NAME (data.chat_template_name) renders every chat with the model's
    template of that name, as apply_chat_template(chat_template=NAME): ids and labels,
    with and without tools (a name holds for chats with tools too), for a model whose
    templates are files and one whose templates are tokenizer_config.json's list."""
    from transformers import AutoTokenizer
    from tokenizers import Tokenizer

    templates = {
        "default": (TEMPLATES / "qwen2.5.jinja").read_text(),
        "tool_use": (TEMPLATES / "qwen3.jinja").read_text(),
        "chatml_plain": (TEMPLATES / "qwen2.jinja").read_text(),
        "marked": ("{% for m in messages %}<|im_start|>{{ m.role }}\n"
                   "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<|im_end|>"
                   "{% endgeneration %}{% else %}{{ m.content }}<|im_end|>{% endif %}\n"
                   "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                   "{% endif %}"),
    }
    hf = _hf_tokenizer(templates["default"], None, "<|im_end|>", Tokenizer.from_str(trained))
    for d in _named_dirs(hf, tmp_path, templates):
        ref = AutoTokenizer.from_pretrained(d)  # the templates as transformers reads them
        assert sorted(ref.chat_template) == sorted(templates), d.name
        n = 0
        for name in templates:
            for tools in (None, TOOLS):
                n += _check_ids_and_labels(ref, d, tmp_path, NAMED_CHATS,
                                           ("--template-name", name), tools=tools,
                                           kw={"chat_template": name})
        assert n >= 8, d.name
        # no name: transformers' rule (tool_use for a record with tools)
        _check_ids_and_labels(ref, d, tmp_path, NAMED_CHATS[:1], tools=TOOLS)
        _check_ids_and_labels(ref, d, tmp_path, NAMED_CHATS[:1])
        # a name the model has no template of is refused, naming them all (transformers
        # would render the name itself as a template)
        data = tmp_path / "chat.jsonl"
        data.write_text(json.dumps({"messages": NAMED_CHATS[0]}) + "\n")
        out = _load(d, data, "--format", "chat", "--template-name", "rag")
        assert out.returncode != 0
        assert "no chat template named 'rag'" in out.stderr
        for name in templates:
            assert name in out.stderr
        out = _load(d, data, "--format", "chat", "--template", "chatml", "--template-name",
                    "default")
        assert out.returncode != 0 and "auto" in out.stderr


def test_template_kwargs_match_transformers(trained, tmp_path):
    """--template-kwargs JSON (data.chat_template_kwargs) gives the template more
    variables, as apply_chat_template(**kwargs): Qwen3's enable_thinking, and a
    hand-written template reading a kwarg of each JSON type."""
    from tokenizers import Tokenizer

    qwen3 = (TEMPLATES / "qwen3.jinja").read_text()
    hf = _hf_tokenizer(qwen3, None, "<|im_end|>", Tokenizer.from_str(trained))
    d = tmp_path / "qwen3"
    hf.save_pretrained(d)
    chats = [[U1, A1], [S, U1, A3], [U1, A4], [U1, A1, U2, A2]]
    texts = set()
    for kw in ({"enable_thinking": False}, {"enable_thinking": True}, {}):
        _check_ids_and_labels(hf, d, tmp_path, chats, ("--template-kwargs", json.dumps(kw)),
                              kw=kw)
        texts.add(hf.apply_chat_template([U1], tokenize=False, add_generation_prompt=True,
                                         **kw))
    # enable_thinking false renders the generation prompt (so the label spans) differently
    assert len(texts) == 2

    typed = ("{%- for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor -%}"
             "s={{ s }}|{{ s | upper }} i={{ i + 1 }} {{ i // 2 }} f={{ f * 2 }} {{ f }}"
             " b={{ b }}{% if b %} yes{% endif %} n={{ n is none }}{{ n }}"
             " l={{ l | length }} {{ l[1] }} {{ l }} {{ l | tojson }}"
             " d={{ d.k }} {{ d['z'] }} {{ d | tojson }} {{ d | dictsort }}"
             "{% if add_generation_prompt %}assistant:{% endif %}")
    hf = _hf_tokenizer(typed, "<s>", "</s>", Tokenizer.from_str(trained))
    d = tmp_path / "typed"
    hf.save_pretrained(d)
    kw = {"s": "str «x» \"q\"", "i": 41, "f": 1.25, "b": True, "n": None,
          "l": [1, "two", [3.5, False]], "d": {"z": [None, {"y": 0}], "k": "v"}}
    text = hf.apply_chat_template([U1, A1], tokenize=False, **kw)
    assert "i=42 20 f=2.5 1.25 b=True yes n=TrueNone l=3 two" in text, text
    _check_ids_and_labels(hf, d, tmp_path, [[U1, A1], [S, U1, A1]],
                          ("--template-kwargs", json.dumps(kw)), kw=kw)
    # the names transformers sets itself are refused, naming the name
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": [U1, A1]}) + "\n")
    for bad in ({"add_generation_prompt": True}, {"messages": []}, {"eos_token": "x"},
                {"tools": []}):
        out = _load(d, data, "--format", "chat", "--template-kwargs", json.dumps(bad))
        assert out.returncode != 0 and f"'{next(iter(bad))}'" in out.stderr, out.stderr


def test_special_tokens_reach_the_template(trained, tmp_path):
    """The template sees every special token of the tokenizer's special_tokens_map: bos,
    eos, unk, sep, pad, cls, mask and model-specific ones, as transformers passes them."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    from tokenizers import Tokenizer

    names = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
             "mask_token", "image_token", "boi_token"]
    src = ("{%- for m in messages %}" + "".join(
        "{{ %s if %s is defined else '[no %s]' }}" % (n, n, n) for n in names) +
        "{{ m.role }}: {{ m.content }}\n{% endfor %}")
    hf = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(trained), bos_token="<s>", eos_token="</s>",
        sep_token="<|im_sep|>", cls_token="<|system|>", mask_token="<|user|>",
        pad_token="<|end|>", extra_special_tokens={"image_token": "<|assistant|>"})
    hf.chat_template = src
    d = tmp_path / "tok"
    hf.save_pretrained(d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["boi_token"] = {"__type": "AddedToken", "content": "<bos>", "lstrip": False,
                        "normalized": False, "rstrip": False, "single_word": False,
                        "special": True}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    ref = AutoTokenizer.from_pretrained(d)
    assert {"sep_token", "cls_token", "mask_token", "image_token", "boi_token"} <= \
        set(ref.special_tokens_map), ref.special_tokens_map
    text = ref.apply_chat_template([U1, A1], tokenize=False)
    assert "<|im_sep|><|end|><|system|><|user|><|assistant|><bos>" in text, text
    n = _check_ids_and_labels(ref, d, tmp_path, [[U1, A1]])
    assert n == 1


FT_TRAIN = os.environ.get("FT_TRAIN")


@pytest.mark.skipif(not FT_TRAIN, reason="FT_TRAIN (bin/ft-train) not set")
def test_run_config_keys(trained, tmp_path):
    """The run config's data.chat_template_name and data.chat_template_kwargs (a YAML
    mapping) reach the data ft-train prepares (--dump-data), equal to
    apply_chat_template(chat_template=NAME, **kwargs); a bad name or a reserved kwarg is
    an error naming the key (and for the file, its line)."""
    from transformers import AutoTokenizer
    from tokenizers import Tokenizer

    other = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
             "{% endfor %}{{ x | tojson }} {{ sep_token }} "
             "{{ 'thinking' if enable_thinking else 'quiet' }}")
    templates = {"default": (TEMPLATES / "qwen3.jinja").read_text(), "other": other}
    hf = _hf_tokenizer(templates["default"], None, "<|im_end|>", Tokenizer.from_str(trained))
    hf.sep_token = "<|im_sep|>"
    saved, _ = _named_dirs(hf, tmp_path, templates)
    ref = AutoTokenizer.from_pretrained(saved)
    chats = [[S, U1, A1], [U1, A1, U2, A2]]
    kw = {"enable_thinking": False, "x": [1, 2.5, {"k": None}]}

    def run(data_yaml, *extra):
        cfg = tmp_path / "run.yaml"
        cfg.write_text(f"model:\n  name: {saved}\ntrain:\n  batch_size: 1\n"
                       "data:\n  train_path: \"-\"\n  shuffle: false\n  format: chat\n"
                       "  train_on_all: true\n" + data_yaml)
        recs = "".join(json.dumps({"messages": c}) + "\n" for c in chats)
        return subprocess.run([FT_TRAIN, "--config", str(cfg), *extra], input=recs,
                              capture_output=True, text=True)

    out = run("  chat_template_name: other\n  chat_template_kwargs:\n"
              "    enable_thinking: false\n    x: [1, 2.5, {k: null}]\n", "--dump-data", "-")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line)["input_ids"] for line in out.stdout.splitlines()]
    want = [_ids(ref.apply_chat_template(c, tokenize=True, chat_template="other", **kw))
            for c in chats]
    assert rows == want
    assert "quiet" in ref.apply_chat_template(chats[0], tokenize=False, chat_template="other",
                                              **kw)
    # the resolved config keeps the kwargs as their JSON text
    out = run("  chat_template_kwargs: {enable_thinking: false}\n", "--get",
              "data.chat_template_kwargs")
    assert out.returncode == 0 and json.loads(out.stdout) == {"enable_thinking": False}
    out = run("  chat_template_name: rag\n", "--dump-data", "-")
    assert out.returncode != 0
    assert "data.chat_template_name" in out.stderr and "default, other" in out.stderr
    out = run("  chat_template_kwargs:\n    tools: []\n", "--dump-data", "-")
    assert out.returncode != 0
    assert "run.yaml:10" in out.stderr and "data.chat_template_kwargs" in out.stderr
    assert "'tools'" in out.stderr
    out = run("", "--dump-data", "-", "--set",
              'data.chat_template_kwargs={"sep_token": "x"}')
    assert out.returncode != 0 and "'sep_token'" in out.stderr
