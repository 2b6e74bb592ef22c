"""ft-quantize (bin/ft-quantize) against bitsandbytes' published format and our own loader.

  layout     the output's safetensors hold, for every linear weight of the transformer
             blocks, exactly the tensors transformers + bitsandbytes save (4-bit: weight U8
             [ceil(n/2), 1], weight.absmax F32 or U8 when nested, weight.quant_map F32[16],
             weight.nested_absmax, weight.nested_quant_map F32[256],
             weight.quant_state.bitsandbytes__<type> U8 JSON; int8: weight I8, SCB F32[rows],
             weight_format U8 [] = 0); every other tensor byte-identical to the source (or
             converted with --dtype, as torch's .to() rounds); tokenizer files copied.
  config     quantization_config equal to BitsAndBytesConfig(...).to_dict() (key order
             included) and accepted by BitsAndBytesConfig.from_dict; the rest of config.json
             unchanged.
  values     the weights dequantized here, in Python, with bitsandbytes' formula (4-bit:
             code[nibble] * absmax[block], high nibble first, nested absmax =
             nested_quant_map[q] * nested_absmax[i // 256] + nested_offset; int8:
             q * SCB * (1/127)) lie within the quantization bound of the source weights
             (half the widest gap of the code table times the block absmax, plus the error
             of the reconstructed absmax), and differ from them.
  round trip the conformance harness loading the output gives the same "dequant.*" tensors,
             logits and loss, bit for bit, as quantizing the source on load with the same
             options; the Python dequantization equals the harness's bit for bit.
  ft-eval    runs on the quantized dir; its loss is finite and close to the source model's.
  errors     bad --blocksize / --type, a missing model dir, no config.json, an already
             quantized source, a NaN in a weight (tensor and element named), an existing
             --out; nothing is left behind next to --out.

bitsandbytes itself is not installed (it needs a GPU build): the reference here is its
published formula, and BitsAndBytesConfig's version check is given a version string.

Run:  FT_QUANTIZE=$PWD/bin/ft-quantize FT_CONFORM=$PWD/build/tests/ft-conform \\
      FT_EVAL=$PWD/bin/ft-eval .venv/bin/python -m pytest -q tests/conformance/test_quantize_tool.py
"""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import ftref


NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
       -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
       0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
       0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]
FP4 = [v / 12 for v in [0, 0.0625, 8, 12, 4, 6, 2, 3, -0.0, -0.0625, -8, -12, -4, -6, -2, -3]]
CODES = {"nf4": NF4, "fp4": FP4}
PROJ = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
        "self_attn.qkv_proj", "mlp.gate_up_proj"]  # Phi-3's fused weights
TORCH_NAME = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
ST_DTYPE = {torch.uint8: "U8", torch.int8: "I8", torch.float32: "F32", torch.bfloat16: "BF16",
            torch.float16: "F16"}

# odd element counts (45 x 27 = 1215): a padded last byte and partial last blocks
ODD = ftref.Shape("odd", "llama",
                  ftref._cfg(hidden_size=27, intermediate_size=45, num_attention_heads=3,
                             num_key_value_heads=1, head_dim=8, vocab_size=50), seed=5)


_tool = ftref.tool_exe


@pytest.fixture(scope="session")
def quantize_exe():
    return _tool("FT_QUANTIZE", "ft-quantize")


@pytest.fixture(scope="session")
def eval_exe():
    return _tool("FT_EVAL", "ft-eval")


