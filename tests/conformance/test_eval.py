"""ft-eval (bin/ft-eval) against transformers + PEFT.

  loss         the mean cross-entropy over every counted token of the data set, with ids and
               labels made by the data pipeline's rules (as test_data_pipeline.py's
               reference makes them: tok(prompt + completion) + [eos], the prompt's tokens
               -100; truncation to max_seq_len; samples with no counted label dropped),
               equal to transformers' loss over the same ids / labels (sum of per-sample
               token losses / total counted tokens) within 1e-5 relative; perplexity =
               exp(loss); tokens and samples exact. Also with a PEFT adapter (PeftModel).
  --generate   greedy continuation ids equal to model.generate(do_sample=False,
               max_new_tokens=N) (also when an EOS id stops it early); rougeL equal to the
               rouge_score package's (or, when it is not installed, to the reference here,
               which follows its tokenizer: lower, [^a-z0-9]+ -> space, LCS F1).
  stdin        --data - gives the same result, with and without --generate.
  errors       a malformed JSONL line: exit 1 naming FILE:LINE (<stdin>:LINE from stdin).

The model is a tiny random llama made by ftref with a tiny byte-level BPE tokenizer trained
with `tokenizers` saved beside it (PreTrainedTokenizerFast.save_pretrained).

Run:  FT_EVAL=$PWD/bin/ft-eval .venv/bin/python -m pytest -q tests/conformance/test_eval.py
"""

import json
import math
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

import ftref

FT_EVAL = os.environ.get("FT_EVAL")
TOL = ftref.TOL_LOSSES

SPECIALS = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2: the model config's pad / bos / eos
CORPUS = [
    "Hello, who are you? I am a small model trained for tests.",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "user assistant system You are a helpful assistant.",
    "Ünïcödé ✓ 日本語 🙂 and more text to merge.",
] * 20

PC = [
    {"prompt": "Hello, who are you?", "completion": " I am a small model."},
    {"prompt": "The quick brown", "completion": " fox jumps over the lazy dog."},
    {"prompt": "Ünïcödé ✓ ", "completion": "日本語 🙂"},
    {"prompt": "user: ", "completion": "You are a helpful assistant."},
    {"prompt": "0123", "completion": "456789"},
]


@pytest.fixture(scope="session")
def ft_eval():
    if not FT_EVAL:
        pytest.fail("FT_EVAL is not set: point it at bin/ft-eval (make tools)", pytrace=False)
    if not os.access(FT_EVAL, os.X_OK):
        pytest.fail(f"FT_EVAL={FT_EVAL} is not an executable", pytrace=False)
    return FT_EVAL


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """(model dir with tokenizer, HF tokenizer, HF model)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(CORPUS, trainer)
    tk.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>",
                                     pad_token="<pad>")
    assert [hf_tok.convert_tokens_to_ids(t) for t in SPECIALS] == [0, 1, 2]
    shape = ftref.Shape("eval_llama", "llama", ftref._cfg(vocab_size=len(hf_tok)), seed=7)
    d = ftref.build_model_dir(shape, tmp_path_factory.mktemp("eval") / "model")
    hf_tok.save_pretrained(d)
    return d, hf_tok, ftref.load_hf(d)


def _write(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path


def _run(ft_eval, *args, stdin=None, rc=0):
    out = subprocess.run([ft_eval, *map(str, args)], input=stdin, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == rc, f"exit {out.returncode}, stderr:\n{out.stderr}"
    return out


def _json(ft_eval, *args, stdin=None):
    return json.loads(_run(ft_eval, *args, "--json", stdin=stdin).stdout)


def _ref_samples(tok, records, max_len):
    """ids / labels as test_data_pipeline.py's _ref_pc and _finish make them."""
    out = []
    for r in records:
        ids = tok(r["prompt"] + r["completion"]).input_ids
        if ids[-1] != tok.eos_token_id:
            ids = ids + [tok.eos_token_id]
        labels = list(ids)
        n = len(tok(r["prompt"]).input_ids)
        labels[:n] = [-100] * min(n, len(labels))
        ids, labels = ids[:max_len], labels[:max_len]
        if any(x != -100 for x in labels[1:]):
            out.append((ids, labels))
    return out


