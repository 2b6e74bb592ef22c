"""Checked before launch, said once (lib/run/run_check.c).

What a rank would reject from its config (the model dir and its config.json, the data
files, the global batch at the launch's world size, model_parallel with
predict_with_generate, beam search, the strategy at that world size, ...) is checked by
`ft-train --check N` before anything starts, and by ft-train itself on every rank at
start: a direct `mpirun ft-train` says it once (rank 0) and every rank exits non-zero
without MPI_Abort. The make targets run the check once before mpirun (and before the
default job's "before" evaluation). The collective timeout comes from NCCL_TIMEOUT when
dist.timeout_s is not set (FT_DIST_TIMEOUT first).
"""

import json
import os
import subprocess

import pytest

import rankrun
from rankrun import FT_TRAIN, make_model, mpi_cmd, run, write_token_data


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    assert FT_TRAIN, "FT_TRAIN must be the path of bin/ft-train"
    d = tmp_path_factory.mktemp("launch_check")
    make_model(d, "model")
    (d / "no_config").mkdir()
    write_token_data(d)
    return d


def write_config(d, name, **over):
    return rankrun.write_config(d, name, {"train.max_steps": 2, "train.warmup_steps": 0},
                                **over)


def check(cfg, *args, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([FT_TRAIN, "--config", str(cfg), *args], capture_output=True,
                          text=True, timeout=60, env=e)


def errors(text):
    return [l for l in text.splitlines() if "error" in l]


def test_check_passes_a_good_config(work):
    cfg = write_config(work, "good")
    for n in ("1", "2", "4"):
        r = check(cfg, "--check", n)
        assert r.returncode == 0, r.stderr
        assert f"{n} rank" in r.stdout
    r = check(cfg, "--check")  # one rank
    assert r.returncode == 0 and "1 rank" in r.stdout, r.stderr
    assert not (work / "runs" / "good").exists()  # a check writes nothing


BAD = [
    # (name, overrides, world, what the message must say)
    ("no_model", {"model.name": "/nonexistent/model"}, 1, ["/nonexistent/model"]),
    ("no_config_json", {"model.name": "{d}/no_config"}, 1, ["config.json"]),
    ("no_data", {"data.train_path": "{d}/missing.jsonl"}, 1,
     ["data.train_path", "missing.jsonl"]),
    ("no_eval_data", {"data.eval_path": "{d}/missing_eval.jsonl"}, 1,
     ["data.eval_path", "missing_eval.jsonl"]),
    ("global_batch", {"train.global_batch_size": 8}, 3, ["world_size 3", "global_batch_size"]),
    ("global_batch_accum", {"train.global_batch_size": 12, "train.grad_accum": "auto"}, 2,
     ["world_size 2"]),
    ("mp_generate", {"dist.strategy": "model_parallel", "train.predict_with_generate": "true"},
     2, ["predict_with_generate", "model_parallel"]),
    ("beams", {"train.generation_num_beams": 4}, 1, ["generation_num_beams", "greedy"]),
    ("none_on_ranks", {"dist.strategy": "none"}, 2, ["dist.strategy none", "2 ranks"]),
    ("mp_offload", {"dist.strategy": "model_parallel", "dist.offload_optimizer": "cpu"}, 2,
     ["offload_optimizer", "model_parallel"]),
    ("mp_too_many", {"dist.strategy": "model_parallel"}, 5, ["5 ranks", "4 units"]),
    ("budget", {"train.memory_budget": "lots"}, 1, ["train.memory_budget"]),
]


@pytest.mark.parametrize("name,over,world,needles", BAD, ids=[b[0] for b in BAD])
def test_check_refuses(work, name, over, world, needles):
    over = {k.replace(".", "__"): str(v).replace("{d}", str(work)) for k, v in over.items()}
    cfg = write_config(work, f"bad_{name}", **over)
    r = check(cfg, "--check", str(world))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stdout == ""
    errs = errors(r.stderr)
    assert len(errs) == 1 and errs[0].startswith("ft-train: error: "), r.stderr
    for n in needles:
        assert n in errs[0], (n, errs[0])


def test_check_usage_errors(work):
    cfg = write_config(work, "usage")
    for bad in ("0", "-1", "x"):
        r = check(cfg, f"--check={bad}")
        assert r.returncode == 2 and "--check" in r.stderr


@pytest.mark.parametrize("name,over,needle", [
    ("rank_no_model", {"model__name": "/nonexistent/model"}, "/nonexistent/model"),
    ("rank_batch", {"train__global_batch_size": 6}, "world_size 2"),
    ("rank_mp_generate", {"dist__strategy": "model_parallel",
                          "train__predict_with_generate": "true"}, "predict_with_generate"),
])
def test_direct_mpirun_says_it_once(work, name, over, needle):
    """Every rank fails the same check: rank 0 prints it, no MPI_Abort, all exit 1."""
    cfg = write_config(work, name, **over)
    r = run(cfg, 2, check=False, timeout=120)
    assert r.returncode != 0
    errs = errors(r.stderr)
    assert len([l for l in errs if l.startswith("ft-train: error:")]) == 1, r.stderr
    assert needle in r.stderr
    assert "MPI_ABORT" not in r.stderr and "rank 1" not in r.stderr, r.stderr
    assert not (work / "runs" / name).exists()


# ---- the make targets -----------------------------------------------------------------

make = rankrun.make


def test_make_train_distributed_checks_before_mpirun(work):
    cfg = write_config(work, "mk_no_model", model__name="/nonexistent/model")
    r = make("train-distributed", f"CONFIG={cfg}", "NUM_GPUS=2")
    assert r.returncode != 0
    assert r.stderr.count("/nonexistent/model") == 1, r.stderr
    # checked before mpirun started: no rank ran, mpirun reports no exit status
    assert "MPI_ABORT" not in r.stderr and "mpirun" not in r.stderr, r.stderr


def test_make_train_deepspeed_batch_at_the_world_size(work, tmp_path):
    ds = tmp_path / "ds one.json"
    ds.write_text(json.dumps({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 4,
                              "zero_optimization": {"stage": 2}}))
    cfg = write_config(work, "mk_ds")
    r = make("train-deepspeed", f"CONFIG={cfg}", f"DEEPSPEED_CONFIG={ds}", "NUM_GPUS=2")
    assert r.returncode != 0
    errs = [l for l in r.stderr.splitlines() if "error" in l]
    assert len(errs) == 1 and "world_size 2" in errs[0], r.stderr
    assert "MPI_ABORT" not in r.stderr and "mpirun" not in r.stderr, r.stderr


def test_make_default_job_checks_before_the_before_evaluation(tmp_path):
    """train-model-parallel on the default job (predict_with_generate: true) fails before
    its 'before' evaluation, as does make train with a model that is not there."""
    run_dir = tmp_path / "mp"
    r = make("train-model-parallel", f"TRAIN_OUTPUT_DIR={run_dir}")
    assert r.returncode != 0
    assert "== before" not in r.stderr, r.stderr
    assert r.stderr.count("predict_with_generate") == 1, r.stderr
    assert "MPI_ABORT" not in r.stderr
    r = make("train", "MODEL_NAME=/nonexistent/model", f"TRAIN_OUTPUT_DIR={run_dir}")
    assert r.returncode != 0
    assert "== before" not in r.stderr and "/nonexistent/model" in r.stderr, r.stderr
    assert not run_dir.exists()


# ---- the collective timeout: NCCL_TIMEOUT ---------------------------------------------

def saved_timeout(run_dir):
    for line in (run_dir / "config.yaml").read_text().splitlines():
        if line.strip().startswith("timeout_s:"):
            return float(line.split(":")[1])
    raise AssertionError("no dist.timeout_s in config.yaml")


def train(cfg, **env):
    """One process, with only the given timeout variables in the environment."""
    e = {k: v for k, v in os.environ.items() if k not in ("NCCL_TIMEOUT", "FT_DIST_TIMEOUT")}
    return subprocess.run([FT_TRAIN, "--config", str(cfg)], capture_output=True, text=True,
                          timeout=120, env=dict(e, OMP_NUM_THREADS="1", **env))


@pytest.mark.parametrize("name,over,env,want", [
    ("nccl_timeout", {}, {"NCCL_TIMEOUT": "1800"}, 1800),
    ("ft_dist_timeout_first", {}, {"NCCL_TIMEOUT": "1800", "FT_DIST_TIMEOUT": "90"}, 90),
    # dist.timeout_s set in the config (even to its default) wins
    ("explicit_timeout", {"dist__timeout_s": 600}, {"NCCL_TIMEOUT": "1800"}, 600),
    ("plain_timeout", {}, {}, 600),
])
def test_nccl_timeout_when_dist_timeout_is_not_set(work, name, over, env, want):
    cfg = write_config(work, name, **over)
    r = train(cfg, **env)
    assert r.returncode == 0, r.stderr
    assert saved_timeout(work / "runs" / name) == want


def test_bad_nccl_timeout_is_an_error(work):
    cfg = write_config(work, "bad_nccl_timeout")
    r = train(cfg, NCCL_TIMEOUT="soon")
    assert r.returncode == 1 and "NCCL_TIMEOUT=soon" in r.stderr, r.stderr