run_tool = ftref.run_tool


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory):
    """A dir with the files of a small byte-level BPE tokenizer (save_pretrained's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(["The quick brown fox jumps over the lazy dog."] * 10, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>",
                                  pad_token="<pad>")
    d = tmp_path_factory.mktemp("tokenizer")
    tok.save_pretrained(d)
    # transformers 5 no longer writes special_tokens_map.json; checkpoints saved by
    # transformers 4 carry one, which ft-quantize copies like the other side files
    stm = d / "special_tokens_map.json"
    if not stm.exists():
        stm.write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"},
                                  indent=2))
    return d, tok


@pytest.fixture(scope="module")
def source(store, tokenizer_files, tmp_path_factory):
    """source(name) -> a copy of the store's model (or ODD) with tokenizer files beside."""
    root = tmp_path_factory.mktemp("sources")
    made = {}

    def get(name):
        if name not in made:
            d = root / name
            if name == "odd":
                ftref.build_model_dir(ODD, d)
            else:
                shutil.copytree(store.model(name), d)
            for f in Path(tokenizer_files[0]).iterdir():
                shutil.copy(f, d / f.name)
            made[name] = d
        return made[name]

    return get


def source_tensors(d):
    """{name: tensor} of a model dir, single file or sharded."""
    d = Path(d)
    if (d / "model.safetensors").exists():
        return load_file(str(d / "model.safetensors"))
    index = json.loads((d / "model.safetensors.index.json").read_text())
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        out.update(load_file(str(d / shard)))
    return out


def shard_of(d):
    """{name: file name} of a model dir's tensors."""
    d = Path(d)
    if (d / "model.safetensors").exists():
        with safe_open(str(d / "model.safetensors"), "pt") as f:
            return {k: "model.safetensors" for k in f.keys()}
    return json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]


def expected_qconfig(qtype, double_quant, blocksize, skip, compute):
    """BitsAndBytesConfig(...).to_dict() with these options, in its key order."""
    int8 = qtype == "int8"
    c = {"quant_method": "bitsandbytes", "_load_in_8bit": int8, "_load_in_4bit": not int8,
         "llm_int8_threshold": 6.0, "llm_int8_skip_modules": skip,
         "llm_int8_enable_fp32_cpu_offload": False, "llm_int8_has_fp16_weight": False,
         "bnb_4bit_quant_type": "fp4" if int8 else qtype,
         "bnb_4bit_use_double_quant": (not int8) and double_quant,
         "bnb_4bit_compute_dtype": compute, "bnb_4bit_quant_storage": "uint8",
         "load_in_4bit": not int8, "load_in_8bit": int8}
    if not int8 and blocksize != 64:
        c["bnb_4bit_blocksize"] = blocksize
    return c


@pytest.fixture
def bnb_config_cls():
    """transformers' BitsAndBytesConfig (bitsandbytes is installed in the venv)."""
    from transformers import BitsAndBytesConfig
    return BitsAndBytesConfig


def max_half_gap(values):
    v = sorted(set(float(x) for x in values))
    return max(b - a for a, b in zip(v, v[1:])) / 2


# --------------------------------------------------------------------------------------
# bitsandbytes' dequantization, written out


