"""ft-eval under mpirun: real Open MPI ranks share the data and sum the metrics, and the
result equals one process over all of it (the demo model and questions in demo/).
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FT_EVAL = os.environ.get("FT_EVAL")


def run_eval(np_, data, *extra):
    assert FT_EVAL, "FT_EVAL must be the path of bin/ft-eval"
    cmd = [FT_EVAL, "--model", str(ROOT / "demo" / "model"), "--data", str(data), "--json",
           *extra]
    if np_ > 1:
        mpirun = shutil.which("mpirun")
        assert mpirun, "mpirun not found: scripts/install-deps.sh installs openmpi-bin"
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        cmd = [mpirun, *root, "--oversubscribe", "-np", str(np_), *cmd]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    lines = (ROOT / "demo" / "eval.jsonl").read_text().splitlines()[:14]
    p = tmp_path_factory.mktemp("mpi") / "q.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("np_", [2, 3])
def test_loss_over_ranks_equals_one_process(questions, np_):
    one = run_eval(1, questions)
    many = run_eval(np_, questions)
    assert many["tokens"] == one["tokens"] and many["samples"] == one["samples"] == 14
    # each rank batches other samples together (other padding, other GEMM shapes), so the
    # fp32 token losses differ in rounding: 1e-6 relative
    assert abs(many["loss"] - one["loss"]) <= 1e-6 * abs(one["loss"])


def test_generation_metrics_over_ranks(questions, tmp_path):
    pred = tmp_path / "pred.jsonl"
    one = run_eval(1, questions, "--generate", "--max-new-tokens", "6")
    many = run_eval(2, questions, "--generate", "--max-new-tokens", "6", "--predictions",
                    str(pred))
    assert many["generated"] == one["generated"] == 14
    assert abs(many["rougeL"] - one["rougeL"]) <= 1e-12
    assert abs(many["exact_match"] - one["exact_match"]) <= 1e-12
    shares = [json.loads(x) for r in (0, 1)
              for x in Path(f"{pred}.rank{r}").read_text().splitlines()]
    assert len(shares) == 14


def test_stdin_is_refused_under_ranks():
    mpirun = shutil.which("mpirun")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    out = subprocess.run([mpirun, *root, "--oversubscribe", "-np", "2", FT_EVAL, "--model",
                          str(ROOT / "demo" / "model"), "--data", "-"], input="",
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "standard input" in out.stderr
