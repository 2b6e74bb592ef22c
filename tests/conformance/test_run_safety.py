"""ft-train never loses or mixes work, on a tiny random Llama and pre-tokenized data:

- divergence (a non-finite loss or gradient norm) stops the run before the step is
  applied or anything of it written; train.skip_nonfinite_steps skips such steps instead,
  on one rank or several, every rank deciding alike;
- metrics.jsonl and run_summary.json are strict JSON (non-finite numbers are null);
- a new run refuses a dir holding another run's outputs (resume it, another dir, or
  train.overwrite_output_dir, which removes only ours); rotation removes only the
  checkpoints of its own run; leftovers of killed saves and removals are cleaned up;
- a checkpoint resumes only into the run it belongs to (seed, base model, data position);
- a file-size limit (ulimit -f) fails a save cleanly;
- the logged train loss is the mean over the logging window; TensorBoard gets the epoch
  and the HParams plugin's records; eval_strategy no evaluates nothing;
- grad_accum is not capped; every strategy on one process equals the plain run.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import load_file

import rankrun
from rankrun import FT_TRAIN, make_model, run, write_token_data

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    assert FT_TRAIN, "FT_TRAIN must be the path of bin/ft-train"
    d = tmp_path_factory.mktemp("run_safety")
    make_model(d, "model")
    # the same tensors, another config: resuming on it would go on silently without the
    # base model's fingerprint
    shutil.copytree(d / "model", d / "other_base")
    c = json.loads((d / "other_base" / "config.json").read_text())
    c["rope_theta"] = 500000.0
    (d / "other_base" / "config.json").write_text(json.dumps(c))
    write_token_data(d)
    return d


def config(d, name, **over):
    return rankrun.write_config(d, name, {"train.max_steps": 4, "train.warmup_steps": 1},
                                **over)


def strict_json(text):
    """json.loads that rejects NaN and Infinity (Python accepts them by default)."""
    def bad(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=bad)


def tensors(path):
    return load_file(str(path))


def all_finite(path):
    return all(bool(v.isfinite().all()) for v in tensors(path).values())


def metrics(run_dir):
    return [strict_json(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def tb(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


# ---- divergence ----------------------------------------------------------------------

# step 1 (finite) takes the weights to ~1e30; step 2's loss is nan
DIVERGE = dict(train__learning_rate="1e30", train__warmup_steps=0, train__max_steps=6,
               train__save_steps=1, train__save_total_limit=1)


def test_divergence_stops_before_anything_of_the_step_is_written(work):
    cfg = config(work, "diverge", **DIVERGE)
    out = run(cfg, check=False)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "not finite" in out.stderr and "diverged" in out.stderr, out.stderr[-3000:]
    assert "step 2:" in out.stderr  # the first step that went non-finite, named
    d = work / "runs" / "diverge"
    # the last good checkpoint survives, alone; no final/, no partial dir
    assert sorted(p.name for p in d.glob("checkpoint-*")) == ["checkpoint-1"]
    assert not (d / "final").exists()
    ck = d / "checkpoint-1"
    assert all_finite(ck / "adapter_model.safetensors") and all_finite(ck / "optimizer.safetensors")


def test_skip_nonfinite_steps_counts_and_leaves_the_state(work):
    cfg = config(work, "skip", **dict(DIVERGE, train__save_total_limit=0,
                                      train__skip_nonfinite_steps="true", train__logging_steps=2))
    out = run(cfg)
    d = work / "runs" / "skip"
    summary = strict_json((d / "run_summary.json").read_text())
    assert summary["skipped_steps"] == 5 and summary["steps"] == 6, summary
    assert summary["final_train_loss"] is None  # the last step's loss was not finite
    assert "skipped" in out.stderr
    rows = metrics(d)  # strict JSON: a NaN loss is null
    assert [r["skipped_steps"] for r in rows] == [0, 1, 3, 5]
    assert rows[0]["loss"] is not None and all(r["loss"] is None for r in rows[1:])
    # skipped steps are not applied: weights and optimizer state stay those of step 1
    for f in ["adapter_model.safetensors", "optimizer.safetensors"]:
        a, b = tensors(d / "checkpoint-1" / f), tensors(d / "checkpoint-6" / f)
        assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a), f
    with safe_open(str(d / "checkpoint-6" / "optimizer.safetensors"), "pt") as f:
        assert f.metadata()["step"] == "1"  # AdamW's step count did not move either
    state = strict_json((d / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6 and state["skipped_steps"] == 5
    acc = tb(d)
    assert acc.Scalars("train/skipped_steps")[-1].value == 5
    assert all_finite(d / "final" / "adapter_model.safetensors")


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "model_parallel"])
def test_divergence_on_two_ranks_is_one_decision(work, strategy):
    """The ranks stop together (no rank left waiting in a collective until the timeout),
    or skip the same steps as one process does."""
    over = dict(DIVERGE, dist__strategy=strategy, dist__timeout_s=60,
                train__batch_size=4 if strategy == "model_parallel" else 2)
    out = run(config(work, f"diverge_{strategy}", **over), 2, check=False, timeout=120)
    assert out.returncode != 0
    assert "not finite" in out.stderr and "did not complete within" not in out.stderr, \
        out.stderr[-3000:]
    d = work / "runs" / f"diverge_{strategy}"
    assert sorted(p.name for p in d.glob("checkpoint-*")) == ["checkpoint-1"]
    skip = config(work, f"skip_{strategy}", **dict(over, train__skip_nonfinite_steps="true"))
    run(skip, 2, timeout=120)
    s = strict_json((work / "runs" / f"skip_{strategy}" / "run_summary.json").read_text())
    assert s["skipped_steps"] == 5 and s["world_size"] == 2


# ---- the run dir ---------------------------------------------------------------------

def listing(d):
    return sorted((str(p.relative_to(d)), p.stat().st_mtime_ns) for p in d.rglob("*"))


def test_a_new_run_refuses_a_dir_with_another_runs_outputs(work):
    cfg = config(work, "used", train__save_steps=2)
    run(cfg)
    d = work / "runs" / "used"
    (d / "notes.txt").write_text("mine\n")
    before = listing(d)
    out = run(cfg, check=False)
    assert out.returncode == 1
    for hint in [str(d), "--resume auto", "RESUME=auto", "TRAIN_OUTPUT_DIR",
                 "train.overwrite_output_dir=true"]:
        assert hint in out.stderr, (hint, out.stderr)
    assert listing(d) == before  # nothing touched
    # a checkpoint of another dir resumed into it is refused the same way
    out = run(cfg, 1, "--resume", str(work / "runs" / "used" / "checkpoint-2"), check=False)
    assert out.returncode == 0, out.stderr  # (its own checkpoint: that continues it)
    other = config(work, "used_elsewhere", train__save_steps=2, train__output_dir=d)
    shutil.copytree(d / "checkpoint-2", work / "ck2_copy")
    out = run(other, 1, "--resume", str(work / "ck2_copy"), check=False)
    assert out.returncode == 1 and "resumes a checkpoint of another dir" in out.stderr, \
        out.stderr
    # what make's default job adds from a run goes with it; a lora-init adapter (which a
    # run may start from) stays
    (d / "merged").mkdir()
    (d / "merged" / "config.json").write_text("{}")
    (d / "eval-after.json").write_text("{}")
    (d / "lora-init").mkdir()
    (d / "lora-init" / "adapter_config.json").write_text("{}")
    old_id = strict_json((d / "run_summary.json").read_text())["run_id"]
    out = run(cfg, 1, "--set", "train.overwrite_output_dir=true")
    assert "removed the earlier run's outputs" in out.stderr
    assert not (d / "merged").exists() and not (d / "eval-after.json").exists()
    assert (d / "lora-init" / "adapter_config.json").exists()
    assert (d / "notes.txt").read_text() == "mine\n"  # not ours: kept
    assert len(list(d.glob("events.out.tfevents.*"))) == 1
    assert [r["step"] for r in metrics(d) if "loss" in r] == [1, 2, 3, 4]
    assert strict_json((d / "run_summary.json").read_text())["run_id"] != old_id


def test_resume_auto_without_a_checkpoint_in_a_used_dir_is_refused(work):
    cfg = config(work, "no_ckpt")
    run(cfg)
    out = run(cfg, 1, "--resume", "auto", check=False)
    assert out.returncode == 1 and "earlier run" in out.stderr, out.stderr
    # the advice fits the dir: no checkpoint to resume, so resuming is not offered again
    assert "no checkpoint-N to resume from" in out.stderr, out.stderr
    assert "--resume auto" not in out.stderr and "TRAIN_OUTPUT_DIR" in out.stderr, out.stderr


def test_rotation_removes_only_its_own_runs_checkpoints(work):
    """A run resumed in a dir that also holds another run's checkpoint-10 keeps that one:
    save_total_limit rotates its own checkpoints only (before, the lowest steps went,
    which were the resumed run's own)."""
    x = config(work, "rot_x", train__max_steps=10, train__save_steps=10)
    run(x)
    y = config(work, "rot_y", train__max_steps=3, train__save_steps=3)
    run(y)
    dx = work / "runs" / "rot_x"
    shutil.copytree(work / "runs" / "rot_y" / "checkpoint-3", dx / "checkpoint-3")
    cont = config(work, "rot_x", train__max_steps=6, train__save_steps=1,
                  train__save_total_limit=1)
    run(cont, 1, "--resume", str(dx / "checkpoint-3"))
    names = sorted(p.name for p in dx.glob("checkpoint-*"))
    assert names == ["checkpoint-10", "checkpoint-6"], names
    x_id = strict_json((dx / "checkpoint-10" / "trainer_state.json").read_text())["run_id"]
    y_id = strict_json((work / "runs" / "rot_y" / "checkpoint-3" / "trainer_state.json")
                       .read_text())["run_id"]
    state6 = strict_json((dx / "checkpoint-6" / "trainer_state.json").read_text())
    assert state6["run_id"] == y_id != x_id  # the resumed run keeps its id


def test_leftovers_of_a_killed_save_or_removal_are_removed(work):
    cfg = config(work, "leftovers", train__save_steps=2, train__max_steps=4)
    run(cfg)
    d = work / "runs" / "leftovers"
    for name in ["checkpoint-9.tmp", "checkpoint-2.deleting"]:
        (d / name).mkdir()
        (d / name / "adapter_model.safetensors").write_bytes(b"partial")
    out = run(cfg, 1, "--resume", "auto", "--set", "train.max_steps=6")
    assert "leftover" in out.stderr
    assert not list(d.glob("*.tmp")) and not list(d.glob("*.deleting"))
    assert (d / "checkpoint-6").is_dir()


def test_the_default_config_run_twice_refuses_then_overwrites_when_asked(tmp_path):
    """configs/default.yaml (which users copy) never deletes a run by itself: a second run
    into its dir is refused, and starts over with train.overwrite_output_dir=true (what
    `make train`'s default job passes, test_make_workflow)."""
    args = [FT_TRAIN, "--config", str(REPO / "configs" / "default.yaml"),
            "--set", "train.max_steps=1", "--set", "train.eval_strategy=no",
            "--set", f"train.output_dir={tmp_path / 'default'}"]
    out = subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    out = subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode != 0 and "overwrite_output_dir" in out.stderr, out.stderr[-2000:]
    out = subprocess.run(args + ["--set", "train.overwrite_output_dir=true"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(list((tmp_path / "default").glob("events.out.tfevents.*"))) == 1


# ---- resuming the right run ----------------------------------------------------------

@pytest.fixture(scope="module")
def saved(work):
    run(config(work, "saved", train__save_steps=2))
    return work / "runs" / "saved" / "checkpoint-2"


@pytest.mark.parametrize("change,expect", [
    ({"train__seed": 7}, ["train.seed 42", "this run's is 7"]),
    ({"model.name": "other_base"}, ["base model", "fingerprint", "config.json"]),
    ({"train__grad_accum": 2}, ["data position", "train.grad_accum"]),
    ({"train__max_steps": 1}, ["past the 1 steps"]),
])
def test_resume_refuses_another_run(work, saved, change, expect):
    change = dict(change)
    model = change.pop("model.name", "model")
    cfg = rankrun.write_config(work, "resume_other", {"train.max_steps": 4,
                                                      "train.warmup_steps": 1},
                               model=model, **change)
    shutil.rmtree(work / "runs" / "resume_other", ignore_errors=True)
    out = run(cfg, 1, "--resume", str(saved), check=False)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "refusing to resume" in out.stderr, out.stderr
    for e in expect:
        assert e in out.stderr, (e, out.stderr)
    if model != "model":  # both named
        assert f"'{work / model}'" in out.stderr and f"'{work / 'model'}'" in out.stderr


def test_a_checkpoint_of_version_1_still_resumes(work, saved):
    old = work / "v1_checkpoint"
    shutil.copytree(saved, old)
    p = old / "trainer_state.json"
    state = strict_json(p.read_text())
    for k in ["skipped_steps", "run_id", "base_model"]:
        del state[k]
    state["version"] = 1
    p.write_text(json.dumps(state))
    out = run(config(work, "from_v1"), 1, "--resume", str(old))
    assert "resumed from" in out.stderr


# ---- writes that fail ----------------------------------------------------------------

def test_a_file_size_limit_fails_the_save_cleanly(work):
    """Under `ulimit -f` a write past the limit fails with EFBIG (SIGXFSZ is ignored): the
    save reports the file, removes its .tmp, keeps the previous checkpoint, exits 1."""
    cfg = config(work, "fsize", train__save_steps=2, tuning__lora__r=64)
    run(cfg, 1, "--set", "train.max_steps=2")
    d = work / "runs" / "fsize"
    size = (d / "checkpoint-2" / "optimizer.safetensors").stat().st_size
    assert size > 60 * 1024, size
    before = {p.name: p.read_bytes() for p in (d / "checkpoint-2").iterdir()}
    # blocks of 1024 bytes: room for the logs, not for the optimizer state
    cmd = f"ulimit -f 48; exec {FT_TRAIN} --config {cfg} --resume auto"
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 1, (out.returncode, out.stderr[-2000:])
    assert "File too large" in out.stderr and "checkpoint-4" in out.stderr, out.stderr[-2000:]
    assert sorted(p.name for p in d.iterdir() if p.name.startswith("checkpoint-")) == \
        ["checkpoint-2"]
    assert {p.name: p.read_bytes() for p in (d / "checkpoint-2").iterdir()} == before


# ---- logging -------------------------------------------------------------------------

def test_logged_loss_is_the_mean_of_the_window(work):
    run(config(work, "log_every", train__max_steps=6))
    run(config(work, "log_window", train__max_steps=6, train__logging_steps=3))
    each = {r["step"]: r["loss"] for r in metrics(work / "runs" / "log_every") if "loss" in r}
    rows = {r["step"]: r["loss"] for r in metrics(work / "runs" / "log_window") if "loss" in r}
    assert sorted(rows) == [1, 3, 6]
    want = {1: each[1], 3: (each[2] + each[3]) / 2, 6: (each[4] + each[5] + each[6]) / 3}
    for s, v in want.items():
        assert rows[s] == pytest.approx(v, rel=1e-5), (s, rows[s], v)
    acc = tb(work / "runs" / "log_window")
    for e in acc.Scalars("train/loss"):
        assert e.value == pytest.approx(want[e.step], rel=1e-5)
    # run_summary keeps the last step's loss
    s = strict_json((work / "runs" / "log_window" / "run_summary.json").read_text())
    assert s["final_train_loss"] == pytest.approx(each[6], rel=1e-5)


def test_tensorboard_epoch_and_hparams(work):
    from tensorboard.plugins.hparams import plugin_data_pb2
    d = work / "runs" / "hparams"
    # 48 rows, batch 4: 12 steps an epoch
    run(config(work, "hparams", train__max_steps=18, train__logging_steps=6,
               train__learning_rate="0.005", data__eval_path=work / "train.jsonl",
               train__eval_strategy="steps", train__eval_steps=9))
    acc = tb(d)
    epochs = {e.step: e.value for e in acc.Scalars("train/epoch")}
    assert epochs == pytest.approx({1: 1 / 12, 6: 0.5, 12: 1.0, 18: 1.5})
    meta = {}
    for tag in acc.Tags()["tensors"]:
        if tag.startswith("_hparams_/"):
            m = acc.SummaryMetadata(tag)
            assert m.plugin_data.plugin_name == "hparams"
            meta[tag] = plugin_data_pb2.HParamsPluginData.FromString(m.plugin_data.content)
    assert sorted(meta) == ["_hparams_/experiment", "_hparams_/session_end_info",
                            "_hparams_/session_start_info"]
    hp = meta["_hparams_/session_start_info"].session_start_info.hparams
    assert hp["train.learning_rate"].number_value == pytest.approx(0.005)
    assert hp["train.max_steps"].number_value == 18
    assert hp["tuning.mode"].string_value == "lora"
    assert hp["train.gradient_checkpointing"].WhichOneof("kind") == "bool_value"
    assert hp["world_size"].number_value == 1
    exp = meta["_hparams_/experiment"].experiment
    assert {h.name for h in exp.hparam_infos} == set(hp)
    tags = {m.name.tag for m in exp.metric_infos}
    assert {"train/loss", "eval/loss", "final/train_loss", "final/eval_loss"} <= tags
    assert meta["_hparams_/session_end_info"].session_end_info.status == 1  # STATUS_SUCCESS
    # the final metrics, as run_summary.json has them
    s = strict_json((d / "run_summary.json").read_text())
    assert acc.Scalars("final/train_loss")[-1].value == pytest.approx(s["final_train_loss"],
                                                                      rel=1e-5)
    assert acc.Scalars("final/eval_loss")[-1].value == pytest.approx(s["final_eval_loss"],
                                                                     rel=1e-5)
    # and what TensorBoard's HParams backend reads from the run
    from tensorboard.plugins.hparams import metadata
    content = acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    assert metadata.parse_session_start_info_plugin_data(content).hparams["tuning.lora.r"] \
        .number_value == 4


def test_eval_strategy_no_evaluates_nothing(work):
    d = work / "runs" / "no_eval"
    out = run(config(work, "no_eval", data__eval_path=work / "train.jsonl",
                     train__eval_strategy="no"))
    assert "eval step" not in out.stderr
    assert strict_json((d / "run_summary.json").read_text())["final_eval_loss"] is None
    assert "eval/loss" not in tb(d).Tags()["scalars"]
    assert not [r for r in metrics(d) if "eval_loss" in r]


# ---- batches and strategies ----------------------------------------------------------

def test_grad_accum_above_64(work):
    d = work / "runs" / "accum100"
    run(config(work, "accum100", train__batch_size=1, train__grad_accum=100,
               train__max_steps=2))
    s = strict_json((d / "run_summary.json").read_text())
    assert s["grad_accum"] == 100 and s["global_batch_size"] == 100 and s["steps"] == 2


STRATEGIES = [("ddp", {}), ("zero1", {}), ("zero2", {}), ("zero3", {}), ("fsdp", {}),
              ("model_parallel", {}), ("zero1", {"dist__offload_optimizer": "cpu"}),
              ("zero2", {"dist__offload_optimizer": "cpu"}),
              ("zero3", {"dist__offload_optimizer": "cpu"})]


@pytest.fixture(scope="module")
def plain(work):
    run(config(work, "plain1", dist__strategy="none", train__max_steps=3))
    return work / "runs" / "plain1"


@pytest.mark.parametrize("strategy,extra", STRATEGIES,
                         ids=[s + ("_offload" if e else "") for s, e in STRATEGIES])
def test_every_strategy_on_one_process_equals_the_plain_run(work, plain, strategy, extra):
    name = f"one_{strategy}" + ("_offload" if extra else "")
    run(config(work, name, dist__strategy=strategy, train__max_steps=3, **extra))
    d = work / "runs" / name
    want = {r["step"]: r for r in metrics(plain)}
    got = {r["step"]: r for r in metrics(d)}
    assert got.keys() == want.keys()
    for s in want:
        assert got[s]["loss"] == pytest.approx(want[s]["loss"], rel=1e-6), s
        assert got[s]["grad_norm"] == pytest.approx(want[s]["grad_norm"], rel=1e-5), s
    wa = tensors(plain / "final" / "adapter_model.safetensors")
    wb = tensors(d / "final" / "adapter_model.safetensors")
    assert wa.keys() == wb.keys()
    worst = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    assert worst <= 1e-6, worst
    # and it trained: the weights moved away from the start (B starts at zero)
    assert max(v.abs().max().item() for k, v in wb.items() if "lora_B" in k) > 0