def dequant_4bit(sd, prefix, qtype):
    """(weight [rows, cols], absmax per block, quant_state dict), all float32."""
    qs = json.loads(bytes(sd[f"{prefix}.weight.quant_state.bitsandbytes__{qtype}"].tolist()))
    rows, cols = qs["shape"]
    n, bs = rows * cols, qs["blocksize"]
    packed = sd[f"{prefix}.weight"].flatten().to(torch.int64)
    nib = torch.stack([packed >> 4, packed & 15], dim=1).flatten()[:n]
    code = sd[f"{prefix}.weight.quant_map"]
    if "nested_offset" in qs:
        q = sd[f"{prefix}.weight.absmax"].to(torch.int64)
        i = torch.arange(q.numel()) // qs["nested_blocksize"]
        absmax = (sd[f"{prefix}.weight.nested_quant_map"][q] *
                  sd[f"{prefix}.weight.nested_absmax"][i])
        absmax = absmax + torch.tensor(qs["nested_offset"], dtype=torch.float32)
    else:
        absmax = sd[f"{prefix}.weight.absmax"]
    w = code[nib] * absmax[torch.arange(n) // bs]
    return w.reshape(rows, cols), absmax, qs


def dequant_int8(sd, prefix):
    q, scb = sd[f"{prefix}.weight"], sd[f"{prefix}.SCB"]
    return q.float() * scb.view(-1, 1) * torch.tensor(7.874015718698502e-3, dtype=torch.float32)


def block_absmax(w, bs):
    flat = w.float().flatten()
    pad = (-flat.numel()) % bs
    flat = torch.cat([flat, torch.zeros(pad)])
    return flat.abs().view(-1, bs).max(dim=1).values


def check_4bit(sd, prefix, ref, qtype, blocksize, double_quant, dtype_name):
    """Layout, quant_state, and the dequantized values against the reference weight."""
    rows, cols = ref.shape
    n = rows * cols
    nb = math.ceil(n / blocksize)
    want = {f"{prefix}.weight": (torch.uint8, [math.ceil(n / 2), 1]),
            f"{prefix}.weight.absmax": (torch.uint8 if double_quant else torch.float32, [nb]),
            f"{prefix}.weight.quant_map": (torch.float32, [16])}
    if double_quant:
        want[f"{prefix}.weight.nested_absmax"] = (torch.float32, [math.ceil(nb / 256)])
        want[f"{prefix}.weight.nested_quant_map"] = (torch.float32, [256])
    for k, (dt, shape) in want.items():
        assert sd[k].dtype == dt and list(sd[k].shape) == shape, \
            f"{k}: {sd[k].dtype} {list(sd[k].shape)}, expected {dt} {shape}"
    state = sd[f"{prefix}.weight.quant_state.bitsandbytes__{qtype}"]
    assert state.dtype == torch.uint8 and state.dim() == 1
    assert torch.equal(sd[f"{prefix}.weight.quant_map"], torch.tensor(CODES[qtype]))

    w, absmax, qs = dequant_4bit(sd, prefix, qtype)
    keys = {"quant_type", "blocksize", "dtype", "shape"}
    if double_quant:
        keys |= {"nested_blocksize", "nested_dtype", "nested_offset"}
    assert set(qs) == keys, qs
    assert qs["quant_type"] == qtype and qs["blocksize"] == blocksize
    assert qs["dtype"] == dtype_name and qs["shape"] == [rows, cols]

    true_absmax = block_absmax(ref, blocksize)
    if double_quant:
        assert qs["nested_blocksize"] == 256 and qs["nested_dtype"] == "float32"
        assert math.isclose(qs["nested_offset"], true_absmax.double().mean().item(),
                            rel_tol=1e-5)
        nested = sd[f"{prefix}.weight.nested_absmax"]
        i = torch.arange(nb) // 256
        amax_err = (absmax - true_absmax).abs()
        bound = nested[i] * max_half_gap(sd[f"{prefix}.weight.nested_quant_map"].tolist())
        assert (amax_err <= bound * 1.0001 + 1e-7).all(), f"{prefix}: absmax reconstruction"
    else:
        assert torch.equal(absmax, true_absmax), f"{prefix}: absmax is not max |w| per block"
        amax_err = torch.zeros(nb)

    blk = torch.arange(n) // blocksize
    err = (w.flatten() - ref.float().flatten()).abs()
    bound = true_absmax[blk] * max_half_gap(CODES[qtype]) + amax_err[blk]
    bound = bound * (1 + 1e-5) + 1e-7
    worst = int(torch.argmax(err - bound))
    assert (err <= bound).all(), (f"{prefix}: element {worst}: |w - dequant| = "
                                  f"{err[worst].item():.3g} > bound {bound[worst].item():.3g}")
    assert not torch.equal(w, ref.float()), f"{prefix}: dequantized equals the source"
    return w


def check_int8(sd, prefix, ref):
    rows, cols = ref.shape
    assert sd[f"{prefix}.weight"].dtype == torch.int8
    assert list(sd[f"{prefix}.weight"].shape) == [rows, cols]
    assert sd[f"{prefix}.SCB"].dtype == torch.float32
    assert list(sd[f"{prefix}.SCB"].shape) == [rows]
    fmt = sd[f"{prefix}.weight_format"]
    assert fmt.dtype == torch.uint8 and fmt.dim() == 0 and fmt.item() == 0
    scb = ref.float().abs().max(dim=1).values
    assert torch.equal(sd[f"{prefix}.SCB"], scb), f"{prefix}: SCB is not max |row|"
    w = dequant_int8(sd, prefix)
    err = (w - ref.float()).abs()
    bound = scb.view(-1, 1) / 254 * (1 + 1e-5) + 1e-7
    assert (err <= bound).all(), f"{prefix}: |w - dequant| above half a step"
    assert not torch.equal(w, ref.float())
    return w


# --------------------------------------------------------------------------------------
# the output against the source


CASES = [
    # (id, model, --type, double quant, blocksize, extra args)
    ("nf4-dq", "llama_gqa", "nf4", True, 64, []),
    ("nf4-nodq", "llama_gqa", "nf4", False, 64, ["--no-double-quant"]),
    ("nf4-bs32", "llama_gqa", "nf4", True, 32, ["--blocksize", "32"]),
    ("fp4-qwen2", "qwen2", "fp4", True, 64, ["--double-quant"]),
    ("nf4-bs128-qwen2", "qwen2", "nf4", False, 128, ["--blocksize", "128", "--no-double-quant"]),
    ("int8-tied", "tied", "int8", False, 64, []),
    ("nf4-tied-skip", "tied", "nf4", True, 64, ["--skip", "down_proj, layers.1.self_attn.q_proj"]),
    ("nf4-odd-bs128", "odd", "nf4", True, 128, ["--blocksize", "128"]),
    ("fp4-odd-bs32", "odd", "fp4", False, 32, ["--blocksize", "32", "--no-double-quant"]),
    ("int8-odd", "odd", "int8", False, 64, []),
    ("nf4-bf16", "bf16_ckpt", "nf4", True, 64, []),
    ("int8-fp16", "fp16_ckpt", "int8", False, 64, []),
    ("fp4-sharded", "sharded", "fp4", True, 64, ["--max-shard-size", "6000"]),
    ("nf4-to-bf16", "llama_gqa", "nf4", True, 64, ["--dtype", "bf16"]),
    ("nf4-phi3", "phi3", "nf4", True, 64, []),  # fused qkv_proj, gate_up_proj
    ("int8-phi4-mini", "phi4_mini", "int8", False, 64, ["--skip", "layers.1.mlp"]),
    ("fp4-smollm3", "smollm3", "fp4", True, 64, []),
]


def quantized_names(src, skip):
    out = []
    for name, t in src.items():
        for p in PROJ:
            if name.startswith("model.layers.") and name.endswith(f".{p}.weight"):
                path = name[: -len(".weight")]
                if not any(s in path for s in skip):
                    out.append(path)
    return sorted(out)


def harness_spec(model_dir, vocab, quant=None):
    ids, _ = ftref.make_batch(vocab, 2, 8, 3)
    spec = {"model_dir": str(model_dir), "input_ids": ids.tolist()}
    if quant:
        spec["quant"] = quant
    return spec


def converted_copy(src_dir, dst_dir, dtype):
    """The source as transformers would save it after model.to(dtype)."""
    dst_dir.mkdir()
    tensors = {k: v.to(dtype) for k, v in source_tensors(src_dir).items()}
    save_file(tensors, str(dst_dir / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src_dir / "config.json").read_text())
    cfg["dtype"] = TORCH_NAME[dtype]
    (dst_dir / "config.json").write_text(json.dumps(cfg))
    return dst_dir


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_quantize(case, source, quantize_exe, ft, bnb_config_cls, tmp_path):
    _, model, qtype, dq, bs, extra = case
    src_dir = source(model)
    out = tmp_path / "out"
    cp = run_tool([quantize_exe, "--model", src_dir, "--out", out, "--type", qtype, *extra])
    assert cp.stdout == f"{out}\n"
    to = {"bf16": torch.bfloat16}.get(extra[extra.index("--dtype") + 1]) \
        if "--dtype" in extra else None

    src = source_tensors(src_dir)
    sd = source_tensors(out)
    skip = ["lm_head"]
    if "--skip" in extra:
        skip += [s.strip() for s in extra[extra.index("--skip") + 1].split(",")]
    qnames = quantized_names(src, skip)
    shape = ftref.SHAPES.get(model, ODD)
    n_layers = shape.cfg["num_hidden_layers"]
    n_skipped = (3 if "--skip" in extra else 0) if shape.arch != "phi3" else \
        (2 if "--skip" in extra else 0)
    assert len(qnames) == len(ftref.linear_modules(shape)) * n_layers - n_skipped

    # progress: one line per tensor, then the summary
    lines = cp.stderr.splitlines()
    assert sum(1 for ln in lines if ln.startswith("[")) == len(src), cp.stderr
    assert any(f"{qnames[0]}.weight  {qtype}" in ln for ln in lines), cp.stderr
    assert f"{len(qnames)} of {len(src)} tensors quantized to {qtype}" in lines[-1], lines[-1]

    # tensor set: dense ones byte-identical (or converted as torch rounds), quantized ones
    # in the bitsandbytes layout
    dense = [k for k in src if not (k.endswith(".weight") and k[: -len(".weight")] in qnames)]
    parts = {".weight"}
    if qtype == "int8":
        parts |= {".SCB", ".weight_format"}
    else:
        parts |= {".weight.absmax", ".weight.quant_map",
                  f".weight.quant_state.bitsandbytes__{qtype}"}
        if dq:
            parts |= {".weight.nested_absmax", ".weight.nested_quant_map"}
    assert set(sd) == set(dense) | {p + s for p in qnames for s in parts}, \
        sorted(set(sd) ^ (set(dense) | {p + s for p in qnames for s in parts}))
    for k in dense:
        want = src[k] if to is None else src[k].to(to)
        assert sd[k].dtype == want.dtype, k
        assert torch.equal(sd[k].view(torch.uint8) if sd[k].dim() else sd[k],
                           want.view(torch.uint8) if want.dim() else want), \
            f"{k}: not the source's bytes"
    if not ftref.SHAPES.get(model, ODD).cfg["tie_word_embeddings"]:
        assert "lm_head.weight" in dense

    src_dtype = next(iter(src.values())).dtype
    model_dtype = to or src_dtype
    deq = {}
    for p in qnames:
        ref = src[p + ".weight"].to(model_dtype)
        if qtype == "int8":
            deq[p] = check_int8(sd, p, ref)
        else:
            deq[p] = check_4bit(sd, p, ref, qtype, bs, dq, TORCH_NAME[model_dtype])

    # a quantized weight's parts share a shard (transformers reads them from one)
    where = shard_of(out)
    for p in qnames:
        assert len({where[p + s] for s in parts}) == 1, f"{p}: parts in several shards"
    if "--max-shard-size" in extra:
        assert (out / "model.safetensors.index.json").exists()
        assert len(set(where.values())) > 1 and not (out / "model.safetensors").exists()

    # config.json: the source's plus quantization_config
    cfg_src = json.loads((src_dir / "config.json").read_text())
    cfg = json.loads((out / "config.json").read_text())
    qc = cfg.pop("quantization_config")
    if to is not None:  # converted: the dtype under both names, transformers 4's and 5's
        cfg_src["torch_dtype"] = cfg_src["dtype"] = TORCH_NAME[to]
    assert cfg == cfg_src
    want = expected_qconfig(qtype, dq, bs, skip if len(skip) > 1 else None,
                            TORCH_NAME[model_dtype])
    assert list(qc.items()) == list(want.items())
    bnb = bnb_config_cls.from_dict(dict(qc)).to_dict()
    for k, v in bnb.items():
        assert v == qc[k], f"quantization_config.{k}: transformers reads {v!r}, file has {qc[k]!r}"
    assert bnb["load_in_4bit"] == (qtype != "int8") and bnb["load_in_8bit"] == (qtype == "int8")
    if qtype != "int8":
        assert bnb["bnb_4bit_quant_type"] == qtype and bnb["bnb_4bit_use_double_quant"] == dq

    # side files
    for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "generation_config.json"]:
        # (transformers 5's tokenizers write no special_tokens_map.json)
        if not (src_dir / f).exists():
            assert not (out / f).exists(), f
            continue
        assert (out / f).read_bytes() == (src_dir / f).read_bytes(), f

    # round trip through our loader: the same as quantizing on load, bit for bit
    vocab = cfg_src["vocab_size"]
    quant = {"type": qtype, "blocksize": bs, "double_quant": dq, "skip": ",".join(skip)}
    base_dir = src_dir if to is None else converted_copy(src_dir, tmp_path / "conv", to)
    a = ft(harness_spec(out, vocab), f"quantized-{case[0]}")
    b = ft(harness_spec(base_dir, vocab, quant), f"on-load-{case[0]}")
    assert sorted(a) == sorted(b)
    assert sorted(k[len("dequant."):-len(".weight")] for k in a if k.startswith("dequant.")) \
        == qnames
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k}: file round trip differs"
    for p in qnames:
        assert torch.equal(a[f"dequant.{p}.weight"], deq[p]), \
            f"{p}: our loader dequantizes otherwise than bitsandbytes' formula"
    assert math.isfinite(a["loss"].item())


