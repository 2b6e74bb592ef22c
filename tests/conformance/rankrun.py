"""ft-train on real Open MPI ranks, as the distributed and memory tests run it: a tiny
random Llama made by transformers, pre-tokenized data, run configs written from dotted
keys, and the launcher."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import torch

FT_TRAIN = os.environ.get("FT_TRAIN")
MPIRUN = shutil.which("mpirun")
REPO = Path(__file__).resolve().parents[2]


def mpi_cmd(np_, *cmd):
    assert MPIRUN, "mpirun not found: scripts/install-deps.sh installs openmpi-bin"
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [MPIRUN, *root, "--oversubscribe", "--bind-to", "none", "-np", str(np_), *cmd]


def make_model(d, name, tied=False, layers=2):
    """A random Llama (vocab 64, hidden 32) saved by transformers into d/name."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, tie_word_embeddings=tied)
    LlamaForCausalLM(cfg).save_pretrained(d / name, safe_serialization=True)
    return d / name


def write_token_data(d, rows=48):
    """d/train.jsonl: records of 6..15 token ids, the first third not counted."""
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(rows):
        n = 6 + int(torch.randint(0, 10, (1,), generator=g))
        ids = torch.randint(1, 64, (n,), generator=g).tolist()
        out.append({"input_ids": ids, "labels": [-100] * (n // 3) + ids[n // 3:]})
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))


def write_config(d, name, defaults, model="model", mode="lora", **over):
    """d/name.yaml from dotted keys: the common run (LoRA r 4 on d/model, batch 4, tokens
    data), then defaults, then over (section__key=value)."""
    cfg = {
        "model.name": str(d / model), "model.max_seq_len": 32,
        "tuning.mode": mode, "tuning.lora.r": 4, "tuning.lora.alpha": 8,
        "tuning.lora.dropout": 0.0,
        "train.batch_size": 4, "train.grad_accum": 1, "train.learning_rate": 1e-2,
        "train.logging_steps": 1, "train.save_steps": 1000,
        "train.output_dir": str(d / "runs" / name),
        "data.train_path": str(d / "train.jsonl"), "data.format": "tokens",
    }
    cfg.update(defaults)
    cfg.update({k.replace("__", "."): v for k, v in over.items()})
    tree = {}
    for k, v in cfg.items():
        node, parts = tree, k.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = v

    def emit(node, indent):
        return "".join(" " * indent + f"{k}:\n" + emit(v, indent + 2) if isinstance(v, dict)
                       else " " * indent + f"{k}: {v}\n" for k, v in node.items())
    p = d / f"{name}.yaml"
    p.write_text(emit(tree, 0))
    return p


def run(cfg, np_=1, *args, check=True, env=None, timeout=300):
    """bin/ft-train --config cfg on np_ ranks (one thread each)."""
    cmd = [FT_TRAIN, "--config", str(cfg), *args]
    if np_ > 1:
        cmd = mpi_cmd(np_, *cmd)
    e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    out = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)
    if check:
        assert out.returncode == 0, out.stderr[-4000:]
    return out


def make(*args):
    """make -C the repo with args, in the CUDA setting the build was made with."""
    e = dict(os.environ, OMP_NUM_THREADS="1")
    e.pop("MAKEFLAGS", None)
    e.pop("MAKELEVEL", None)
    flags = REPO / "build" / ".flags"
    cuda = ["CUDA=" + flags.read_text().split()[-1]] if flags.exists() else []
    return subprocess.run(["make", "--no-print-directory", "-C", str(REPO), *cuda, *args],
                          capture_output=True, text=True, env=e, timeout=600)