def _ref_loss(model, samples):
    """transformers' mean loss of each sample times its counted tokens, summed, over the
    total counted tokens: the mean over every counted token of the set."""
    total, count = 0.0, 0
    for ids, labels in samples:
        n = sum(1 for x in labels[1:] if x != -100)
        _, loss = ftref.hf_forward(model, torch.tensor([ids]), torch.tensor([labels]))
        total += float(loss.double()) * n
        count += n
    return total / count, count


def _check_loss(got, want_loss, want_tokens, want_samples):
    assert got["tokens"] == want_tokens and got["samples"] == want_samples, got
    ftref.assert_close("loss", torch.tensor([got["loss"]]), torch.tensor([want_loss]), TOL)
    ftref.assert_close("perplexity", torch.tensor([got["perplexity"]]),
                       torch.tensor([math.exp(want_loss)]), TOL)


@pytest.mark.parametrize("batch_size", [1, 2, 8])
@pytest.mark.parametrize("max_len", [2048, 9])
def test_loss(ft_eval, env, tmp_path, batch_size, max_len):
    d, tok, model = env
    data = _write(tmp_path / "pc.jsonl", PC)
    samples = _ref_samples(tok, PC, max_len)
    assert samples
    want, n = _ref_loss(model, samples)
    got = _json(ft_eval, "--model", d, "--data", data, "--batch-size", batch_size,
                "--max-seq-len", max_len)
    _check_loss(got, want, n, len(samples))


def test_loss_text_format(ft_eval, env, tmp_path):
    d, tok, model = env
    texts = ["Hello, who are you?", "The quick brown fox jumps over the lazy dog.", "日本語 🙂"]
    data = _write(tmp_path / "text.jsonl", [{"text": t} for t in texts])
    samples = []
    for t in texts:
        ids = tok(t).input_ids + [tok.eos_token_id]
        samples.append((ids, list(ids)))
    want, n = _ref_loss(model, samples)
    _check_loss(_json(ft_eval, "--model", d, "--data", data), want, n, len(samples))


# (and the adapters of issue 24: DoRA, modules_to_save, LoRA on the embedding and the head)
ADAPTERS = [(["q_proj", "v_proj"], {}), (list(ftref.SEVEN), {}),
            (list(ftref.SEVEN), dict(use_dora=True)),
            (["q_proj"], dict(modules_to_save=["embed_tokens", "lm_head"])),
            (["q_proj", "embed_tokens", "lm_head"], {}),
            # rank_pattern / alpha_pattern: each pair its rank and scaling
            (list(ftref.SEVEN) + ["lm_head"],
             dict(rank_pattern={"model.layers.0.self_attn.q_proj": 2, "q_proj": 6,
                                "lm_head": 3, "layers.1.mlp.down_proj": 5},
                  alpha_pattern={"v_proj": 3, "lm_head": 20}))]


@pytest.mark.parametrize("targets,extra", ADAPTERS,
                         ids=["qv", "seven", "dora", "modules_to_save", "embed_head",
                              "patterns"])
def test_loss_with_adapter(ft_eval, env, tmp_path, targets, extra):
    d, tok, _ = env
    adapter = ftref.build_adapter(d, tmp_path / "adapter", target_modules=targets, seed=3,
                                  **extra)
    # dropout in the adapter config must not apply in evaluation
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["lora_dropout"] = 0.3
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    model = ftref.lora_mode_model(d, adapter)
    data = _write(tmp_path / "pc.jsonl", PC)
    samples = _ref_samples(tok, PC, 2048)
    want, n = _ref_loss(model, samples)
    got = _json(ft_eval, "--model", d, "--adapter", adapter, "--data", data, "--batch-size", 3)
    _check_loss(got, want, n, len(samples))
    # the adapter changes the loss (B is random, not zero)
    base = _json(ft_eval, "--model", d, "--data", data)
    assert abs(base["loss"] - got["loss"]) > 1e-4


ADDED = ["<|im_start|>", "<|im_end|>", "<tool>"]


