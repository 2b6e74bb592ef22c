"""Chat templates: ftkit's renderer (lib/data/chat_template.c, through the ft-data harness)
against transformers' apply_chat_template(messages, tokenize=False,
add_generation_prompt=...) with the real Jinja templates of each family
(tests/conformance/templates/*.jinja, copied from the models' tokenizer_config.json).

Run:  FT_DATA=$PWD/build/tests/ft-data .venv/bin/python -m pytest -q \
          tests/conformance/test_chat_templates.py
"""

import json
import os
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

# fixture -> (detected name, bos, eos)
FIXTURES = {
    "qwen2.5.jinja": ("chatml", None, "<|im_end|>"),
    "qwen2.jinja": ("chatml", None, "<|im_end|>"),
    "llama3.jinja": ("llama3", "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.1.jinja": ("llama3", "<|begin_of_text|>", "<|eot_id|>"),
    "llama2.jinja": ("llama2", "<s>", "</s>"),
    "mistral-v0.1.jinja": ("mistral", "<s>", "</s>"),
    "mistral-v0.2.jinja": ("mistral", "<s>", "</s>"),
}

S = {"role": "system", "content": "You are terse.  "}
U1 = {"role": "user", "content": "Hello, who are you?"}
A1 = {"role": "assistant", "content": "  A model. \n"}
U2 = {"role": "user", "content": "Ünïcödé ✓ 日本語 🙂\n\tend "}
A2 = {"role": "assistant", "content": "Réponse: «ok»"}
U3 = {"role": "user", "content": ""}

CHATS = [
    [U1],
    [U1, A1],
    [S, U1, A1],
    [U1, A1, U2, A2],
    [S, U1, A1, U2, A2],
    [S, U2],
    [U3, A1],
    [S, U1, A1, U2],
]
# chats some templates refuse (transformers raises; we must error too)
REFUSED = [
    [A1, U1],
    [U1, U2],
    [S, A1],
]


def _hf_tokenizer(source, bos, eos):
    """A transformers tokenizer object built offline around a tiny tokenizers model; only
    the chat template and the special token strings matter here."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0}
    for t in (bos, eos):
        if t:
            vocab.setdefault(t, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    kw = {"unk_token": "<unk>"}
    if bos:
        kw["bos_token"] = bos
    if eos:
        kw["eos_token"] = eos
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, **kw)
    hf.chat_template = source
    return hf


def _hf_render(hf, chat, agp):
    try:
        return hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=agp)
    except Exception as e:  # jinja2 TemplateError from raise_exception
        return {"error": str(e)}


def _ft_render(name, bos, eos, source_path, cases):
    inp = "".join(json.dumps({"messages": c, "add_generation_prompt": agp}) + "\n"
                  for c, agp in cases)
    args = [FT_DATA, "render", name, bos or "", eos or ""]
    if source_path:
        args.append(str(source_path))
    out = subprocess.run(args, input=inp, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.mark.parametrize("fixture", sorted(FIXTURES))
def test_detect(fixture):
    out = subprocess.run([FT_DATA, "detect", str(TEMPLATES / fixture)], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == FIXTURES[fixture][0]


@pytest.mark.parametrize("fixture", sorted(FIXTURES))
def test_render_matches_transformers(fixture):
    name, bos, eos = FIXTURES[fixture]
    source = (TEMPLATES / fixture).read_text()
    hf = _hf_tokenizer(source, bos, eos)
    cases = [(c, agp) for c in CHATS + REFUSED for agp in (False, True)]
    ours = _ft_render("auto", bos, eos, TEMPLATES / fixture, cases)
    assert len(ours) == len(cases)
    n_rendered = 0
    for (chat, agp), got in zip(cases, ours):
        want = _hf_render(hf, chat, agp)
        if isinstance(want, dict):
            assert isinstance(got, dict), f"{fixture}: transformers raises ({want['error']}) " \
                                          f"but we rendered {got!r} for {chat}"
            continue
        assert got == want, f"{fixture}, add_generation_prompt={agp}, chat={chat}"
        n_rendered += 1
    assert n_rendered >= 8


def test_named_template_without_source_is_newest_variant():
    """Naming the family without a source renders Qwen2.5 and Llama 3.1."""
    for fixture, name in (("qwen2.5.jinja", "chatml"), ("llama3.1.jinja", "llama3")):
        _, bos, eos = FIXTURES[fixture]
        hf = _hf_tokenizer((TEMPLATES / fixture).read_text(), bos, eos)
        cases = [(c, agp) for c in CHATS for agp in (False, True)]
        ours = _ft_render(name, bos, eos, None, cases)
        for (chat, agp), got in zip(cases, ours):
            assert got == _hf_render(hf, chat, agp)
