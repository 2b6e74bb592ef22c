"""ft-eval's output, as people and scripts read it (the demo model and questions in demo/):

- stderr, not a terminal: one line per event (the data read, the loss done, the
  generation done), the same lines for 4 samples as for 24: nothing per batch or sample;
- stderr on a terminal (a pty): a progress bar redrawn in place ("\\r\\033[K[###...]"),
  replaced by the same event lines;
- stdout: the summary (samples, tokens, loss, perplexity; generated, rougeL, exact_match
  with --generate), the values --json gives; with --json exactly one line, one JSON object;
- every JSON ft-eval writes (stdout, --predictions) parses as strict JSON (no NaN or
  Infinity) also when the model's loss or perplexity is not finite: those are null;
- make's before/after table (mk/workflow.mk's FT_SUMMARY_ROW, run here on ft-eval --json
  output) shows the JSON's values.
"""

import json
import os
import pty
import re
import select
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[2]
FT_EVAL = os.environ.get("FT_EVAL")
MODEL = ROOT / "demo" / "model"
GEN = ["--generate", "--max-new-tokens", "2"]


def strict_json(text):
    """json.loads that refuses NaN, Infinity and -Infinity (Python accepts them; JSON
    has no such values)."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def ft_eval(*args, model=MODEL, stderr_fd=None):
    assert FT_EVAL, "FT_EVAL must be the path of bin/ft-eval"
    cmd = [FT_EVAL, "--model", str(model), *map(str, args)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if stderr_fd is None:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr
        return out.stdout, out.stderr
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr_fd, env=env)
    return p


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    lines = (ROOT / "demo" / "eval.jsonl").read_text().splitlines()
    d = tmp_path_factory.mktemp("eval_output")
    sets = {}
    for n in (4, 24):
        p = d / f"q{n}.jsonl"
        p.write_text("\n".join(lines[:n]) + "\n")
        sets[n] = p
    return sets


def test_stderr_has_a_line_per_event_not_per_sample(data):
    seen = {}
    for n, path in data.items():
        _, err = ft_eval("--data", path, *GEN)
        lines = err.splitlines()
        assert "\r" not in err and "\033" not in err  # no bar off a terminal
        assert [l.split(":")[1].strip() for l in lines] == ["data", "loss", "generation"], err
        assert lines[0] == (f"ft-eval: data: {path}: {n} samples (0 bad lines skipped, 0 "
                            "without a counted token dropped)")
        assert re.fullmatch(rf"ft-eval: loss: {n} samples, [0-9.]+ s", lines[1]), lines[1]
        assert re.fullmatch(rf"ft-eval: generation: {n} samples, at most 2 new tokens each, "
                            r"[0-9.]+ s", lines[2]), lines[2]
        seen[n] = len(lines)
    assert seen[4] == seen[24] == 3


def read_pty(master, proc):
    out = b""
    while True:
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the other side is closed
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    return out.decode()


def test_progress_bar_on_a_terminal(data):
    master, slave = pty.openpty()
    try:
        p = ft_eval("--data", data[24], *GEN, "--json", stderr_fd=slave)
        os.close(slave)
        slave = None
        err = read_pty(master, p)
        stdout = p.stdout.read().decode()
        assert p.wait(timeout=300) == 0, err
    finally:
        os.close(master)
        if slave is not None:
            os.close(slave)
    bars = re.findall(r"\r\033\[K\[([#.]{30})\] (loss|generation) (\d+)/24 samples", err)
    assert {b[1] for b in bars} == {"loss", "generation"}, repr(err)
    assert ("#" * 30, "generation", "24") in bars  # drawn full at the end
    # each phase's bar is erased and replaced by its line; the terminal ends on a new line
    text = re.sub(r"\r\033\[K(\[[#.]{30}\][^\r\n]*)?", "", err).replace("\r\n", "\n")
    assert [l.split(":")[1].strip() for l in text.splitlines()] == ["data", "loss",
                                                                     "generation"], repr(err)
    assert err.endswith("\n")
    assert strict_json(stdout)["samples"] == 24 and stdout.count("\n") == 1


def test_summary_on_stdout_equals_the_json(data):
    for extra in ([], GEN):
        text, _ = ft_eval("--data", data[4], *extra)
        js, _ = ft_eval("--data", data[4], *extra, "--json")
        assert js.endswith("\n") and js.count("\n") == 1, js  # one line
        got = strict_json(js)
        keys = ["loss", "perplexity", "tokens", "samples"]
        if extra:
            keys += ["rougeL", "exact_match", "generated"]
        assert list(got) == keys
        rows = dict(l.split(None, 1) for l in text.splitlines())
        assert sorted(rows) == sorted(keys), text
        for k in keys:
            assert abs(float(rows[k]) - got[k]) <= 1e-4 * max(1.0, abs(got[k])), (k, text, js)
        assert got["samples"] == 4 and got["tokens"] > 0


def test_generate_reads_a_pipe_twice(data, tmp_path):
    """--generate reads the data twice (the loss, then the prompts): a named pipe, as a
    shell's <(...) gives, is copied first, as standard input is, so that every sample
    is generated for; a bad line in it is named by the pipe's name."""
    import threading

    want = strict_json(ft_eval("--data", data[4], *GEN, "--json")[0])

    def through_fifo(text, *args):
        fifo = tmp_path / "fifo"
        if fifo.exists():
            fifo.unlink()
        os.mkfifo(fifo)
        w = threading.Thread(target=lambda: fifo.write_text(text))
        w.start()
        try:
            return subprocess.run([FT_EVAL, "--model", str(MODEL), "--data", str(fifo), *GEN,
                                   *args], capture_output=True, text=True, timeout=60)
        finally:
            w.join(timeout=60)

    out = through_fifo(data[4].read_text(), "--json")
    assert out.returncode == 0, out.stderr
    assert strict_json(out.stdout) == want and want["generated"] == 4
    out = through_fifo(data[4].read_text() + "{not json\n")
    assert out.returncode == 1 and out.stdout == ""
    assert f"{tmp_path / 'fifo'}:5:" in out.stderr and "ft-eval-pipe" not in out.stderr, out.stderr


