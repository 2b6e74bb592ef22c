"""The make workflow (mk/workflow.mk) and ft-train's --set-var / --get.

`make train SECTION_KEY=value` passes each such command-line variable to ft-train as
--set-var, which maps it onto its config key; an unknown one fails naming it. The default
job (configs/default.yaml on demo/) is run shortened: base eval, training, eval with the
adapter, merge, summary, TensorBoard events.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
FT_TRAIN = os.environ.get("FT_TRAIN") or str(REPO / "bin" / "ft-train")
DEFAULT = REPO / "configs" / "default.yaml"


def _cuda_of_build():
    """CUDA=<the value the tools were built with>, so make does not rebuild them."""
    try:
        return ["CUDA=" + (REPO / "build" / ".flags").read_text().split()[-1]]
    except (OSError, IndexError):
        return []


def make(*args, env=None, timeout=300):
    e = dict(os.environ)
    e.pop("MAKEFLAGS", None)
    e.pop("MAKELEVEL", None)
    e.setdefault("OMP_NUM_THREADS", "2")
    if env:
        e.update(env)
    return subprocess.run(["make", "--no-print-directory", "-C", str(REPO), *_cuda_of_build(),
                           *args], capture_output=True, text=True, env=e, timeout=timeout)


def ft_train(*args):
    return subprocess.run([FT_TRAIN, *args], capture_output=True, text=True, timeout=60)


def get(config, key, *extra):
    r = ft_train("--config", str(config), *extra, "--get", key)
    assert r.returncode == 0, r.stderr
    return r.stdout.rstrip("\n")


@pytest.fixture
def config(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text("model:\n  name: some/model\ndata:\n  train_path: train.jsonl\n")
    return p


@pytest.mark.parametrize("var,key,value,want", [
    ("TRAIN_BATCH_SIZE", "train.batch_size", "1", "1"),
    ("MODEL_MAX_SEQ_LEN", "model.max_seq_len", "1024", "1024"),
    ("TRAIN_LEARNING_RATE", "train.learning_rate", "1e-4", "0.0001"),
    ("TRAIN_GRADIENT_CHECKPOINTING", "train.gradient_checkpointing", "true", "true"),
    ("TUNING_LORA_R", "tuning.lora.r", "8", "8"),
    ("TUNING_LORA_TARGET_MODULES", "tuning.lora.target_modules", "q_proj,v_proj",
     "q_proj,v_proj"),
    ("TRAIN_GRAD_ACCUM", "train.grad_accum", "auto", "auto"),
    ("DATA_EVAL_PATH", "data.eval_path", "e v.jsonl", "e v.jsonl"),
    ("DIST_ZERO_STAGE", "dist.zero_stage", "2", "2"),
])
def test_set_var_maps_onto_the_key(config, var, key, value, want):
    assert get(config, key, "--set-var", f"{var}={value}") == want


def test_set_applies_after_set_var(config):
    # whatever the order on the command line: file, then --set-var, then --set
    assert get(config, "train.batch_size", "--set", "train.batch_size=5",
               "--set-var", "TRAIN_BATCH_SIZE=3") == "5"
    assert get(config, "train.batch_size", "--set-var", "TRAIN_BATCH_SIZE=3",
               "--set-var", "TRAIN_BATCH_SIZE=4") == "4"


def test_set_var_errors(config):
    r = ft_train("--config", str(config), "--set-var", "TRAIN_NOPE=1", "--print-config")
    assert r.returncode == 1 and "TRAIN_NOPE" in r.stderr and r.stdout == ""
    r = ft_train("--config", str(config), "--set-var", "TRAIN_BATCH_SIZ=1", "--print-config")
    assert r.returncode == 1 and "did you mean TRAIN_BATCH_SIZE" in r.stderr
    r = ft_train("--config", str(config), "--set-var", "TRAIN_BATCH_SIZE=x", "--print-config")
    assert r.returncode == 1 and "TRAIN_BATCH_SIZE" in r.stderr and "train.batch_size" in r.stderr
    r = ft_train("--config", str(config), "--set-var", "novalue", "--print-config")
    assert r.returncode == 1 and "NAME=value" in r.stderr


def test_get(config):
    assert get(config, "model.name") == "some/model"
    assert get(config, "data.eval_path") == ""  # default ""
    assert get(config, "tuning.mode") == "lora"
    r = ft_train("--config", str(config), "--get", "train.nope")
    assert r.returncode == 1 and "train.nope" in r.stderr
    cfg = config.parent / "empty.yaml"
    cfg.write_text("train:\n  epochs: 2\n")
    r = ft_train("--config", str(cfg), "--get", "model.name")
    assert r.returncode == 1 and "model.name" in r.stderr and "required" in r.stderr


def test_make_train_unknown_variable_fails_naming_it():
    r = make("train", "TRAIN_NOPE=1")
    assert r.returncode != 0
    assert "TRAIN_NOPE" in r.stderr
    assert "Before and after" not in r.stdout


def test_make_knobs_are_not_config_variables(tmp_path):
    # RUN_DIR and TB_PORT are make's own; PATH without tensorboard: tb prints the hint, exit 0
    env = {"PATH": "/usr/bin:/bin"}
    if shutil.which("tensorboard", path=env["PATH"]):
        pytest.skip("tensorboard on the system PATH")
    r = make("tb", f"RUN_DIR={tmp_path}", "TB_PORT=6123", "VENV=/nonexistent", env=env)
    assert r.returncode == 0, r.stderr
    assert "pip install tensorboard" in r.stderr


def test_make_lora_init(tmp_path):
    out = tmp_path / "init"
    r = make("lora-init", f"OUT={out}", "TUNING_LORA_R=4", "TUNING_LORA_TARGET_MODULES=q_proj,v_proj")
    assert r.returncode == 0, r.stderr
    c = json.loads((out / "adapter_config.json").read_text())
    assert c["r"] == 4 and sorted(c["target_modules"]) == ["q_proj", "v_proj"]
    assert (out / "adapter_model.safetensors").is_file()


def test_make_lora_init_patterns(tmp_path):
    """The config's rank_pattern / alpha_pattern reach ft-lora-init (a JSON map, quoted)."""
    out = tmp_path / "init"
    r = make("lora-init", f"OUT={out}", "TUNING_LORA_R=4", "TUNING_LORA_TARGET_MODULES=q_proj,v_proj",
             'TUNING_LORA_RANK_PATTERN={"layers.0.self_attn.q_proj": 2, "v_proj": 6}',
             'TUNING_LORA_ALPHA_PATTERN={"q_proj": 3}')
    assert r.returncode == 0, r.stderr
    c = json.loads((out / "adapter_config.json").read_text())
    assert list(c["rank_pattern"].items()) == [("layers.0.self_attn.q_proj", 2), ("v_proj", 6)]
    assert c["alpha_pattern"] == {"q_proj": 3}
    shapes = load_file(str(out / "adapter_model.safetensors"))
    assert shapes["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape[0] == 2
    assert shapes["base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight"].shape[0] == 6


@pytest.mark.skipif(not DEFAULT.is_file(), reason="no configs/default.yaml")
def test_make_train_default_job_shortened(tmp_path):
    run = tmp_path / "run"
    r = make("train", "TRAIN_MAX_STEPS=4", f"TRAIN_OUTPUT_DIR={run}", "TRAIN_EVAL_STEPS=1000",
             "TRAIN_PREDICT_WITH_GENERATE=false", "TRAIN_GENERATION_MAX_NEW_TOKENS=3",
             timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "Before and after fine-tuning" in r.stdout
    assert (run / "final" / "adapter_model.safetensors").is_file()
    assert (run / "final" / "adapter_config.json").is_file()
    assert (run / "merged" / "config.json").is_file()
    assert list((run / "merged").glob("*.safetensors"))
    assert list(run.glob("events.out.tfevents.*"))
    for name in ("eval-before.json", "eval-after.json"):
        e = json.loads((run / name).read_text())
        assert e["samples"] > 0 and e["loss"] > 0 and "exact_match" in e and "rougeL" in e
    # the overrides reached the run: the resolved config in the run dir says so
    saved = (run / "config.yaml").read_text()
    assert "max_steps: 4" in saved and str(run) in saved
    # eval uses the trained adapter from the run dir by default
    r = make("eval", f"TRAIN_OUTPUT_DIR={run}", "TRAIN_PREDICT_WITH_GENERATE=false")
    assert r.returncode == 0, r.stderr
    assert str(run / "final") in r.stderr


@pytest.mark.skipif(not (REPO / "configs" / "dpo.yaml").is_file(), reason="no configs/dpo.yaml")
def test_make_train_dpo_demo(tmp_path):
    """make train-dpo: the whole demo (configs/dpo.yaml, offline) in under a minute, its
    metrics logged, then ft-eval --preference on the held-out pairs; twice in the same run
    dir (the demo config starts over)."""
    import time
    run = tmp_path / "dpo"
    for _ in range(2):
        t0 = time.time()
        r = make("train-dpo", f"TRAIN_OUTPUT_DIR={run}", "TRAIN_OVERWRITE_OUTPUT_DIR=true",
                 timeout=240)
        took = time.time() - t0
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
        assert took < 60, took
    assert (run / "final" / "adapter_model.safetensors").is_file()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in rows if "rewards/accuracies" in x]
    evals = [x for x in rows if "eval_rewards/accuracies" in x]
    assert train and evals
    assert train[-1]["rewards/margins"] > train[0]["rewards/margins"]
    assert "preference accuracy on demo/pref_eval.jsonl" in r.stderr
    got = dict(line.split(None, 1) for line in r.stdout.splitlines() if line.strip())
    assert int(got["pairs"]) == 32 and got["reference"] == "base"
    # the trainer's last evaluation and ft-eval agree (same adapter, same pairs)
    assert abs(float(got["accuracy"]) - evals[-1]["eval_rewards/accuracies"]) < 1e-9
    assert abs(float(got["loss"]) - evals[-1]["eval_loss"]) < 1e-5


# ---- run dirs: each strategy target its own; the default job starts over -------------

def launch_argv(out, launcher):
    """The argv of the `launcher ... bin/ft-train ...` command in `make -n` output."""
    import re
    import shlex
    m = re.search(r"(?:^|\$\()(\S*" + launcher + r"\b[^\n)]*bin/ft-train[^\n)]*)", out, re.M)
    assert m, f"no {launcher} ... bin/ft-train line in:\n{out}"
    return shlex.split(m.group(1))


def sets(argv):
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--set"]


def test_strategy_targets_train_in_their_own_run_dirs(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model:\n  name: some/model\ndata:\n  train_path: train.jsonl\n"
                   "train:\n  output_dir: runs/mine/\n")
    env = {"CUDA_VISIBLE_DEVICES": ""}
    for target, extra, want in [
            ("train-distributed", [], "runs/mine-ddp"),
            ("train-zero", [], "runs/mine-zero2"),
            ("train-zero", ["ZERO_STAGE=3"], "runs/mine-zero3"),
            ("train-fsdp", [], "runs/mine-fsdp"),
            ("train-model-parallel", [], "runs/mine-model-parallel"),
            ("train-deepspeed", ["DEEPSPEED_CONFIG=deepspeed_like/zero3_offload.json"],
             "runs/mine-deepspeed-zero3_offload"),
            ("train-zero", ["TRAIN_LOGGING_STEPS=5"], "runs/mine-zero2")]:
        r = make("-n", target, f"CONFIG={cfg}", *extra, env=env)
        assert r.returncode == 0, r.stderr
        assert f"train.output_dir={want}" in sets(launch_argv(r.stdout, "mpirun")), r.stdout
    # TRAIN_OUTPUT_DIR names the run dir: as given
    r = make("-n", "train-zero", f"CONFIG={cfg}", "TRAIN_OUTPUT_DIR=runs/x", env=env)
    argv = launch_argv(r.stdout, "mpirun")
    assert not [s for s in sets(argv) if s.startswith("train.output_dir")]
    assert "TRAIN_OUTPUT_DIR=runs/x" in argv
    # make train: the config's own
    r = make("-n", "train", f"CONFIG={cfg}", env=env)
    assert r.returncode == 0 and "train.output_dir" not in r.stdout, r.stdout


@pytest.mark.skipif(not DEFAULT.is_file(), reason="no configs/default.yaml")
def test_the_default_job_starts_over():
    """make train twice on the default config: the demo job starts over in its run dir
    (train.overwrite_output_dir=true where ft-train has that key), unless RESUME or
    TRAIN_OUTPUT_DIR says otherwise; a config of the user's is never started over."""
    has_key = ft_train("--config", str(DEFAULT), "--get", "train.overwrite_output_dir")
    fresh = "--set train.overwrite_output_dir=true"
    env = {"CUDA_VISIBLE_DEVICES": ""}
    for args, want in [(["train"], has_key.returncode == 0),
                       (["train-zero"], has_key.returncode == 0),
                       (["train", "RESUME=auto"], False),
                       (["train", "TRAIN_OUTPUT_DIR=/tmp/x"], False),
                       (["train", "TRAIN_OVERWRITE_OUTPUT_DIR=false"], False),
                       (["train", f"CONFIG={DEFAULT.parent / 'a100_pair.yaml'}"], False)]:
        r = make("-n", *args, env=env)
        assert (fresh in r.stdout) == want, (args, r.stdout[-2000:])


@pytest.mark.skipif(not DEFAULT.is_file(), reason="no configs/default.yaml")
def test_default_job_leaves_nothing_in_the_run_dir_before_training(tmp_path):
    """The "before" evaluation waits outside the run dir until the training has made it:
    when the training fails, nothing of make's is left there (ft-train decides what a
    run dir that holds files means)."""
    run = tmp_path / "run"
    r = make("train", "TRAIN_MAX_STEPS=2", f"TRAIN_OUTPUT_DIR={run}", "TRAIN_EVAL_STEPS=1000",
             "TRAIN_GENERATION_MAX_NEW_TOKENS=2", env={"FT_MEM_LIMIT": "64KiB"}, timeout=240)
    assert r.returncode != 0 and "== before" in r.stderr and "out of memory" in r.stderr
    assert not run.exists(), sorted(p.name for p in run.iterdir())