# --------------------------------------------------------------------------------------
# ft-eval on the quantized model


@pytest.fixture(scope="module")
def eval_model(tokenizer_files, tmp_path_factory):
    tok_dir, tok = tokenizer_files
    shape = ftref.Shape("eval_q", "llama", ftref._cfg(vocab_size=len(tok)), seed=9)
    d = ftref.build_model_dir(shape, tmp_path_factory.mktemp("evalq") / "model")
    tok.save_pretrained(d)
    return d


@pytest.mark.parametrize("qtype,tol", [("nf4", 0.02), ("fp4", 0.05), ("int8", 0.005)])
def test_ft_eval_runs_on_quantized(eval_model, quantize_exe, eval_exe, tmp_path, qtype, tol):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in [
        "The quick brown fox jumps over the lazy dog.", "the lazy dog", "quick brown fox"]))
    out = tmp_path / "q"
    run_tool([quantize_exe, eval_model, out, "--type", qtype])
    base = json.loads(run_tool([eval_exe, "--model", eval_model, "--data", data, "--json"]).stdout)
    got = json.loads(run_tool([eval_exe, "--model", out, "--data", data, "--json"]).stdout)
    assert math.isfinite(got["loss"]) and got["tokens"] == base["tokens"]
    rel = abs(got["loss"] - base["loss"]) / base["loss"]
    # measured: nf4 7e-4, fp4 7e-3, int8 2e-4 relative on this random 2-layer model; the
    # tolerances (about 7x that) only separate "quantized" from "broken"
    assert rel <= tol, f"{qtype}: loss {got['loss']} vs unquantized {base['loss']}"
    assert got["loss"] != base["loss"]