def broken_model(src, dst, how):
    """A copy of the demo model whose lm_head makes the loss huge (logits x 1e5: the
    perplexity exp(loss) overflows a double) or holds NaN (refused at load)."""
    shutil.copytree(src, dst)
    f = dst / "model.safetensors"
    w = load_file(f)
    head = w["lm_head.weight"].float()
    w["lm_head.weight"] = (head * 1e5 if how == "huge" else head * float("nan")).to(torch.bfloat16)
    save_file(w, f, metadata={"format": "pt"})
    return dst


def test_nan_weights_are_refused_at_load(data, tmp_path):
    """NaN weights never reach a loss of nan: the load names the tensor."""
    model = broken_model(MODEL, tmp_path / "model", "nan")
    out = subprocess.run([FT_EVAL, "--model", str(model), "--data", str(data[4]), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stdout == "", out.stdout
    assert "lm_head.weight" in out.stderr and "NaN" in out.stderr, out.stderr


def test_non_finite_values_are_null(data, tmp_path):
    model = broken_model(MODEL, tmp_path / "model", "huge")
    pred = tmp_path / "pred.jsonl"
    js, _ = ft_eval("--data", data[4], *GEN, "--json", "--predictions", pred, model=model)
    got = strict_json(js)
    assert js.count("\n") == 1
    assert got["perplexity"] is None
    assert got["loss"] > 710  # exp(710) > DBL_MAX
    lines = pred.read_text().splitlines()
    assert len(lines) == 4
    for line in lines:
        strict_json(line)
    text, _ = ft_eval("--data", data[4], model=model)
    assert re.search(r"^perplexity\s+(inf|nan)$", text, re.M), text


def summary_row_recipe():
    """mk/workflow.mk's FT_SUMMARY_ROW, as a makefile of its own with a target that runs
    it on the file F."""
    mk = (ROOT / "mk" / "workflow.mk").read_text()
    m = re.search(r"^define FT_SUMMARY_ROW\n.*?^endef\n", mk, re.M | re.S)
    assert m, "mk/workflow.mk has no FT_SUMMARY_ROW"
    return m.group(0) + "row:\n\t@$(call FT_SUMMARY_ROW,after,\"$(F)\")\n"


def test_make_summary_row_shows_the_json_values(data, tmp_path):
    js, _ = ft_eval("--data", data[4], *GEN, "--json")
    f = tmp_path / "eval-after.json"
    f.write_text(js)
    (tmp_path / "Makefile").write_text(summary_row_recipe())
    # a make of its own: not the one that runs the tests (its -w would print directories)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    out = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(tmp_path), "row",
                          f"F={f}"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    got = strict_json(js)
    assert out.stdout.split() == ["after", f"{got['loss']:.4f}", f"{got['perplexity']:.3f}",
                                  f"{got['exact_match']:.3f}", f"{got['rougeL']:.3f}"], out.stdout
