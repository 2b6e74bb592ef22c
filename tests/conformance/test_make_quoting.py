"""Every make variable that reaches a recipe's shell is quoted (mk/config.mk's q).

Values holding spaces, quotes, backticks, $(...) and ; are given to every workflow target:
`make -n` must print them inside single quotes only (a small shell lexer checks where
they land), nothing may run them (no file `pwned` appears, `make -n` included: its
$(shell ...) calls do run), and real runs work where they are cheap: a CONFIG path with a
space and a quote, a TRAIN_OUTPUT_DIR with a space, `make eval` with a tokenizer path
with a space, HOSTFILE / DEEPSPEED_CONFIG / TB_PORT that used to reach the shell raw.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import rankrun
from rankrun import make_model, write_token_data

REPO = Path(__file__).resolve().parents[2]
MARK = "touch pwned"
# what the value means to make: $$ is one $ (so the shell would see $(touch pwned))
NASTY = "a b'c\"d;`touch pwned`$$(touch pwned)|e&"
NASTY_SEEN = NASTY.replace("$$", "$")


def cuda_of_build():
    """CUDA=<the value the tools were built with>, so make does not rebuild them."""
    try:
        return ["CUDA=" + (REPO / "build" / ".flags").read_text().split()[-1]]
    except (OSError, IndexError):
        return []


def make(*args, env=None, cwd=None, timeout=300):
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    for k in ("MAKEFLAGS", "MAKELEVEL", "MPIRUN", "NUM_GPUS", "HOSTFILE"):
        e.pop(k, None)
    e["CUDA_VISIBLE_DEVICES"] = ""
    e.setdefault("OMP_NUM_THREADS", "2")
    e.update(env or {})
    return subprocess.run(["make", "--no-print-directory", "-C", str(REPO),
                           *cuda_of_build(), *args], capture_output=True, text=True,
                          env=e, timeout=timeout, cwd=cwd)


@pytest.fixture(autouse=True)
def no_pwned():
    """Fails the test when anything ran the injected command (here or in the repo)."""
    spots = [REPO / "pwned", Path.cwd() / "pwned"]
    for p in spots:
        if p.exists():
            p.unlink()
    yield
    ran = [str(p) for p in spots if p.exists()]
    for p in spots:
        if p.exists():
            p.unlink()
    assert not ran, f"the injected command ran: {ran}"


def unquoted_hits(text, needle):
    """Offsets of needle in shell text where the shell would not take it literally: not
    inside single quotes (nor escaped). Tracks '...', "...", $(...), `...` and \\."""
    stack = ["top"]
    hits = []
    i = 0
    while i < len(text):
        top = stack[-1]
        if text.startswith(needle, i) and top != "single":
            hits.append(i)
        c = text[i]
        if top == "single":
            if c == "'":
                stack.pop()
        elif c == "\\":
            i += 1  # the next character is literal (in "..." close enough for our needles)
        elif top == "double":
            if c == '"':
                stack.pop()
            elif text.startswith("$(", i):
                stack.append("sub")
                i += 1
            elif c == "`":
                stack.append("bt")
        else:  # top, sub, bt
            if c == "'":
                stack.append("single")
            elif c == '"':
                stack.append("double")
            elif text.startswith("$(", i):
                stack.append("sub")
                i += 1
            elif c == ")" and top == "sub":
                stack.pop()
            elif c == "`":
                if top == "bt":
                    stack.pop()
                else:
                    stack.append("bt")
        i += 1
    return hits


def test_the_lexer_sees_quoting():
    assert unquoted_hits("echo 'x touch pwned'", MARK) == []
    assert unquoted_hits("echo 'a'\\''touch pwned'", MARK) == []
    assert unquoted_hits('echo "$(f \'touch pwned\')"', MARK) == []
    assert unquoted_hits('echo "x touch pwned"', MARK)
    assert unquoted_hits("echo x`touch pwned`", MARK)
    assert unquoted_hits("echo $(touch pwned)", MARK)


def test_q_quotes_only_what_needs_it():
    show = "show:;@printf '%s\\n' $(call q,$(X)) $(call qw,$(Y))"
    for value, words in [("plain/path-1.2", "a b"), ("a b", "c"), ("it's", "d"),
                         ("", "e"), (NASTY, "f g;h")]:
        r = make("--eval", show, "show", f"X={value}", f"Y={words}")
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [value.replace("$$", "$"), *words.split()], r.stdout


# (target, variables): each variable holds NASTY; every workflow target and its knobs
CASES = [
    ("train", ["CONFIG", "TRAIN_OUTPUT_DIR", "RESUME"]),
    ("train", ["BEFORE_AFTER=1", "CONFIG", "MODEL", "DATA", "TRAIN_OUTPUT_DIR"]),
    ("train-distributed", ["HOSTFILE", "CONFIG", "TRAIN_OUTPUT_DIR", "RESUME"]),
    ("train-distributed", ["MPIRUN", "OMP_NUM_THREADS"]),
    ("train-zero", ["ZERO_STAGE=3", "CONFIG", "HOSTFILE"]),
    ("train-deepspeed", ["DEEPSPEED_CONFIG", "HOSTFILE"]),
    ("train-deepspeed-tb", ["DEEPSPEED_CONFIG", "RUN_DIR"]),
    ("train-deepspeed-tb", ["DEEPSPEED_CONFIG"]),
    ("train-fsdp-tb", ["CONFIG", "RUN_DIR", "HOSTFILE"]),
    ("train-model-parallel", ["CONFIG", "TRAIN_OUTPUT_DIR"]),
    ("train-tb", ["CONFIG", "TRAIN_OUTPUT_DIR", "VENV"]),
    ("eval", ["CONFIG", "MODEL", "ADAPTER", "DATA"]),
    ("merge", ["MODEL", "ADAPTER", "OUT"]),
    ("lora-init", ["MODEL", "OUT", "TRAIN_OUTPUT_DIR"]),
    ("tb", ["RUN_DIR", "VENV"]),
    ("memory-check", ["NUM_GPUS=2", "CONFIG", "HOSTFILE"]),
    ("compare", ["PLOT", "RUNS=runs/a"]),
    ("install", ["PREFIX", "DESTDIR"]),
    ("test-conformance", ["VENV"]),
]


@pytest.mark.parametrize("target,variables", CASES,
                         ids=[f"{t}-{'-'.join(v.split('=')[0] for v in vs)}" for t, vs in CASES])
def test_dry_run_quotes_every_value(target, variables):
    args = [v if "=" in v else f"{v}={NASTY}" for v in variables]
    r = make("-n", target, *args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert MARK in r.stdout  # the value reached the commands (quoted: below)
    hits = unquoted_hits(r.stdout, MARK)
    assert not hits, "\n".join(r.stdout[max(0, h - 200):h + 50] for h in hits)


def test_numeric_knobs_are_checked(tmp_path):
    for args, needle in [(["tb", "TB_PORT=6006;touch pwned"], "TB_PORT="),
                         (["tb", "TB_PORT=70000"], "TB_PORT=70000"),
                         (["train-tb", "TB_PORT=`touch pwned`"], "TB_PORT="),
                         (["train-distributed", "NUM_GPUS=2;touch pwned"], "NUM_GPUS="),
                         (["train-zero", "ZERO_STAGE=2;touch pwned"], "ZERO_STAGE=")]:
        r = make("-n", *args, f"RUN_DIR={tmp_path}", "VENV=/nonexistent",
                 env={"PATH": "/usr/bin:/bin"})
        assert r.returncode != 0 and needle in r.stderr, (args, r.stderr)
        assert MARK not in r.stdout


# ---- real runs ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("quoting")
    make_model(d, "model")
    write_token_data(d)
    return d


def test_hostile_values_do_not_run(work, tmp_path):
    """The values that reached the shell unquoted: HOSTFILE and DEEPSPEED_CONFIG in the
    launch checks' messages, TB_PORT, CONFIG in the default job's "training" line."""
    cfg = rankrun.write_config(work, "hostile", {"train.max_steps": 1})
    for args in (["train-distributed", f"CONFIG={cfg}", "HOSTFILE=`touch pwned`"],
                 ["train-deepspeed-tb", f"CONFIG={cfg}", "DEEPSPEED_CONFIG=x`touch pwned`.json",
                  f"RUN_DIR={tmp_path}", "VENV=/nonexistent"],
                 ["train-distributed", f"CONFIG={cfg}", "HOSTFILE=$$(touch pwned)"]):
        r = make(*args, env={"PATH": "/usr/bin:/bin"})
        assert r.returncode != 0 and "no such file" in r.stderr, r.stderr[-2000:]
    r = make("tb", f"RUN_DIR={tmp_path}", "TB_PORT=`touch pwned`", "VENV=/nonexistent",
             env={"PATH": "/usr/bin:/bin"})
    assert r.returncode != 0 and "TB_PORT" in r.stderr


def test_config_path_with_a_space_and_a_quote(tmp_path):
    """Real runs of the demo config copied into a dir with a space, its name holding a
    quote and a backtick: plain training into a TRAIN_OUTPUT_DIR with a space, then the
    default job's recipe (BEFORE_AFTER=1), which prints CONFIG in its "training" line."""
    d = tmp_path / "my configs"
    d.mkdir()
    cfg = d / "it's `touch pwned`.yaml"
    shutil.copy(REPO / "configs" / "default.yaml", cfg)
    short = ["TRAIN_MAX_STEPS=2", "TRAIN_EVAL_STEPS=1000", "TRAIN_PREDICT_WITH_GENERATE=false",
             "TRAIN_GENERATION_MAX_NEW_TOKENS=2"]
    out = tmp_path / "run dir"
    r = make("train", f"CONFIG={cfg}", f"TRAIN_OUTPUT_DIR={out}", *short, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "final" / "adapter_model.safetensors").is_file()
    assert r.stdout.strip().endswith(str(out / "final"))
    out2 = tmp_path / "it's run 2"
    r = make("train", f"CONFIG={cfg}", f"TRAIN_OUTPUT_DIR={out2}", "BEFORE_AFTER=1", *short,
             timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"== training: {cfg} -> {out2}" in r.stderr
    assert "Before and after fine-tuning" in r.stdout
    for f in ("eval-before.json", "eval-after.json", "predictions-before.jsonl", "merged"):
        assert (out2 / f).exists(), f


def test_eval_with_a_tokenizer_path_with_a_space(tmp_path):
    tok = tmp_path / "my tokenizer"
    tok.mkdir()
    for f in (REPO / "demo" / "model").glob("tokenizer*"):
        shutil.copy(f, tok / f.name)
    r = make("eval", f"MODEL_TOKENIZER={tok}", "ADAPTER=none", "DATA=demo/eval.jsonl",
             "TRAIN_PREDICT_WITH_GENERATE=false", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "perplexity" in r.stdout
    assert f"--tokenizer '{tok}'" in r.stderr  # the command as shown, quoted


def test_install_into_a_prefix_with_a_space_and_a_quote(tmp_path):
    dest = tmp_path / "dest dir"
    r = make("install", "PREFIX=/opt/it's ftkit", f"DESTDIR={dest}")
    assert r.returncode == 0, r.stderr[-3000:]
    root = dest / "opt" / "it's ftkit"
    assert (root / "bin" / "ft-train").is_file() and (root / "lib" / "libft.a").is_file()
    assert (root / "include" / "ftkit" / "run" / "run_check.h").is_file()
    assert (root / "include" / "ftkit" / "ops.h").is_file()