@pytest.mark.parametrize("extra", [dict(target_modules=["q_proj"],
                                        modules_to_save=["embed_tokens", "lm_head"]),
                                   dict(target_modules=["q_proj", "v_proj"]),
                                   dict(target_modules=["q_proj", "embed_tokens", "lm_head"])],
                         ids=["modules_to_save", "saved_embeddings", "embed_head"])
def test_loss_with_added_tokens(ft_eval, env, tmp_path, extra):
    """Chat tokens added as PEFT users add them: tokenizer.add_special_tokens, the model
    resize_token_embeddings'd, get_peft_model, the adapter and the tokenizer saved in one
    dir. ft-eval --adapter takes the adapter dir's tokenizer and vocabulary (the data
    uses the new tokens); the loss is PEFT's on the reloaded adapter."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoTokenizer

    d, _, _ = env
    tok = AutoTokenizer.from_pretrained(str(d))
    V = len(tok)
    assert tok.add_special_tokens({"additional_special_tokens": ADDED}) == len(ADDED)
    base = ftref.load_hf(d)
    torch.manual_seed(3)
    base.resize_token_embeddings(len(tok))
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                         task_type="CAUSAL_LM", **extra))
    ftref.perturb_adapter_(pm, torch.Generator().manual_seed(11))
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "README.md").write_text("---\nlibrary_name: peft\n---\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm.save_pretrained(str(adapter), safe_serialization=True)
    tok.save_pretrained(str(adapter))
    base2 = ftref.load_hf(d)
    base2.resize_token_embeddings(len(AutoTokenizer.from_pretrained(str(adapter))))
    model = PeftModel.from_pretrained(base2, str(adapter))
    model.eval()
    records = [{"prompt": "<|im_start|>user Hello, who are you?<|im_end|>",
                "completion": "<|im_start|> I am a small model.<tool><|im_end|>"},
               {"prompt": "The quick<tool>", "completion": " brown fox<|im_end|>"}]
    data = _write(tmp_path / "pc.jsonl", records)
    samples = _ref_samples(tok, records, 2048)
    assert all(V <= i for i in tok.convert_tokens_to_ids(ADDED))
    assert sum(i >= V for ids, _ in samples for i in ids) >= 6  # the new tokens are used
    want, n = _ref_loss(model, samples)
    got = _json(ft_eval, "--model", d, "--adapter", adapter, "--data", data, "--batch-size", 2)
    _check_loss(got, want, n, len(samples))
    # ft-merge: the merged checkpoint has the new vocabulary and the adapter's tokenizer,
    # and transformers reads it (AutoTokenizer, AutoModelForCausalLM) to the same loss
    merged = tmp_path / "merged"
    ftref.run_tool([ftref.tool_exe("FT_MERGE", "ft-merge"), "--model", d, "--adapter", adapter,
                    "--out", merged, "--dtype", "f32"])
    mtok = AutoTokenizer.from_pretrained(str(merged))
    assert len(mtok) == len(tok) and mtok.convert_tokens_to_ids(ADDED) == \
        tok.convert_tokens_to_ids(ADDED)
    assert json.loads((merged / "config.json").read_text())["vocab_size"] == len(tok)
    mwant, mn = _ref_loss(ftref.load_hf(merged), _ref_samples(mtok, records, 2048))
    assert mn == n
    ftref.assert_close("merged loss", torch.tensor([mwant]), torch.tensor([want]), TOL)
    _check_loss(_json(ft_eval, "--model", merged, "--data", data, "--batch-size", 2), want, n,
                len(samples))


# ---- generation ------------------------------------------------------------------------

def _rouge_tokens(text):
    return [t for t in re.split(r"\s+", re.sub(r"[^a-z0-9]+", " ", text.lower())) if t]


def _rouge_l(ref, pred):
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        r, p = _rouge_tokens(ref), _rouge_tokens(pred)
        if not r or not p:
            return 0.0
        t = [[0] * (len(p) + 1) for _ in range(len(r) + 1)]
        for i in range(1, len(r) + 1):
            for j in range(1, len(p) + 1):
                t[i][j] = t[i - 1][j - 1] + 1 if r[i - 1] == p[j - 1] else max(t[i - 1][j],
                                                                                t[i][j - 1])
        prec, rec = t[-1][-1] / len(p), t[-1][-1] / len(r)
        return 2 * prec * rec / (prec + rec) if prec + rec > 0 else 0.0
    return rouge_scorer.RougeScorer(["rougeL"]).score(ref, pred)["rougeL"].fmeasure


def _no_fsdp():
    """transformers' generate asks whether the model is FSDP-managed by importing
    torch.distributed.fsdp, which Debian's torch 1.13 cannot import under Python 3.11 (a
    dataclass with a mutable default). Nothing here is FSDP: answer no without the import."""
    import transformers.generation.utils as gu

    if hasattr(gu, "is_fsdp_managed_module"):
        gu.is_fsdp_managed_module = lambda module: False


def _hf_generate(model, ids, n, eos=None):
    _no_fsdp()
    kw = {} if eos is None else {"eos_token_id": eos}
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                             dtype=torch.long), do_sample=False, max_new_tokens=n,
                             pad_token_id=0, **kw)
    return out[0, len(ids):].tolist()


def _check_generation(tok, model, preds, prompts, refs, n, eos_ids=(2,), eos_kw=None):
    assert len(preds) == len(prompts)
    rouges = []
    for p, prompt_ids, ref in zip(preds, prompts, refs):
        want = _hf_generate(model, prompt_ids, n, eos_kw)
        assert p["generated_ids"] == want, (p["prompt"], p["generated_ids"], want)
        text_ids = want[:-1] if want and want[-1] in eos_ids else want
        assert p["prediction"] == tok.decode(text_ids, skip_special_tokens=True)
        assert p["reference"] == ref
        r = _rouge_l(ref, p["prediction"])
        assert p["rougeL"] == pytest.approx(r, abs=1e-12)
        rouges.append(r)
    return rouges


def test_generate_prompt_completion(ft_eval, env, tmp_path):
    d, tok, model = env
    data = _write(tmp_path / "pc.jsonl", PC)
    preds_path = tmp_path / "pred.jsonl"
    n = 6
    got = _json(ft_eval, "--model", d, "--data", data, "--generate", "--max-new-tokens", n,
                "--predictions", preds_path)
    preds = [json.loads(x) for x in preds_path.read_text().splitlines()]
    assert [p["prompt"] for p in preds] == [r["prompt"] for r in PC]
    rouges = _check_generation(tok, model, preds, [tok(r["prompt"]).input_ids for r in PC],
                               [r["completion"] for r in PC], n)
    assert got["generated"] == len(PC)
    assert got["rougeL"] == pytest.approx(sum(rouges) / len(rouges), abs=1e-12)
    em = sum(p["prediction"].strip() == p["reference"].strip() for p in preds) / len(preds)
    assert got["exact_match"] == pytest.approx(em, abs=1e-12)
    # the loss part is the same as without --generate
    base = _json(ft_eval, "--model", d, "--data", data)
    assert got["loss"] == base["loss"] and got["tokens"] == base["tokens"]


def test_rouge_against_reference_scorer(ft_eval, env, tmp_path):
    """References built from the model's own predictions (so that they overlap): every
    sample's rougeL equals rouge_score's (or the reference scorer's here)."""
    d, _, _ = env
    data = _write(tmp_path / "pc.jsonl", PC)
    preds_path = tmp_path / "pred.jsonl"
    args = ["--model", d, "--generate", "--max-new-tokens", 10, "--predictions", preds_path]
    _json(ft_eval, "--data", data, *args)
    first = [json.loads(x)["prediction"] for x in preds_path.read_text().splitlines()]
    variants = [lambda t: t, lambda t: t.upper() + " And, More words!",
                lambda t: "x " + " ".join(reversed(t.split())), 
                lambda t: "The 66666 " + t[: len(t) // 2],
                lambda t: "unrelated words only"]
    records = [{"prompt": r["prompt"], "completion": variants[i % len(variants)](first[i]) or "z"}
               for i, r in enumerate(PC)]
    got = _json(ft_eval, "--data", _write(tmp_path / "pc2.jsonl", records), *args)
    preds = [json.loads(x) for x in preds_path.read_text().splitlines()]
    assert [p["prediction"] for p in preds] == first
    want = [_rouge_l(r["completion"], p) for r, p in zip(records, first)]
    assert [p["rougeL"] for p in preds] == pytest.approx(want, abs=1e-12)
    assert any(w > 0 for w in want), want
    assert got["rougeL"] == pytest.approx(sum(want) / len(want), abs=1e-12)


def test_generate_stops_at_eos(ft_eval, env, tmp_path):
    """config.json's eos_token_id made the third token greedy decoding produces: both
    stop there, the EOS included in the ids and left out of the text."""
    d, tok, model = env
    rec = PC[1]
    prompt_ids = tok(rec["prompt"]).input_ids
    free_run = _hf_generate(model, prompt_ids, 8)
    stop = free_run[2]
    assert stop != 2
    d2 = tmp_path / "model-eos"
    shutil.copytree(d, d2)
    for name in ("config.json", "generation_config.json"):
        p = d2 / name
        if p.exists():
            c = json.loads(p.read_text())
            c["eos_token_id"] = [2, stop]
            p.write_text(json.dumps(c))
    model2 = ftref.load_hf(d2)
    want = _hf_generate(model2, prompt_ids, 8)
    assert want == free_run[:free_run.index(stop) + 1]
    data = _write(tmp_path / "one.jsonl", [rec])
    preds_path = tmp_path / "pred.jsonl"
    _json(ft_eval, "--model", d2, "--data", data, "--generate", "--max-new-tokens", 8,
          "--predictions", preds_path)
    preds = [json.loads(x) for x in preds_path.read_text().splitlines()]
    _check_generation(tok, model2, preds, [prompt_ids], [rec["completion"]], 8,
                      eos_ids=(2, stop))


def test_generate_chat_plain_template(ft_eval, env, tmp_path):
    """A chat's last assistant turn is the reference, the prompt the rendering of the
    messages before it with the generation prompt (plain template: "role: content\\n",
    then "assistant: "), encoded without special tokens."""
    d, tok, model = env
    chats = [[{"role": "user", "content": "Hello, who are you?"},
              {"role": "assistant", "content": "I am a small model."}],
             [{"role": "system", "content": "You are terse."},
              {"role": "user", "content": "The quick"},
              {"role": "assistant", "content": "brown fox"},
              {"role": "user", "content": "more"},
              {"role": "assistant", "content": "jumps over the lazy dog."}]]
    data = _write(tmp_path / "chat.jsonl", [{"messages": m} for m in chats])
    preds_path = tmp_path / "pred.jsonl"
    n = 5
    _json(ft_eval, "--model", d, "--data", data, "--template", "plain", "--generate",
          "--max-new-tokens", n, "--predictions", preds_path)
    preds = [json.loads(x) for x in preds_path.read_text().splitlines()]
    prompts = ["".join(f"{m['role']}: {m['content']}\n" for m in c[:-1]) + "assistant: "
               for c in chats]
    assert [p["prompt"] for p in preds] == prompts
    _check_generation(tok, model, preds,
                      [tok(p, add_special_tokens=False).input_ids for p in prompts],
                      [c[-1]["content"] for c in chats], n)


@pytest.mark.parametrize("generate", [False, True])
def test_stdin(ft_eval, env, tmp_path, generate):
    d, _, _ = env
    data = _write(tmp_path / "pc.jsonl", PC)
    extra = ["--generate", "--max-new-tokens", 3] if generate else []
    from_file = _json(ft_eval, "--model", d, "--data", data, *extra)
    from_stdin = _json(ft_eval, "--model", d, "--data", "-", *extra, stdin=data.read_text())
    assert from_stdin == from_file


@pytest.mark.parametrize("generate", [False, True])
def test_malformed_line(ft_eval, env, tmp_path, generate):
    d, _, _ = env
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(PC[0]) + "\n" + '{"prompt": "x", "completion": \n')
    extra = ["--generate"] if generate else []
    out = _run(ft_eval, "--model", d, "--data", bad, *extra, rc=1)
    assert out.stdout == ""
    assert out.stderr.startswith("ft-eval: error: ") and f"{bad}:2:" in out.stderr, out.stderr
    out = _run(ft_eval, "--model", d, "--data", "-", *extra, stdin=bad.read_text(), rc=1)
    assert "<stdin>:2:" in out.stderr and "ft-eval-stdin" not in out.stderr, out.stderr


def test_usage(ft_eval, env):
    d, _, _ = env
    out = _run(ft_eval, "--help")
    assert out.stdout.startswith("usage: ft-eval")
    for args in (["--data", "x.jsonl"], ["--model", d], ["--model", d, "--data", "x", "--bogus"],
                 ["--model", d, "--data", "x", "--batch-size", "0"],
                 ["--model", d, "--data", "x", "--predictions", "p.jsonl"]):
        out = _run(ft_eval, *args, rc=2)
        assert out.stderr.startswith("ft-eval: error: "), out.stderr


def test_text_summary(ft_eval, env, tmp_path):
    d, _, _ = env
    data = _write(tmp_path / "pc.jsonl", PC)
    out = _run(ft_eval, "--model", d, "--data", data).stdout
    assert re.search(r"^loss\s+\d+\.\d+$", out, re.M) and re.search(r"^perplexity\s", out, re.M)
    assert re.search(r"^tokens\s+\d+$", out, re.M) and re.search(r"^samples\s+5$", out, re.M)


def test_device_option(ft_eval, env, tmp_path):
    """--device cpu is the fp32 reference (what auto gives without a GPU, as here); an
    unknown device is a usage error naming it."""
    d, tok, model = env
    data = _write(tmp_path / "pc.jsonl", PC)
    samples = _ref_samples(tok, PC, 64)
    want, n = _ref_loss(model, samples)
    _check_loss(_json(ft_eval, "--model", d, "--data", data, "--max-seq-len", 64,
                      "--device", "cpu"), want, n, len(samples))
    out = _run(ft_eval, "--model", d, "--data", data, "--device", "tpu", rc=2)
    assert "--device: 'tpu' is not auto, cpu or cuda" in out.stderr


def test_generate_chat_named_template_and_kwargs(ft_eval, env, tmp_path):
    """--template-name picks a named template of the model (additional_chat_templates/
    NAME.jinja) and --template-kwargs gives it variables: the prompt of each chat is what
    apply_chat_template(messages[:-1], chat_template=NAME, add_generation_prompt=True,
    **kwargs) renders; the default template would render another one."""
    from transformers import AutoTokenizer
    d, _, _ = env
    model_dir = tmp_path / "model"
    shutil.copytree(d, model_dir)
    (model_dir / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}")
    (model_dir / "additional_chat_templates").mkdir()
    (model_dir / "additional_chat_templates" / "terse.jinja").write_text(
        "{% for m in messages %}{{ m.role[0] | upper }}> {{ m.content | trim }}"
        "{% if shout %}!{% endif %}{{ sep | default('|') }}{% endfor %}"
        "{% if add_generation_prompt %}A> {% endif %}")
    tok = AutoTokenizer.from_pretrained(model_dir)
    chats = [[{"role": "user", "content": " Hello, who are you? "},
              {"role": "assistant", "content": "I am a small model."}],
             [{"role": "system", "content": "You are terse."},
              {"role": "user", "content": "The quick"},
              {"role": "assistant", "content": "brown fox"}]]
    data = _write(tmp_path / "chat.jsonl", [{"messages": m} for m in chats])
    kwargs = {"shout": True, "sep": " / "}
    preds_path = tmp_path / "pred.jsonl"
    _json(ft_eval, "--model", model_dir, "--data", data, "--generate", "--max-new-tokens", 2,
          "--template-name", "terse", "--template-kwargs", json.dumps(kwargs),
          "--predictions", preds_path)
    preds = [json.loads(x) for x in preds_path.read_text().splitlines()]
    want = [tok.apply_chat_template(c[:-1], chat_template="terse", add_generation_prompt=True,
                                    tokenize=False, **kwargs) for c in chats]
    default = [tok.apply_chat_template(c[:-1], add_generation_prompt=True, tokenize=False)
               for c in chats]
    assert want != default
    assert [p["prompt"] for p in preds] == want
    out = _run(ft_eval, "--model", model_dir, "--data", data, "--template-name", "nosuch",
               rc=1)
    assert "nosuch" in out.stderr and "terse" in out.stderr, out.stderr