# --------------------------------------------------------------------------------------
# usage and errors


def left_next_to(out):
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(out.name))


def test_usage(source, quantize_exe, tmp_path):
    cp = run_tool([quantize_exe, "--help"])
    assert cp.stdout.startswith("usage: ft-quantize --model DIR --out DIR")
    for opt in ["--type nf4|fp4|int8", "--blocksize", "--double-quant", "--no-double-quant",
                "--skip", "--dtype keep|bf16|f16|f32", "--force", "MODEL_DIR OUT_DIR"]:
        assert opt in cp.stdout, opt
    src = source("llama_gqa")
    # the positional form, and the same result as the options
    run_tool([quantize_exe, src, tmp_path / "a"])
    run_tool([quantize_exe, "--model", src, "--out", tmp_path / "b"])
    assert (tmp_path / "a/model.safetensors").read_bytes() == \
        (tmp_path / "b/model.safetensors").read_bytes()
    for args, needle in [(["--blocksize", "48"], "power of two"),
                         (["--blocksize", "8192"], "power of two"),
                         (["--type", "int4"], "int4"),
                         (["--type", "int8", "--blocksize", "32"], "nf4 and fp4 only"),
                         (["--dtype", "fp8"], "fp8"),
                         (["--bogus"], "--bogus")]:
        out = tmp_path / "u"
        cp = run_tool([quantize_exe, "--model", src, "--out", out, *args], expect_rc=2)
        assert cp.stderr.startswith("ft-quantize: error:") and needle in cp.stderr, cp.stderr
        assert "usage:" in cp.stderr and not out.exists()
    cp = run_tool([quantize_exe, "--out", tmp_path / "u"], expect_rc=2)
    assert "--model" in cp.stderr


