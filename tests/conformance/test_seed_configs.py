"""The shipped configs/ equivalents of the multi-GPU guide's example configs load.

Each config goes through `ft-train --config X --print-config` (no model or data needed):
it must exit 0 (every key accepted), every key the file sets must come back resolved
with the same value, and a few resolved values are checked by name, defaults included.

Run:  FT_TRAIN=$PWD/bin/ft-train .venv/bin/python -m pytest -q tests/conformance/test_seed_configs.py
"""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

FT_TRAIN = os.environ.get("FT_TRAIN")
CONFIGS = Path(__file__).resolve().parents[2] / "configs"

# file -> resolved values it must print (dotted key -> value)
EXPECTED = {
    "run_bnb.yaml": {
        "model.name": "Qwen/Qwen2.5-7B-Instruct",
        "model.max_seq_len": 2048,
        "tuning.mode": "qlora",
        "tuning.backend": "bnb",
        "tuning.lora.r": 32,
        "tuning.lora.alpha": 64,
        "tuning.lora.dropout": 0.1,
        "train.batch_size": "auto",
        "train.grad_accum": "auto",
        "train.bf16": True,
        "train.gradient_checkpointing": True,
        "train.eval_strategy": "steps",
        "train.eval_steps": 200,
        "train.eval_accumulation_steps": 8,
    },
    "multi_gpu_config.yaml": {
        "model.name": "google/gemma-3-27b-it",
        "model.max_seq_len": 2048,
        "tuning.mode": "qlora",
        "tuning.backend": "bnb",
        "tuning.lora.r": 32,
        "tuning.lora.alpha": 64,
        "tuning.lora.dropout": 0.1,
        "train.batch_size": "auto",
        "train.grad_accum": "auto",
        "train.ddp_bucket_cap_mb": 200,
        "train.dataloader_num_workers": 4,
        "train.dataloader_pin_memory": True,
        "train.predict_with_generate": True,
        "train.generation_num_beams": 1,
        "train.generation_max_new_tokens": 64,
        "train.eval_strategy": "steps",
        "train.eval_steps": 200,
        "train.eval_do_concat_batches": False,
        "dist.strategy": "auto",
    },
    "rtx4090_sli.yaml": {
        "model.name": "Qwen/Qwen2.5-14B-Instruct",
        "model.max_seq_len": 1536,
        "train.batch_size": 6,
        "train.grad_accum": 4,
        "train.bf16": True,
        "train.gradient_checkpointing": True,
        "tuning.mode": "lora",  # not set by the file: the default
    },
    "a100_pair.yaml": {
        "model.name": "google/gemma-3-27b-it",
        "model.max_seq_len": 2048,
        "train.batch_size": 8,
        "train.grad_accum": 4,
        "train.bf16": True,
        "train.gradient_checkpointing": True,
    },
    "h200_quad.yaml": {
        "model.name": "meta-llama/Llama-3.1-70B-Instruct",
        "model.max_seq_len": 4096,
        "train.batch_size": 16,
        "train.grad_accum": 2,
        "train.bf16": True,
        "train.gradient_checkpointing": True,
    },
}

# keys that are accepted but have no effect; ft-train prints a notice for each
MOOT = {"ddp_find_unused_parameters", "ddp_broadcast_buffers", "dataloader_num_workers",
        "dataloader_pin_memory", "eval_do_concat_batches", "eval_accumulation_steps"}


def flatten(tree, prefix=""):
    out = {}
    for k, v in (tree or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def same(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))
    return str(a) == str(b)


