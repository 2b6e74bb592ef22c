"""`make compare` (scripts/compare-runs.sh) and the launch lines of the distributed make
targets (mk/workflow.mk).

compare-runs.sh reads run_summary.json and metrics.jsonl from each run dir (the files
rank 0 of ft-train writes); the runs here are fabricated with known numbers, and the
table, the speedup column and the SVG are checked against them. The distributed targets
are checked with `make -n` (the command they would run), and for the errors they stop on
before any rank starts; training under them is tested with the strategies.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "compare-runs.sh"
SVG = "{http://www.w3.org/2000/svg}"
MiB = 1048576


def _cuda_of_build():
    """CUDA=<the value the tools were built with>, so make does not rebuild them."""
    try:
        return ["CUDA=" + (REPO / "build" / ".flags").read_text().split()[-1]]
    except (OSError, IndexError):
        return []


def make(*args, env=None, drop=(), timeout=120):
    """make in the repo; Slurm's variables and `drop` removed from the environment, no
    GPU visible (CUDA_VISIBLE_DEVICES=""), OMP_NUM_THREADS=2 unless env says otherwise."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    for k in ("MAKEFLAGS", "MAKELEVEL", "MPIRUN", "NUM_GPUS", "HOSTFILE", *drop):
        e.pop(k, None)
    e["CUDA_VISIBLE_DEVICES"] = ""
    if "OMP_NUM_THREADS" not in drop:
        e.setdefault("OMP_NUM_THREADS", "2")
    if env:
        e.update(env)
    return subprocess.run(["make", "--no-print-directory", "-C", str(REPO), *_cuda_of_build(),
                           *args], capture_output=True, text=True, env=e, timeout=timeout)


# ---- the distributed targets, dry run ----------------------------------------------------

ROOT = ["--allow-run-as-root"] if os.geteuid() == 0 else []


def launch_line(out, launcher="mpirun"):
    """The argv of the launcher command in `make -n` output: a recipe line of its own, or
    inside the default config's before/after recipe as adapter=$(...)."""
    m = re.search(r"(?:^|\$\()(\S*" + launcher + r"\b[^\n)]*bin/ft-train[^\n)]*)", out, re.M)
    assert m, f"no {launcher} ... bin/ft-train line in:\n{out}"
    return shlex.split(m.group(1))


def after(argv, opt):
    """The values that follow each occurrence of opt in argv."""
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == opt]


def strategy_sets(argv):
    """The --set values of the strategy (the target's run dir comes in one more)."""
    return [s for s in after(argv, "--set") if s.startswith("dist.")]


