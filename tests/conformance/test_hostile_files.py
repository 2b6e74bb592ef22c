"""Hostile model, adapter, tokenizer and config files through the tools, end to end: each
run exits non-zero, promptly, with a message naming the file (and the key, tensor or id)
on stderr, and prints no numbers. The model is the repo's demo/model (1M parameters, a
real tokenizer), copied and spoiled one way per test; every run takes well under a second.

Run:  FT_EVAL=$PWD/bin/ft-eval FT_MERGE=$PWD/bin/ft-merge FT_QUANTIZE=$PWD/bin/ft-quantize \\
      FT_TRAIN=$PWD/bin/ft-train .venv/bin/python -m pytest -q tests/conformance/test_hostile_files.py
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import ftref

DEMO = Path(__file__).resolve().parents[2] / "demo"
# A reader that blocks on a FIFO would sit there forever; this bounds the test instead.
TIMEOUT_S = 30


def _run(args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                              timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(map(str, args))}: still running after {TIMEOUT_S} s "
                    "(blocked on a FIFO?)", pytrace=False)


def _fails(args, *needles):
    cp = _run(args)
    assert 0 < cp.returncode < 128, (
        f"exit {cp.returncode}, expected a clean error\nstdout: {cp.stdout}\nstderr: {cp.stderr}")
    for n in needles:
        assert str(n) in cp.stderr, f"stderr does not name {n!r}:\n{cp.stderr}"
    assert "loss" not in cp.stdout and "perplexity" not in cp.stdout, cp.stdout
    return cp


@pytest.fixture(scope="module")
def tools():
    return {name: ftref.tool_exe(var, name) for var, name in
            [("FT_EVAL", "ft-eval"), ("FT_MERGE", "ft-merge"), ("FT_QUANTIZE", "ft-quantize"),
             ("FT_TRAIN", "ft-train"), ("FT_LORA_INIT", "ft-lora-init")]}


@pytest.fixture
def model(tmp_path):
    d = tmp_path / "model"
    shutil.copytree(DEMO / "model", d)
    return d


@pytest.fixture
def data(tmp_path):
    p = tmp_path / "eval.jsonl"
    p.write_text("".join((DEMO / "eval.jsonl").read_text().splitlines(True)[:2]))
    return p


def test_demo_model_evaluates(tools, model, data):
    """The unspoiled copy works: what the other tests break is the only difference."""
    cp = _run([tools["ft-eval"], "--model", model, "--data", data])
    assert cp.returncode == 0 and "loss" in cp.stdout, cp.stderr


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json",
                                  "tokenizer_config.json"])
def test_fifo_is_refused(tools, model, data, name):
    (model / name).unlink()
    os.mkfifo(model / name)
    _fails([tools["ft-eval"], "--model", model, "--data", data], model / name,
           "not a regular file (a FIFO)")


def test_fifo_passthrough_file_in_merge(tools, model, tmp_path):
    adapter = tmp_path / "adapter"
    _run([tools["ft-lora-init"], "--model", model, "--out", adapter])
    (model / "special_tokens_map.json").unlink()
    os.mkfifo(model / "special_tokens_map.json")
    out = tmp_path / "merged"
    _fails([tools["ft-merge"], "--model", model, "--adapter", adapter, "--out", out],
           "special_tokens_map.json", "FIFO")
    assert not out.exists()


@pytest.mark.parametrize("dtype,value,word", [(torch.bfloat16, float("nan"), "NaN"),
                                              (torch.float32, float("-inf"), "-inf")])
def test_nonfinite_weight(tools, model, data, dtype, value, word):
    t = load_file(model / "model.safetensors")
    name = "model.layers.1.mlp.up_proj.weight"
    t[name] = t[name].to(dtype)
    t[name][3, 5] = value
    save_file(t, model / "model.safetensors", metadata={"format": "pt"})
    _fails([tools["ft-eval"], "--model", model, "--data", data], "model.safetensors", name,
           f"element [3, 5] is {word}")


def test_nonfinite_adapter_weight(tools, model, data, tmp_path):
    adapter = tmp_path / "adapter"
    _run([tools["ft-lora-init"], "--model", model, "--out", adapter])
    t = load_file(adapter / "adapter_model.safetensors")
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    t[name][0, 1] = float("inf")
    save_file(t, adapter / "adapter_model.safetensors", metadata={"format": "pt"})
    _fails([tools["ft-eval"], "--model", model, "--adapter", adapter, "--data", data],
           "adapter_model.safetensors", name, "is inf")


def _adapter(tools, model, tmp_path, edit):
    adapter = tmp_path / "adapter"
    _run([tools["ft-lora-init"], "--model", model, "--out", adapter])
    p = adapter / "adapter_config.json"
    p.write_text(edit(p.read_text()))
    return adapter


def test_adapter_config_duplicate_key(tools, model, data, tmp_path):
    adapter = _adapter(tools, model, tmp_path, lambda s: s.replace('"r": 16,', '"r": 16, "r": 8,'))
    _fails([tools["ft-eval"], "--model", model, "--adapter", adapter, "--data", data],
           adapter / "adapter_config.json", "duplicate", '"r"')


@pytest.mark.parametrize("layers,needle", [([9], "layer 9"), ([4294967296], "4294967296")])
def test_adapter_layers_name_the_file(tools, model, data, tmp_path, layers, needle):
    def edit(s):
        c = json.loads(s)
        c["layers_to_transform"] = layers
        return json.dumps(c)
    adapter = _adapter(tools, model, tmp_path, edit)
    _fails([tools["ft-eval"], "--model", model, "--adapter", adapter, "--data", data],
           adapter / "adapter_config.json", needle)


@pytest.mark.parametrize("edit,needles", [
    (lambda j: j["added_tokens"].append(dict(j["added_tokens"][0], id=10 ** 9, content="<far>")),
     ["added_tokens", "<far>", "1000000000", "beyond the vocabulary"]),
    (lambda j: j["added_tokens"].append(dict(j["added_tokens"][0], content="<other>")),
     ["two tokens", "<other>"]),
])
def test_tokenizer_ids(tools, model, data, edit, needles):
    p = model / "tokenizer.json"
    j = json.loads(p.read_text())
    edit(j)
    p.write_text(json.dumps(j))
    _fails([tools["ft-eval"], "--model", model, "--data", data], p, *needles)


def test_quant_state_bogus_dtype(tools, model, data, tmp_path):
    q = tmp_path / "q"
    cp = _run([tools["ft-quantize"], "--model", model, "--out", q])
    assert cp.returncode == 0, cp.stderr
    assert _run([tools["ft-eval"], "--model", q, "--data", data]).returncode == 0
    t = load_file(q / "model.safetensors")
    key = "model.layers.0.self_attn.v_proj.weight.quant_state.bitsandbytes__nf4"
    state = json.loads(bytes(t[key].tolist()).decode())
    state["dtype"] = "float8"
    t[key] = torch.tensor(list(json.dumps(state).encode()), dtype=torch.uint8)
    save_file(t, q / "model.safetensors", metadata={"format": "pt"})
    _fails([tools["ft-eval"], "--model", q, "--data", data], "model.safetensors", key,
           "dtype 'float8'")


@pytest.mark.parametrize("text,needles", [
    ("", ["the file is empty", "model.name"]),
    ("model:\n  name: x\ntrain:\n  epochs: 1\n  epochs: 2\n", [":5:", "'train.epochs'", "twice"]),
])
def test_run_config(tools, tmp_path, text, needles):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(text)
    cp = _run([tools["ft-train"], "--config", cfg, "--print-config"])
    assert cp.returncode == 1 and str(cfg) in cp.stderr, cp.stderr
    for n in needles:
        assert n in cp.stderr, cp.stderr
