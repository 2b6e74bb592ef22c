"""ft-lora-init and ft-merge against PEFT and transformers.

ft-lora-init: the adapter loads with peft.PeftModel.from_pretrained with every key used
(no missing or unexpected keys), has PEFT's default init (|A| <= 1/sqrt(in), B == 0), the
requested target modules and r / alpha / dropout / rsLoRA, and leaves the model's logits
equal to the base's.

ft-merge: for adapters made by peft itself (random A and B), the merged checkpoint loads
with AutoModelForCausalLM and matches PeftModel(base, adapter):
  - f32 output: logits rel err <= 1e-5 (TOL_LOGITS) and weights vs peft's
    merge_and_unload() <= 1e-5 (TOL_WEIGHT);
  - bf16 / f16 output: every weight equals peft's fp32 merge rounded to that dtype, except
    where the two fp32 merges (different GEMM summation order, ~1e-7 relative) straddle a
    rounding boundary: those (at most 0.1% of a tensor) may be one unit in the last place
    off. Logits are then compared with a loose tolerance: rounding every weight to bf16
    (unit roundoff 2^-9 ~ 2e-3) perturbs the logits of these 2-layer models by a few
    1e-3, so 2e-2 bf16 / 5e-3 f16 (2^-11) separate "rounded" from "wrong".
Tied and untied models, all-linear and subsets, rsLoRA, qwen2 biases, a bf16 base (the
default dtype follows config.json), and a sharded output.

Run:  FT_LORA_INIT=$PWD/bin/ft-lora-init FT_MERGE=$PWD/bin/ft-merge \\
          .venv/bin/python -m pytest -q tests/conformance/test_tools_peft.py
"""

import json
import math
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ftref



_tool = ftref.tool_exe


@pytest.fixture(scope="session")
def lora_init_exe():
    return _tool("FT_LORA_INIT", "ft-lora-init")


@pytest.fixture(scope="session")
def merge_exe():
    return _tool("FT_MERGE", "ft-merge")


run_tool = ftref.run_tool


def logits_of(model, vocab, seed=0):
    ids, _ = ftref.make_batch(vocab, 2, 12, seed)
    return ftref.hf_forward(model, ids)[0]