@pytest.fixture
def cfg(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text("model:\n  name: some/model\ndata:\n  train_path: train.jsonl\n")
    return p


@pytest.mark.parametrize("target,extra,strategy", [
    ("train-distributed", [], "ddp"),
    ("train-zero", [], "zero2"),
    ("train-zero", ["ZERO_STAGE=1"], "zero1"),
    ("train-zero", ["ZERO_STAGE=3"], "zero3"),
    ("train-fsdp", [], "fsdp"),
    ("train-model-parallel", [], "model_parallel"),
])
def test_dry_run_launches_the_strategy(cfg, target, extra, strategy):
    r = make("-n", target, f"CONFIG={cfg}", *extra)
    assert r.returncode == 0, r.stderr
    argv = launch_line(r.stdout)
    assert argv[0] == "mpirun"
    # no GPU visible: 2 CPU ranks, oversubscribed, unbound, OMP_NUM_THREADS exported
    assert after(argv, "-np") == ["2"]
    assert "--oversubscribe" in argv and after(argv, "--bind-to") == ["none"]
    assert after(argv, "-x") == ["OMP_NUM_THREADS=2"]
    assert ("--allow-run-as-root" in argv) == bool(ROOT)
    i = argv.index("bin/ft-train")
    assert after(argv[i:], "--config") == [str(cfg)]
    assert strategy_sets(argv[i:]) == [f"dist.strategy={strategy}"]


def test_dry_run_default_config_keeps_the_before_after_recipe():
    # the embedded default: eval before, training under mpirun, eval after, summary
    r = make("-n", "train-zero", "ZERO_STAGE=3")
    assert r.returncode == 0, r.stderr
    argv = launch_line(r.stdout)
    assert after(argv, "-np") == ["2"] and strategy_sets(argv) == ["dist.strategy=zero3"]
    assert "Before and after fine-tuning" in r.stdout and "ft-eval" in r.stdout


@pytest.mark.parametrize("stage", ["0", "4", "5", "two", ""])
def test_bad_zero_stage_fails_clearly(cfg, stage):
    r = make("-n", "train-zero", f"CONFIG={cfg}", f"ZERO_STAGE={stage}")
    assert r.returncode != 0
    assert f"ZERO_STAGE={stage}:" in r.stderr and "1, 2 or 3" in r.stderr
    assert "mpirun" not in r.stdout
    r = make("-n", "train-zero-tb", f"CONFIG={cfg}", f"ZERO_STAGE={stage}")
    assert r.returncode != 0 and "1, 2 or 3" in r.stderr


@pytest.mark.parametrize("n", ["0", "-1", "x", "2.5"])
def test_bad_num_gpus_fails_clearly(cfg, n):
    r = make("-n", "train-distributed", f"CONFIG={cfg}", f"NUM_GPUS={n}")
    assert r.returncode != 0 and f"NUM_GPUS={n}:" in r.stderr and "positive integer" in r.stderr


def test_num_gpus_and_hostfile(cfg, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# two nodes\nnode1 slots=4\nnode2 slots=4\n\n")
    r = make("-n", "train-distributed", f"CONFIG={cfg}", "NUM_GPUS=4")
    assert r.returncode == 0, r.stderr
    assert after(launch_line(r.stdout), "-np") == ["4"]
    r = make("-n", "train-fsdp", f"CONFIG={cfg}", "NUM_GPUS=8", f"HOSTFILE={hosts}",
             drop=("OMP_NUM_THREADS",))
    assert r.returncode == 0, r.stderr
    argv = launch_line(r.stdout)
    assert after(argv, "-np") == ["8"] and after(argv, "--hostfile") == [str(hosts)]
    # CPU ranks: this machine's cores over the ranks per node (8 ranks on 2 hosts: 4)
    assert after(argv, "-x") == [f"OMP_NUM_THREADS={max(1, len(os.sched_getaffinity(0)) // 4)}"]
    assert "HOSTFILE" not in " ".join(after(argv, "--set-var"))


def test_omp_threads_per_cpu_rank(cfg):
    cores = len(os.sched_getaffinity(0))
    for n in (1, 2, 3):
        r = make("-n", "train-distributed", f"CONFIG={cfg}", f"NUM_GPUS={n}",
                 drop=("OMP_NUM_THREADS",))
        assert r.returncode == 0, r.stderr
        assert after(launch_line(r.stdout), "-x") == [f"OMP_NUM_THREADS={max(1, cores // n)}"]
    # the user's value wins, from the environment or the command line
    r = make("-n", "train-distributed", f"CONFIG={cfg}", env={"OMP_NUM_THREADS": "5"})
    assert after(launch_line(r.stdout), "-x") == ["OMP_NUM_THREADS=5"]
    r = make("-n", "train-distributed", f"CONFIG={cfg}", "OMP_NUM_THREADS=7")
    argv = launch_line(r.stdout)
    assert after(argv, "-x") == ["OMP_NUM_THREADS=7"] and "--set-var" not in argv


def test_overrides_pass_through_and_knobs_do_not(cfg, tmp_path):
    r = make("-n", "train-zero", f"CONFIG={cfg}", "ZERO_STAGE=3", "TRAIN_BATCH_SIZE=3",
             "TUNING_LORA_R=8", "TRAIN_OUTPUT_DIR=/tmp/a b", "NUM_GPUS=2",
             "DEEPSPEED_CONFIG=x.json", "MPIRUN=mpirun", f"RUNS={tmp_path}", "PLOT=x.svg",
             "RESUME=auto")
    assert r.returncode == 0, r.stderr
    argv = launch_line(r.stdout)
    i = argv.index("bin/ft-train")
    assert sorted(after(argv[i:], "--set-var")) == ["TRAIN_BATCH_SIZE=3", "TRAIN_OUTPUT_DIR=/tmp/a b",
                                                   "TUNING_LORA_R=8"]
    assert after(argv[i:], "--set") == ["dist.strategy=zero3"]  # TRAIN_OUTPUT_DIR is given
    assert after(argv[i:], "--resume") == ["auto"]


def test_train_deepspeed_passes_the_json(cfg):
    r = make("-n", "train-deepspeed", f"CONFIG={cfg}")
    assert r.returncode == 0, r.stderr
    assert strategy_sets(launch_line(r.stdout)) == ["dist.deepspeed_config=deepspeed_like/zero2.json"]
    r = make("-n", "train-deepspeed", f"CONFIG={cfg}", "DEEPSPEED_CONFIG=deepspeed_like/zero3 offload.json")
    assert r.returncode == 0, r.stderr
    assert strategy_sets(launch_line(r.stdout)) == [
        "dist.deepspeed_config=deepspeed_like/zero3 offload.json"]


def test_mpirun_override(cfg):
    r = make("-n", "train-distributed", f"CONFIG={cfg}", "MPIRUN=/opt/ompi/bin/mpirun --mca btl self,tcp")
    assert r.returncode == 0, r.stderr
    argv = launch_line(r.stdout)
    assert argv[:4] == ["/opt/ompi/bin/mpirun", "--mca", "btl", "self,tcp"]
    assert after(argv, "-np") == ["2"]


def test_srun_under_slurm(cfg, tmp_path):
    r = make("-n", "train-fsdp", f"CONFIG={cfg}", env={"SLURM_JOB_ID": "42"})
    assert r.returncode == 0, r.stderr
    argv = launch_line(r.stdout, "srun")
    assert argv[0] == "srun" and "--ntasks=2" in argv
    assert "--allow-run-as-root" not in argv and "-np" not in argv
    assert "--export=ALL,OMP_NUM_THREADS=2" in argv
    # inside an allocation that fixes the tasks: srun takes them from it
    r = make("-n", "train-fsdp", f"CONFIG={cfg}",
             env={"SLURM_JOB_ID": "42", "SLURM_NTASKS": "16", "SLURM_CPUS_PER_TASK": "6"},
             drop=("OMP_NUM_THREADS",))
    argv = launch_line(r.stdout, "srun")
    assert not [a for a in argv if a.startswith("--ntasks")]
    assert "--export=ALL,OMP_NUM_THREADS=6" in argv
    # ... unless NUM_GPUS says otherwise
    r = make("-n", "train-fsdp", f"CONFIG={cfg}", "NUM_GPUS=4",
             env={"SLURM_JOB_ID": "42", "SLURM_NTASKS": "16"})
    assert "--ntasks=4" in launch_line(r.stdout, "srun")


def test_gpus_decide_the_default_ranks(cfg):
    # with the GPUs this machine has (maybe none): one rank per GPU, else 2 CPU ranks
    gpus = subprocess.run([str(REPO / "bin" / "gpu-info"), "--count"], capture_output=True,
                          text=True, timeout=60)
    assert gpus.returncode == 0 and re.fullmatch(r"\d+\n", gpus.stdout), gpus.stderr
    n = int(gpus.stdout)
    e = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    r = subprocess.run(["make", "--no-print-directory", "-C", str(REPO), *_cuda_of_build(), "-n",
                        "train-distributed", f"CONFIG={cfg}"], capture_output=True, text=True,
                       env={k: v for k, v in e.items()
                            if not k.startswith("SLURM_") and k not in ("MAKEFLAGS", "NUM_GPUS")},
                       timeout=120)
    assert r.returncode == 0, r.stderr
    argv = launch_line(r.stdout)
    assert after(argv, "-np") == [str(n or 2)]
    assert ("--oversubscribe" in argv) == (n == 0)


def test_tb_variants_train_with_the_strategy(cfg, tmp_path):
    for target, strategy in (("train-fsdp-tb", "dist.strategy=fsdp"),
                             ("train-zero-tb", "dist.strategy=zero1")):
        r = make("-n", target, f"CONFIG={cfg}", "ZERO_STAGE=1", f"RUN_DIR={tmp_path}")
        assert r.returncode == 0, r.stderr
        assert "tensorboard.pid" in r.stdout
        assert strategy_sets(launch_line(r.stdout)) == [strategy]


# ---- the distributed targets: what stops them before any rank starts ---------------------

def test_missing_launcher(cfg):
    r = make("train-distributed", f"CONFIG={cfg}", "MPIRUN=/nonexistent/mpirun")
    assert r.returncode != 0
    assert "/nonexistent/mpirun not found" in r.stderr and "MPIRUN=" in r.stderr


@pytest.mark.skipif(not shutil.which("mpirun"), reason="no mpirun")
def test_missing_hostfile_and_deepspeed_config(cfg, tmp_path):
    r = make("train-distributed", f"CONFIG={cfg}", f"HOSTFILE={tmp_path}/nohosts")
    assert r.returncode != 0 and f"HOSTFILE={tmp_path}/nohosts: no such file" in r.stderr
    r = make("train-deepspeed", f"CONFIG={cfg}", f"DEEPSPEED_CONFIG={tmp_path}/no.json")
    assert r.returncode != 0 and f"DEEPSPEED_CONFIG={tmp_path}/no.json: no such file" in r.stderr


@pytest.mark.skipif(not shutil.which("mpirun"), reason="no mpirun")
def test_bad_override_is_reported_once(cfg):
    # the config is checked in one process before the ranks start, not by every rank
    r = make("train-distributed", f"CONFIG={cfg}", "TRAIN_NOPE=1")
    assert r.returncode != 0
    assert r.stderr.count("TRAIN_NOPE") == 1, r.stderr


# ---- make compare ---------------------------------------------------------------------------

def summary(strategy, world, wall, sps, tps, train_loss, eval_loss, peaks, steps=30):
    return {"strategy": strategy, "world_size": world, "mode": "lora", "device": "cpu",
            "steps": steps, "wall_time_s": wall, "steps_per_second": sps,
            "tokens_per_second": tps, "final_train_loss": train_loss,
            "final_eval_loss": eval_loss, "comm_bytes_per_step": 123456.0,
            "peak_memory_bytes": peaks,
            "peak_memory_by_category": {k: [1] * world for k in
                                        ("weights", "grads", "optim", "activations", "workspace")}}


def write_run(d, summ, train, evals=(), pretty=False, extra_lines=()):
    """train: [(step, loss)], evals: [(step, eval_loss)]: metrics.jsonl in ft-train's order."""
    d.mkdir(parents=True)
    (d / "run_summary.json").write_text(json.dumps(summ, indent=2 if pretty else None) + "\n")
    lines, ev = [], dict(evals)
    for step, loss in train:
        lines.append(json.dumps({"step": step, "epoch": 0, "loss": loss, "learning_rate": 0.0002,
                                 "grad_norm": 1.1, "tokens_per_second": 3000.5,
                                 "elapsed_s": step * 0.1}))
        if step in ev:
            lines.append(json.dumps({"step": step, "eval_loss": ev.pop(step),
                                     "elapsed_s": step * 0.1 + 0.05}))
    lines += [json.dumps({"step": s, "eval_loss": v, "elapsed_s": 9.0}) for s, v in ev.items()]
    lines += list(extra_lines)
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return d


@pytest.fixture
def runs(tmp_path):
    """Three runs: one process, DDP on 2 ranks (1.58x the tokens/s), ZeRO-3 on 4 (2.5x)."""
    base = tmp_path / "runs"
    single = write_run(base / "single", summary("none", 1, 125.4, 0.8, 1000.0, 6.35, None,
                                                [3 * 1024 * MiB]),
                       [(s, 8.0 - s / 10) for s in range(5, 30, 5)], pretty=True)
    ddp = write_run(base / "ddp", summary("ddp", 2, 79.4, 1.26, 1580.0, 3.99, 4.1234,
                                          [1536 * MiB, 1600 * MiB]),
                    [(s, 7.5 - s / 8) for s in range(2, 18, 2)], [(8, 6.6), (16, 5.7)])
    zero3 = write_run(base / "zero3", summary("zero3", 4, 50.25, 2.0, 2500.0, 4.5, 4.75,
                                              [700 * MiB, 800 * MiB, 750 * MiB, 810 * MiB]),
                      [(10, 7.0), (20, 6.0), (30, 5.0)], [(30, 5.5)])
    return [single, ddp, zero3]


def parse_table(out):
    lines = [line for line in out.splitlines() if line.strip()]
    head = lines[0].split()
    assert head == ["run", "strategy", "world", "wall_s", "steps/s", "tokens/s", "train_loss",
                    "eval_loss", "peak_MiB", "speedup"], lines[0]
    return {row.split()[0]: dict(zip(head, row.split())) for row in lines[1:]}


def check_table(t):
    assert list(t) == ["single", "ddp", "zero3"]
    s, d, z = t["single"], t["ddp"], t["zero3"]
    assert (s["strategy"], s["world"], d["strategy"], d["world"], z["strategy"], z["world"]) == \
        ("none", "1", "ddp", "2", "zero3", "4")
    assert float(s["wall_s"]) == 125.4 and float(d["wall_s"]) == 79.4
    assert abs(float(z["wall_s"]) - 50.25) <= 0.05
    assert float(s["steps/s"]) == 0.8 and float(d["steps/s"]) == 1.26
    assert [float(t[r]["tokens/s"]) for r in t] == [1000.0, 1580.0, 2500.0]
    assert [float(t[r]["train_loss"]) for r in t] == [6.35, 3.99, 4.5]
    assert s["eval_loss"] == "-" and float(d["eval_loss"]) == 4.1234
    # the largest rank, in MiB
    assert [float(t[r]["peak_MiB"]) for r in t] == [3072.0, 1600.0, 810.0]
    # tokens/s over the first run's
    assert [t[r]["speedup"] for r in t] == ["1.00x", "1.58x", "2.50x"]


def check_svg(path, runs):
    root = ET.parse(path).getroot()
    assert root.tag == SVG + "svg"
    groups = [g for g in root.iter(SVG + "g") if g.get("class") == "run"]
    assert len(groups) == len(runs)
    lines = list(root.iter(SVG + "polyline"))
    assert len(lines) == len(runs)
    want_points = [5, 8, 3]
    want_evals = [0, 2, 1]
    box_w, box_h = float(root.get("width")), float(root.get("height"))
    for g, n, ne in zip(groups, want_points, want_evals):
        (pl,) = g.iter(SVG + "polyline")
        pts = [tuple(map(float, p.split(","))) for p in pl.get("points").split()]
        assert len(pts) == n
        assert all(0 <= x <= box_w and 0 <= y <= box_h for x, y in pts)
        # steps left to right, a falling loss drawn downward-going (y grows down)
        assert [x for x, _ in pts] == sorted(x for x, _ in pts)
        assert [y for _, y in pts] == sorted(y for _, y in pts)
        assert len(list(g.iter(SVG + "circle"))) == ne
    text = " ".join(t.text or "" for t in root.iter(SVG + "text"))
    for r in ("single", "ddp", "zero3"):
        assert r in text  # the legend
    assert "step" in text and "loss" in text
    # tick labels on both axes
    assert len([t for t in root.iter(SVG + "text") if re.fullmatch(r"-?[\d.]+", t.text or "")]) >= 6


def test_make_compare(runs, tmp_path):
    plot = tmp_path / "out" / "cmp.svg"
    r = make("compare", "RUNS=" + " ".join(map(str, runs)), f"PLOT={plot}")
    assert r.returncode == 0, r.stderr
    check_table(parse_table(r.stdout))
    assert str(plot) in r.stderr
    check_svg(plot, runs)


def test_script_directly_default_plot(runs, tmp_path):
    r = subprocess.run([str(SCRIPT), *map(str, runs)], capture_output=True, text=True,
                       cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    check_table(parse_table(r.stdout))
    assert "runs/compare.svg" in r.stderr
    check_svg(tmp_path / "runs" / "compare.svg", runs)


def test_resumed_run_and_odd_names(tmp_path):
    # a run resumed from step 20 logs 30 again: the last value of a step wins, in step order
    d = write_run(tmp_path / "a&<b>", summary("ddp", 2, 10.0, 3.0, 100.0, 2.0, None, [MiB, MiB]),
                  [(10, 4.0), (20, 3.0), (30, 2.9)],
                  extra_lines=['{"step": 30, "epoch": 0, "loss": 2.5, "elapsed_s": 1.0}',
                               '{"step": 40, "epoch": 0, "loss": 2.0, "elapsed_s": 2.0}', ""])
    plot = tmp_path / "p.svg"
    r = subprocess.run([str(SCRIPT), "--plot", str(plot), str(d) + "/"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    row = parse_table(r.stdout)["a&<b>"]
    assert row["speedup"] == "1.00x" and float(row["peak_MiB"]) == 1.0
    root = ET.parse(plot).getroot()
    (pl,) = root.iter(SVG + "polyline")
    pts = [tuple(map(float, p.split(","))) for p in pl.get("points").split()]
    assert len(pts) == 4 and [y for _, y in pts] == sorted(y for _, y in pts)
    assert "a&<b>" in " ".join(t.text or "" for t in root.iter(SVG + "text"))


@pytest.mark.parametrize("missing", ["run_summary.json", "metrics.jsonl"])
def test_missing_file_names_dir_and_file(runs, tmp_path, missing):
    (runs[1] / missing).unlink()
    plot = tmp_path / "x.svg"
    r = subprocess.run([str(SCRIPT), "--plot", str(plot), *map(str, runs)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    assert str(runs[1]) in r.stderr and missing in r.stderr
    assert not plot.exists()
    r = make("compare", "RUNS=" + " ".join(map(str, runs)), f"PLOT={plot}")
    assert r.returncode != 0 and str(runs[1]) in r.stderr and missing in r.stderr


def test_errors(runs, tmp_path):
    r = subprocess.run([str(SCRIPT), str(tmp_path / "nope")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and str(tmp_path / "nope") in r.stderr
    (runs[0] / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": \n')
    r = subprocess.run([str(SCRIPT), "--plot", str(tmp_path / "x.svg"), str(runs[0])],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"{runs[0]}/metrics.jsonl:2" in r.stderr
    (runs[1] / "run_summary.json").write_text('{"strategy": "ddp", ')
    r = subprocess.run([str(SCRIPT), "--plot", str(tmp_path / "x.svg"), str(runs[1])],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"{runs[1]}/run_summary.json" in r.stderr
    r = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "usage" in r.stderr
    r = subprocess.run([str(SCRIPT), "--plot", "x.png", str(runs[2])], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "svg" in r.stderr
    r = make("compare")
    assert r.returncode != 0 and "RUNS=" in r.stderr