def print_config(path, *sets):
    assert FT_TRAIN, "FT_TRAIN must be the path of bin/ft-train"
    args = [FT_TRAIN, "--config", str(path), "--print-config"]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_config_loads(name):
    path = CONFIGS / name
    assert path.is_file(), f"{path} is not shipped"
    r = print_config(path)
    assert r.returncode == 0, r.stderr
    assert "error" not in r.stderr
    resolved = flatten(yaml.safe_load(r.stdout))
    # every key the file sets comes back with its value
    written = flatten(yaml.safe_load(path.read_text()))
    for key, value in written.items():
        assert key in resolved, f"{name}: '{key}' missing from the resolved config"
        assert same(resolved[key], value), f"{name}: {key} = {resolved[key]!r}, file has {value!r}"
    for key, value in EXPECTED[name].items():
        assert same(resolved[key], value), f"{name}: {key} = {resolved[key]!r}, want {value!r}"
    # a moot key is accepted with a notice naming it
    for key in written:
        if key.split(".")[-1] in MOOT:
            assert f"'{key}' has no effect" in r.stderr, r.stderr
    # the top comment says what to download, with the current Hugging Face CLI (hf)
    head = path.read_text().split("\nmodel:")[0]
    assert f"hf download {EXPECTED[name]['model.name']}" in head
    assert "huggingface-cli" not in head


def test_seed_overrides_apply():
    """The guide's overrides (TRAIN_BATCH_SIZE=1 TRAIN_GRAD_ACCUM=32 ...) as --set."""
    r = print_config(CONFIGS / "run_bnb.yaml", "train.batch_size=1", "train.grad_accum=32",
                     "train.learning_rate=1e-4", "model.max_seq_len=1024")
    assert r.returncode == 0, r.stderr
    resolved = flatten(yaml.safe_load(r.stdout))
    assert resolved["train.batch_size"] == 1
    assert resolved["train.grad_accum"] == 32
    assert float(resolved["train.learning_rate"]) == pytest.approx(1e-4)
    assert resolved["model.max_seq_len"] == 1024


def test_typo_in_shipped_config_is_rejected(tmp_path):
    """The configs stay checked: a misspelt key in a copy is an error naming it."""
    text = (CONFIGS / "rtx4090_sli.yaml").read_text().replace("grad_accum:", "grad_acum:")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    r = print_config(bad)
    assert r.returncode != 0
    assert "grad_acum" in r.stderr and "grad_accum" in r.stderr


# google/gemma-3-27b-it's config.json as the Hub has it (transformers 4.50): a multimodal
# Gemma3Config whose text_config leaves out what Gemma3TextConfig defaults (vocab_size,
# rope_theta 1e6, rope_local_base_freq 1e4, sliding_window_pattern 6, ...)
GEMMA3_27B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
    "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
                    "model_type": "gemma3_text", "num_attention_heads": 32,
                    "num_hidden_layers": 62, "num_key_value_heads": 16,
                    "query_pre_attn_scalar": 168,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16,
                      "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False},
}


@pytest.mark.parametrize("name,ranks", [("multi_gpu_config.yaml", 4), ("a100_pair.yaml", 2)])
def test_gemma3_config_plans_offline(tmp_path, name, ranks):
    """The seed's gemma-3-27b-it configs plan from config.json alone, found in the Hugging
    Face cache (nothing downloaded): the text model's parameters counted as transformers
    builds Gemma3ForConditionalGeneration's language model from the same file."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    snap = tmp_path / "hub" / "models--google--gemma-3-27b-it" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(GEMMA3_27B))
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("abc123")
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"))
    r = subprocess.run([FT_TRAIN, "--config", str(CONFIGS / name), "--plan", str(ranks)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    m = re.search(r"memory plan: (\w+), gemma3 62 layers, (\d+) trainable \+ (\d+) frozen",
                  r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    with torch.device("meta"):
        hf = Gemma3ForConditionalGeneration(Gemma3Config.from_dict(GEMMA3_27B))
    text = sum(p.numel() for n, p in hf.named_parameters()
               if n.startswith("model.language_model."))
    assert hf.config.text_config.vocab_size == 262208
    mode, trainable, frozen = m.group(1), int(m.group(2)), int(m.group(3))
    if mode == "full":
        assert trainable == text and frozen == 0
    else:
        assert frozen == text and 0 < trainable < text // 100