def test_errors(source, store, quantize_exe, tmp_path):
    src = source("llama_gqa")
    out = tmp_path / "work" / "out"
    out.parent.mkdir()

    def fails(model, needles, args=()):
        cp = run_tool([quantize_exe, "--model", model, "--out", out, *args], expect_rc=1)
        assert cp.stderr.splitlines()[-1].startswith("ft-quantize: error:"), cp.stderr
        for n in needles:
            assert n in cp.stderr, f"{n!r} not in {cp.stderr!r}"
        assert left_next_to(out) == [], "files left behind next to --out"
        return cp

    fails(tmp_path / "nothing", [str(tmp_path / "nothing")])
    empty = tmp_path / "empty"
    empty.mkdir()
    fails(empty, ["config.json"])
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    shutil.copy(src / "config.json", no_weights)
    fails(no_weights, ["model.safetensors"])

    # already quantized: our own output, and a checkpoint with quantized tensors only
    q = tmp_path / "q"
    run_tool([quantize_exe, "--model", src, "--out", q])
    fails(q, ["quantized already", "config.json"])
    cfg = json.loads((q / "config.json").read_text())
    del cfg["quantization_config"]
    (q / "config.json").write_text(json.dumps(cfg))
    fails(q, ["quantized already", "model.layers.0.mlp.down_proj.weight."])

    # a NaN in one weight: named with its element
    bad = tmp_path / "nan"
    shutil.copytree(src, bad)
    t = load_file(str(bad / "model.safetensors"))
    t["model.layers.1.mlp.up_proj.weight"][3, 5] = float("nan")
    save_file(t, str(bad / "model.safetensors"), metadata={"format": "pt"})
    cp = fails(bad, ["model.layers.1.mlp.up_proj.weight", "element [3, 5]", "NaN",
                     "model.safetensors"])
    # ... and inf, with int8
    t["model.layers.1.mlp.up_proj.weight"][3, 5] = 0.0
    t["model.layers.0.self_attn.k_proj.weight"][1, 2] = float("-inf")
    save_file(t, str(bad / "model.safetensors"), metadata={"format": "pt"})
    fails(bad, ["model.layers.0.self_attn.k_proj.weight", "element [1, 2]", "inf"],
          ["--type", "int8"])

    # a weight that is not a float tensor; a truncated file
    t["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 32, dtype=torch.int32)
    save_file(t, str(bad / "model.safetensors"), metadata={"format": "pt"})
    fails(bad, ["model.layers.0.self_attn.k_proj.weight", "I32"])
    data = (src / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) - 100])
    fails(bad, ["model.safetensors"])

    # everything skipped: nothing to quantize
    fails(src, ["no linear weight"], ["--skip", "layers"])

    # an existing --out: an error, untouched; --force replaces it
    out.mkdir()
    (out / "keep").write_text("x")
    cp = run_tool([quantize_exe, "--model", src, "--out", out], expect_rc=1)
    assert "already exists" in cp.stderr and (out / "keep").exists()
    assert left_next_to(out) == ["out"]
    cp = run_tool([quantize_exe, "--model", src, "--out", out, "--force"])
    assert not (out / "keep").exists() and (out / "model.safetensors").exists()
    assert left_next_to(out) == ["out"]
    # --force never replaces the source itself
    cp = run_tool([quantize_exe, "--model", src, "--out", src, "--force"], expect_rc=1)
    assert "must not be" in cp.stderr and (src / "model.safetensors").exists()