def load_peft(model_dir, adapter_dir):
    from peft import PeftModel

    base = ftref.load_hf(model_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm = PeftModel.from_pretrained(base, str(adapter_dir))
    pm.eval()
    return pm, [str(w.message) for w in caught]


def lora_state(pm):
    """{adapter file key: tensor} of the LoRA weights peft holds in memory."""
    return {ftref.peft_key(n): p.detach().clone() for n, p in pm.named_parameters()
            if ".lora_" in n}


# --------------------------------------------------------------------------------------
# ft-lora-init


INIT_CASES = [
    # (model, --target, expected module names, r, alpha, rslora)
    ("llama_gqa", "q_proj,v_proj,down_proj", ["q_proj", "v_proj", "down_proj"], 8, 16, True),
    ("tied", "all-linear", ftref.SEVEN, 4, 8, False),
    ("qwen2", "k_proj,gate_proj", ["k_proj", "gate_proj"], 2, 3.5, False),
    ("granite", "all-linear", ftref.SEVEN, 4, 8, False),
    ("gemma", "all-linear", ftref.SEVEN, 4, 8, False),
    ("phi3", "all-linear", ftref.PHI3_FOUR, 4, 8, False),
    ("phi4_mini", "qkv,gate_up", ["qkv_proj", "gate_up_proj"], 2, 4, True),
    ("smollm3", "all-linear", ftref.SEVEN, 4, 8, False),
    ("gemma2", "all-linear", ftref.SEVEN, 4, 8, False),
    ("gemma3", "all-linear", ftref.SEVEN, 4, 8, False),
    ("olmo2", "all-linear", ftref.SEVEN, 4, 8, False),
    ("qwen3_tied", "all-linear", ftref.SEVEN, 4, 8, False),
]


@pytest.mark.parametrize("model_name,target,modules,r,alpha,rslora", INIT_CASES,
                         ids=[c[0] + "-" + c[1] for c in INIT_CASES])
def test_lora_init_adapter_loads_in_peft(store, lora_init_exe, tmp_path, model_name, target,
                                         modules, r, alpha, rslora):
    model_dir = store.model(model_name)
    out = tmp_path / "adapter"
    args = [lora_init_exe, "--model", model_dir, "--out", out, "--r", r, "--alpha", alpha,
            "--dropout", 0.1, "--target", target, "--seed", 7]
    if rslora:
        args.append("--rslora")
    cp = run_tool(args)
    assert cp.stdout.strip() == str(out)

    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM"
    assert cfg["r"] == r and cfg["lora_alpha"] == alpha and cfg["use_rslora"] == rslora
    assert math.isclose(cfg["lora_dropout"], 0.1, rel_tol=1e-6)
    assert sorted(cfg["target_modules"]) == sorted(modules)
    assert cfg["base_model_name_or_path"] == str(model_dir)

    tensors = load_file(str(out / "adapter_model.safetensors"))
    n_layers = ftref.SHAPES[model_name].cfg["num_hidden_layers"]
    assert len(tensors) == 2 * len(modules) * n_layers
    for k, t in tensors.items():
        assert t.dtype == torch.float32, k
        assert any(f".{m}.lora_" in k for m in modules), k
        if ".lora_A." in k:
            assert t.shape[0] == r, k
            bound = 1.0 / math.sqrt(t.shape[1])
            amax = t.abs().max().item()
            # kaiming-uniform with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))
            assert amax <= bound, f"{k}: max |A| {amax} > 1/sqrt(in) = {bound}"
            assert amax > 0.5 * bound, f"{k}: max |A| {amax} is too small for U(-b, b)"
            assert abs(t.mean().item()) < 0.25 * bound, k
        else:
            assert ".lora_B." in k and t.shape[1] == r, k
            assert torch.count_nonzero(t) == 0, f"{k}: B must start at zero"

    pm, caught = load_peft(model_dir, out)
    bad = [w for w in caught if "missing" in w.lower() or "unexpected" in w.lower()]
    assert not bad, bad
    mem = lora_state(pm)
    assert set(mem) == set(tensors), (sorted(set(mem) ^ set(tensors)))[:6]
    for k, t in tensors.items():
        assert torch.equal(mem[k], t), f"{k}: peft holds other values than the file"
    lc = pm.peft_config["default"]
    assert lc.r == r and lc.lora_alpha == alpha and lc.use_rslora == rslora
    assert set(lc.target_modules) == set(modules)

    # B = 0: the adapted model is the base model
    base = ftref.load_hf(model_dir)
    vocab = ftref.SHAPES[model_name].cfg["vocab_size"]
    assert torch.equal(logits_of(pm, vocab), logits_of(base, vocab))


def test_lora_init_seed(store, lora_init_exe, tmp_path):
    model_dir = store.model("llama_gqa")
    outs = []
    for i, seed in enumerate([1, 1, 2]):
        out = tmp_path / f"a{i}"
        run_tool([lora_init_exe, "--model", model_dir, "--out", out, "--seed", seed,
                  "--target", "q_proj"])
        outs.append(load_file(str(out / "adapter_model.safetensors")))
    k = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    assert torch.equal(outs[0][k], outs[1][k])
    assert not torch.equal(outs[0][k], outs[2][k])


def test_lora_init_usage_errors(store, lora_init_exe, tmp_path):
    cp = run_tool([lora_init_exe, "--help"])
    assert cp.stdout.startswith("usage: ft-lora-init")
    cp = run_tool([lora_init_exe, "--out", tmp_path / "x"], expect_rc=2)
    assert "ft-lora-init: error:" in cp.stderr and "--model" in cp.stderr
    cp = run_tool([lora_init_exe, "--model", store.model("llama_gqa"), "--out", tmp_path / "x",
                   "--target", "qq_proj"], expect_rc=2)
    assert "qq_proj" in cp.stderr
    cp = run_tool([lora_init_exe, "--model", tmp_path / "nothing", "--out", tmp_path / "x"],
                  expect_rc=1)
    assert cp.stderr.startswith("ft-lora-init: error:") and "config.json" in cp.stderr


# --------------------------------------------------------------------------------------
# ft-merge


def _spacing(x, dtype):
    """The distance from |x| to the next representable value of dtype (one ulp)."""
    mant = {torch.bfloat16: 7, torch.float16: 10}[dtype]
    tiny = {torch.bfloat16: 2.0 ** -133, torch.float16: 2.0 ** -24}[dtype]
    e = torch.floor(torch.log2(x.abs().double().clamp_min(1e-300)))
    return torch.clamp(torch.pow(2.0, e - mant), min=tiny)


def check_rounded(name, ours, ref32, dtype):
    """ours (dtype) == ref32 rounded to dtype, up to one ulp on <= 0.1% of the values."""
    assert ours.dtype == dtype, f"{name}: dtype {ours.dtype}, expected {dtype}"
    want = ref32.to(dtype)
    diff = (ours.double() - want.double()).abs()
    off = int(torch.count_nonzero(diff))
    assert off <= max(1, ours.numel() // 1000), f"{name}: {off} of {ours.numel()} values differ"
    assert bool((diff <= _spacing(ref32, dtype) * 1.0001).all()), \
        f"{name}: a value is more than one ulp from the rounded fp32 merge"


MERGE_CASES = [
    # (model, adapter variant, --dtype or None)
    ("llama_gqa", "all-linear", "f32"),
    ("llama_gqa", "qv", "f32"),
    ("llama_gqa", "all-linear-literal", "f32"),
    ("tied", "all7", "f32"),
    ("tied", "rslora", "f32"),
    ("qwen2", "rslora", "f32"),
    ("llama_bias", "o_down", "f32"),
    ("llama_gqa", "all7", "bf16"),
    ("tied", "qv", "bf16"),
    ("llama_gqa", "rslora", "f16"),
    ("bf16_ckpt", "qv", None),  # default: config.json's torch_dtype (bfloat16)
    ("llama_gqa", "qv", None),  # saved in float32: float32
    ("granite", "all7", "f32"),
    ("gemma", "all7", "f32"),  # tied; norm weights stay Gemma's offsets from 1
    ("gemma", "qv", "bf16"),
    ("phi3", "all4", "f32"),  # fused qkv_proj / gate_up_proj written back fused
    ("phi3_longrope", "qkv_down", "f32"),
    ("phi4_mini", "all-linear", "f32"),  # tied
    ("phi4_mini", "qkv_down", "bf16"),
    ("smollm3", "all7", "f32"),  # tied; NoPE layer
    ("smollm3_interval", "all-linear", "f32"),
    ("gemma2", "all7", "f32"),  # four norms a layer, all offsets from 1
    ("gemma3", "all7", "f32"),  # and per-head q/k norms, two RoPE sets
    ("gemma3_legacy", "qv", "bf16"),  # the Hub's config keys carried through
    ("olmo2", "all7", "f32"),  # q_norm / k_norm and the post-norms carried through
    ("qwen3", "all7", "f32"),
    ("qwen3_tied", "all7", "f32"),
    ("qwen3_tied", "qv", "bf16"),
    # modules_to_save: the adapter's embedding and head copies replace the base's
    ("llama_gqa", "mts_head", "f32"),
    ("llama_gqa", "mts_embed", "f32"),
    ("llama_gqa", "mts_both", "bf16"),
    ("mistral_sw", "mts_both", "f32"),
    ("qwen2", "mts_both", "f32"),
    ("qwen3", "mts_both", "f32"),
    ("granite", "mts_both", "f32"),
    ("olmo2", "mts_both", "f32"),
    ("phi3", "mts_both", "f32"),
    ("tied", "mts_tie", "f32"),  # tied: the one trained copy (ensure_weight_tying)
    ("gemma2", "mts_tie_head", "f32"),
    # DoRA: each row rescaled to its magnitude
    ("llama_gqa", "dora_all", "f32"),
    ("llama_gqa", "dora_rslora", "bf16"),
    ("llama_bias", "dora_all", "f32"),
    ("qwen2", "dora_all", "f32"),
    ("qwen3_tied", "dora_all", "f32"),
    ("gemma2", "dora_all", "f32"),
    ("olmo2", "dora_all", "f32"),
    ("phi3", "dora_all", "f32"),
    ("smollm3", "dora_all", "f32"),
    ("llama_gqa", "dora_outer", "f32"),  # the embedding's columns, the head's rows
    ("phi3", "dora_outer_phi", "bf16"),
    # LoRA on the embedding (its delta transposed) and on lm_head
    ("llama_gqa", "outer", "f32"),
    ("llama_gqa", "outer_regex", "bf16"),
    ("granite", "outer", "f32"),
    ("qwen3", "outer", "f32"),
    ("phi3", "outer_phi", "f32"),
    # rank_pattern / alpha_pattern: each pair its own rank and scaling (test_lora_patterns.py)
    ("llama_gqa", "pat_layers", "f32"),
    ("llama_gqa", "pat_rslora", "bf16"),
    ("llama_gqa", "pat_outer", "f32"),
    ("llama_gqa", "pat_dora", "f32"),
    ("phi3", "pat_phi", "f32"),
]

_DT = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_TORCH_NAME = {torch.float32: "float32", torch.bfloat16: "bfloat16",
               torch.float16: "float16"}
_LOGIT_TOL = {torch.float32: ftref.TOL_LOGITS, torch.bfloat16: 2e-2, torch.float16: 5e-3}


@pytest.mark.parametrize("model_name,variant,dtype", MERGE_CASES,
                         ids=[f"{m}-{v}-{d or 'default'}" for m, v, d in MERGE_CASES])
def test_merge_matches_peft(store, merge_exe, tmp_path, model_name, variant, dtype):
    model_dir = store.model(model_name)
    adapter = store.adapter(model_name, variant)
    out = tmp_path / "merged"
    args = [merge_exe, "--model", model_dir, "--adapter", adapter, "--out", out]
    if dtype:
        args += ["--dtype", dtype]
    cp = run_tool(args)
    assert cp.stdout.strip() == str(out)

    shape = ftref.SHAPES[model_name]
    if dtype:
        want_dt = _DT[dtype]
    else:
        want_dt = shape.save_dtype
    cfg = json.loads((out / "config.json").read_text())
    base_cfg = json.loads((Path(model_dir) / "config.json").read_text())
    # the dtype under both names: transformers 4 reads torch_dtype, 5 reads dtype first
    assert cfg["torch_dtype"] == cfg["dtype"] == _TORCH_NAME[want_dt]
    dtype_keys = ("torch_dtype", "dtype")
    assert {k: v for k, v in cfg.items() if k not in dtype_keys} == \
        {k: v for k, v in base_cfg.items() if k not in dtype_keys}
    if (Path(model_dir) / "generation_config.json").exists():
        assert (out / "generation_config.json").read_bytes() == \
            (Path(model_dir) / "generation_config.json").read_bytes()
    assert not [p.name for p in tmp_path.iterdir() if p.name != "merged"], \
        "temporary files left next to --out"

    ours = load_file(str(out / "model.safetensors"))
    pm, _ = load_peft(model_dir, adapter)
    vocab = shape.cfg["vocab_size"]
    ref_logits = logits_of(pm, vocab)
    ref_state = {k: v.detach().clone() for k, v in pm.merge_and_unload().state_dict().items()}
    tied = shape.cfg.get("tie_word_embeddings", False)
    if tied:
        ref_state.pop("lm_head.weight", None)
    assert set(ours) == set(ref_state), sorted(set(ours) ^ set(ref_state))
    assert ("lm_head.weight" in ours) == (not tied)
    for k, ref in ref_state.items():
        ref = ref.float()
        if want_dt == torch.float32:
            assert ours[k].dtype == torch.float32, k
            ftref.assert_close(f"merged {k}", ours[k], ref, ftref.TOL_WEIGHT)
        else:
            check_rounded(k, ours[k], ref, want_dt)

    merged = ftref.load_hf(out)
    ftref.assert_close("merged logits", logits_of(merged, vocab), ref_logits,
                       _LOGIT_TOL[want_dt])


# LoRA on the embedding and / or lm_head of a tied model (PEFT's default, no
# ensure_weight_tying: a pair on each module over the one tensor): merge_and_unload adds
# both deltas to that tensor, which transformers then saves once, still tied; the merged
# model is not the adapted one (the head sees the embedding's delta and the embedding the
# head's), so the logits compared are the merged PEFT model's.
TIED_OUTER_MERGES = [("tied", "outer", "f32"), ("gemma", "outer", "f32"),
                     ("tied", "outer_head", "bf16"), ("tied", "outer_embed", "f32"),
                     ("phi4_mini", "outer_phi", "f32"),
                     # DoRA: the embedding's merge, then the head's on the merged tensor
                     ("tied", "dora_outer", "f32"), ("gemma2", "dora_outer", "f32"),
                     ("tied", "dora_head", "f32"),
                     # ensure_weight_tying: the head's pair is the embedding's, and PEFT
                     # merges it twice (E + 2 s (B A)^T)
                     ("tied", "outer_tie", "f32"), ("gemma", "outer_tie_head", "bf16"),
                     ("phi4_mini", "outer_tie_phi", "f32"),
                     # and DoRA with it: the embedding's DoRA merge, then the head's with
                     # its own magnitude on the merged tensor, the one pair both times
                     ("tied", "dora_outer_tie", "f32"), ("gemma2", "dora_outer_tie", "f32"),
                     ("tied", "dora_tie_head", "bf16"),
                     # rank_pattern there: the head's pair the embedding's (its rank), the
                     # head's scaling its own keys' alpha / r
                     ("tied", "pat_outer_tie", "f32")]


@pytest.mark.parametrize("model_name,variant,dtype", TIED_OUTER_MERGES,
                         ids=[f"{m}-{v}-{d}" for m, v, d in TIED_OUTER_MERGES])
def test_merge_tied_outer_matches_peft(store, merge_exe, tmp_path, model_name, variant, dtype):
    model_dir = store.model(model_name)
    adapter = store.adapter(model_name, variant)
    out = tmp_path / "merged"
    run_tool([merge_exe, "--model", model_dir, "--adapter", adapter, "--out", out,
              "--dtype", dtype])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True
    ours = load_file(str(out / "model.safetensors"))
    pm, _ = load_peft(model_dir, adapter)
    vocab = ftref.SHAPES[model_name].cfg["vocab_size"]
    adapted = logits_of(pm, vocab)
    merged_pm = pm.merge_and_unload()
    assert merged_pm.lm_head.weight is merged_pm.model.embed_tokens.weight
    ref_logits = logits_of(merged_pm, vocab)
    assert ftref.rel_err(ref_logits, adapted) > 1e-3  # (PEFT's merge is not the adapter's)
    ref_state = {k: v.detach().clone() for k, v in merged_pm.state_dict().items()}
    ref_state.pop("lm_head.weight")
    assert set(ours) == set(ref_state), sorted(set(ours) ^ set(ref_state))
    want_dt = _DT[dtype]
    for k, ref in ref_state.items():
        if want_dt == torch.float32:
            ftref.assert_close(f"merged {k}", ours[k], ref.float(), ftref.TOL_WEIGHT)
        else:
            check_rounded(k, ours[k], ref.float(), want_dt)
    ftref.assert_close("merged logits", logits_of(ftref.load_hf(out), vocab), ref_logits,
                       _LOGIT_TOL[want_dt])


# modules_to_save on a tied model without ensure_weight_tying (PEFT's separate copies):
# merge_and_unload unties the two (tie_word_embeddings false) and save_pretrained writes
# both the embedding and lm_head.weight
TIED_UNTIE_MERGES = [("tied", "mts_head_all", "f32"), ("gemma", "mts_both", "f32"),
                     ("qwen3_tied", "mts_embed", "bf16")]


@pytest.mark.parametrize("model_name,variant,dtype", TIED_UNTIE_MERGES,
                         ids=[f"{m}-{v}-{d}" for m, v, d in TIED_UNTIE_MERGES])
def test_merge_tied_untie_matches_peft(store, merge_exe, tmp_path, model_name, variant, dtype):
    model_dir = store.model(model_name)
    adapter = store.adapter(model_name, variant)
    out = tmp_path / "merged"
    run_tool([merge_exe, "--model", model_dir, "--adapter", adapter, "--out", out,
              "--dtype", dtype])
    pm, _ = load_peft(model_dir, adapter)
    vocab = ftref.SHAPES[model_name].cfg["vocab_size"]
    ref_logits = logits_of(pm, vocab)
    merged_pm = pm.merge_and_unload()
    merged_pm.save_pretrained(tmp_path / "peft-merged")
    want_cfg = json.loads((tmp_path / "peft-merged" / "config.json").read_text())
    assert want_cfg["tie_word_embeddings"] is False
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False
    ours = load_file(str(out / "model.safetensors"))
    ref_state = load_file(str(tmp_path / "peft-merged" / "model.safetensors"))
    assert "lm_head.weight" in ref_state
    assert set(ours) == set(ref_state), sorted(set(ours) ^ set(ref_state))
    want_dt = _DT[dtype]
    for k, ref in ref_state.items():
        if want_dt == torch.float32:
            ftref.assert_close(f"merged {k}", ours[k], ref.float(), ftref.TOL_WEIGHT)
        else:
            check_rounded(k, ours[k], ref.float(), want_dt)
    ftref.assert_close("merged logits", logits_of(ftref.load_hf(out), vocab), ref_logits,
                       _LOGIT_TOL[want_dt])


def test_merge_sharded_output(store, merge_exe, tmp_path):
    model_dir = store.model("sharded")  # a sharded base, too
    adapter = store.adapter("sharded", "all7")
    out = tmp_path / "merged"
    run_tool([merge_exe, "--model", model_dir, "--adapter", adapter, "--out", out,
              "--max-shard-size", 20000])
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2, shards
    assert not (out / "model.safetensors").exists()
    n = len(shards)
    assert shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    total = 0
    for s in shards:
        assert (out / s).stat().st_size <= 20000 + 4096  # data <= limit, plus the header
        for k, t in load_file(str(out / s)).items():
            assert index["weight_map"][k] == s
            total += t.numel() * t.element_size()
    assert index["metadata"]["total_size"] == total

    pm, _ = load_peft(model_dir, adapter)
    vocab = ftref.SHAPES["sharded"].cfg["vocab_size"]
    ftref.assert_close("sharded merged logits", logits_of(ftref.load_hf(out), vocab),
                       logits_of(pm, vocab), ftref.TOL_LOGITS)


def test_lora_init_modules_to_save(store, lora_init_exe, merge_exe, tmp_path):
    """--modules-to-save: the adapter holds the base's embedding and head under PEFT's keys,
    loads in PEFT with every key used, starts equal to the base, and merges back to it; on a
    tied model the one shared copy (ensure_weight_tying) under both keys; another module is
    refused."""
    model_dir = store.model("llama_gqa")
    out = tmp_path / "adapter"
    run_tool([lora_init_exe, "--model", model_dir, "--out", out, "--r", 4, "--target",
              "q_proj,v_proj", "--modules-to-save", "embed_tokens,lm_head"])
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert sorted(cfg["modules_to_save"]) == ["embed_tokens", "lm_head"]
    tensors = load_file(str(out / "adapter_model.safetensors"))
    base_sd = load_file(str(Path(model_dir) / "model.safetensors"))
    for key, name in [("base_model.model.model.embed_tokens.weight", "model.embed_tokens.weight"),
                      ("base_model.model.lm_head.weight", "lm_head.weight")]:
        assert torch.equal(tensors[key], base_sd[name]), key
    pm, caught = load_peft(model_dir, out)
    bad = [w for w in caught if "missing" in w.lower() or "unexpected" in w.lower()]
    assert not bad, bad
    vocab = ftref.SHAPES["llama_gqa"].cfg["vocab_size"]
    assert torch.equal(logits_of(pm, vocab), logits_of(ftref.load_hf(model_dir), vocab))
    run_tool([merge_exe, "--model", model_dir, "--adapter", out, "--out", tmp_path / "m"])
    merged = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert merged.keys() == base_sd.keys()
    for k in base_sd:
        assert torch.equal(merged[k], base_sd[k].float()), k
    tied = store.model("tied")
    run_tool([lora_init_exe, "--model", tied, "--out", tmp_path / "t", "--modules-to-save",
              "lm_head"])
    cfg = json.loads((tmp_path / "t" / "adapter_config.json").read_text())
    assert cfg["modules_to_save"] == ["embed_tokens"] and cfg["ensure_weight_tying"] is True
    tensors = load_file(str(tmp_path / "t" / "adapter_model.safetensors"))
    emb = load_file(str(Path(tied) / "model.safetensors"))["model.embed_tokens.weight"]
    for key in ("base_model.model.model.embed_tokens.weight", "base_model.model.lm_head.weight"):
        assert torch.equal(tensors[key], emb), key
    pm, caught = load_peft(tied, tmp_path / "t")
    bad = [w for w in caught if "missing" in w.lower() or "unexpected" in w.lower()]
    assert not bad, bad
    vocab = ftref.SHAPES["tied"].cfg["vocab_size"]
    assert torch.equal(logits_of(pm, vocab), logits_of(ftref.load_hf(tied), vocab))
    cp = run_tool([lora_init_exe, "--model", model_dir, "--out", tmp_path / "n",
                   "--modules-to-save", "lm_head,norm"], expect_rc=None)
    assert cp.returncode == 2 and "'norm'" in cp.stderr, cp.stderr


def test_lora_init_then_merge_is_the_base(store, lora_init_exe, merge_exe, tmp_path):
    """B = 0: merging a fresh adapter gives the base weights back, bit for bit."""
    model_dir = store.model("tied")
    run_tool([lora_init_exe, "--model", model_dir, "--out", tmp_path / "a", "--r", 4])
    run_tool([merge_exe, "--model", model_dir, "--adapter", tmp_path / "a", "--out",
              tmp_path / "m"])
    ours = load_file(str(tmp_path / "m" / "model.safetensors"))
    base = load_file(str(Path(model_dir) / "model.safetensors"))
    assert set(ours) == set(base)
    for k in base:
        assert torch.equal(ours[k], base[k]), k


def test_merge_copies_tokenizer_files(store, merge_exe, tmp_path):
    model_dir = ftref.copy_model_dir(store.model("llama_gqa"), tmp_path / "base")
    files = {
        "tokenizer.json": '{"version": "1.0"}\n',
        "tokenizer_config.json": '{"model_max_length": 64}\n',
        "special_tokens_map.json": '{"bos_token": "<s>"}\n',
        "tokenizer.model": "\x00sentencepiece-bytes",
    }
    for name, text in files.items():
        (model_dir / name).write_text(text)
    out = tmp_path / "merged"
    run_tool([merge_exe, "--model", model_dir, "--adapter", store.adapter("llama_gqa", "qv"),
              "--out", out])
    for name, text in files.items():
        assert (out / name).read_text() == text, name
    assert (out / "generation_config.json").read_bytes() == \
        (model_dir / "generation_config.json").read_bytes()


def test_merge_errors(store, merge_exe, tmp_path):
    model_dir = store.model("llama_gqa")
    adapter = store.adapter("llama_gqa", "qv")
    cp = run_tool([merge_exe, "--help"])
    assert cp.stdout.startswith("usage: ft-merge")
    cp = run_tool([merge_exe, "--model", model_dir, "--out", tmp_path / "o"], expect_rc=2)
    assert "ft-merge: error:" in cp.stderr and "--adapter" in cp.stderr
    cp = run_tool([merge_exe, "--model", model_dir, "--adapter", adapter, "--out",
                   tmp_path / "o", "--dtype", "fp8"], expect_rc=2)
    assert "fp8" in cp.stderr

    # missing adapter; adapter of another model (shapes differ); a rank_pattern key that
    # matches no module the adapter targets (k_proj)
    unmatched = tmp_path.parent / f"{tmp_path.name}-unmatched"
    shutil.copytree(store.adapter("llama_gqa", "patterns"), unmatched)
    cfg = json.loads((unmatched / "adapter_config.json").read_text())
    cfg["rank_pattern"]["k_proj"] = 2
    (unmatched / "adapter_config.json").write_text(json.dumps(cfg))
    out = tmp_path / "o"
    for bad, needle in [(tmp_path / "none", "none"),
                        (store.adapter("llama_mqa_odd", "qv"), "shape"),
                        (unmatched, "'rank_pattern'")]:
        cp = run_tool([merge_exe, "--model", model_dir, "--adapter", bad, "--out", out],
                      expect_rc=1)
        assert cp.stderr.startswith("ft-merge: error:") and needle in cp.stderr, cp.stderr
        assert not out.exists()
        assert list(tmp_path.iterdir()) == [], "files left behind next to --out"

    # an existing --out: error, untouched; --force replaces it
    out.mkdir()
    (out / "keep").write_text("x")
    cp = run_tool([merge_exe, "--model", model_dir, "--adapter", adapter, "--out", out],
                  expect_rc=1)
    assert "already exists" in cp.stderr and (out / "keep").exists()
    run_tool([merge_exe, "--model", model_dir, "--adapter", adapter, "--out", out, "--force"])
    assert not (out / "keep").exists() and (out / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]
