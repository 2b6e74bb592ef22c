"""The build's make side: one line per step unless V=1, the remembered choices
(build/config.mk), and `make help` listing every target a user runs.

The build checks run on a copy of the Makefile and mk/ in a temporary dir with a lib/
of two tiny files, so they neither touch this repo's build/ nor take long.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_make(cwd, *args, env=None):
    e = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "CUDA_HOME",
                                                           "CUDA", "MPI", "NCCL", "CFLAGS", "OPT")}
    e.update(env or {})
    return subprocess.run(["make", "--no-print-directory", "-C", str(cwd), *args],
                          capture_output=True, text=True, env=e, timeout=120)


@pytest.fixture
def tree(tmp_path):
    """Makefile + mk/ over a lib/ with one good and one broken file; a CUDA_HOME with a
    stand-in nvcc, so that the detection says CUDA=1 on any machine."""
    t = tmp_path / "tree"
    t.mkdir()
    shutil.copy(REPO / "Makefile", t)
    shutil.copytree(REPO / "mk", t / "mk")
    (t / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "install-deps.sh", t / "scripts")
    (t / "lib" / "x").mkdir(parents=True)
    (t / "lib" / "x" / "good.c").write_text("int ft_good(int a) { return a + 1; }\n")
    (t / "lib" / "x" / "bad.c").write_text("int ft_bad(void) { int unused; return 0; }\n")
    (t / "build").mkdir()
    (t / "build" / ".deps-build").touch()  # the build's packages: checked already
    nvcc = t / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\nexit 1\n")
    nvcc.chmod(0o755)
    return t


def env_of(tree):
    return {"CUDA_HOME": str(tree / "cuda")}


def test_one_line_per_step_and_v1_shows_the_commands(tree):
    r = run_make(tree, "build/lib/x/good.o", "CUDA=0")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^\s*CC\s+lib/x/good\.c$", r.stderr, re.M), r.stderr
    assert "gcc" not in r.stdout + r.stderr  # no compiler command line
    (tree / "build" / "lib" / "x" / "good.o").unlink()
    r = run_make(tree, "build/lib/x/good.o", "CUDA=0", "V=1")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^gcc .*-c lib/x/good\.c -o build/lib/x/good\.o$", r.stdout, re.M), r.stdout
    assert not re.search(r"^\s*CC\s", r.stderr, re.M)
    (tree / "build" / "lib" / "x" / "good.o").unlink()
    r = run_make(tree, "-s", "build/lib/x/good.o", "CUDA=0")  # silent: neither
    assert r.returncode == 0 and r.stdout == r.stderr == "", r.stdout + r.stderr


def test_errors_and_warnings_show_in_full(tree):
    r = run_make(tree, "build/lib/x/bad.o", "CUDA=0")
    assert r.returncode != 0
    assert re.search(r"^\s*CC\s+lib/x/bad\.c$", r.stderr, re.M)
    assert "lib/x/bad.c:1:" in r.stderr and "unused" in r.stderr, r.stderr


def test_build_choices_are_remembered(tree):
    e = env_of(tree)
    show = "show:;$(info CUDA=$(CUDA) MPI=$(MPI) OPT=$(OPT) CFLAGS=$(CFLAGS))@:"
    r = run_make(tree, "--eval", show, "show", env=e)
    assert "CUDA=1 " in r.stdout, r.stdout  # detected: the stand-in nvcc
    assert "note" not in r.stderr
    detected = r.stdout
    # make CUDA=0 ..., then make without it: still CUDA=0 (the object is not rebuilt)
    r = run_make(tree, "build/lib/x/good.o", "CUDA=0", "MPI=0", "OPT=-O1", env=e)
    assert r.returncode == 0, r.stderr
    assert (tree / "build" / ".flags").read_text().split()[-1] == "0"
    r = run_make(tree, "build/lib/x/good.o", env=e)
    assert r.returncode == 0, r.stderr
    assert "good.c" not in r.stdout + r.stderr, r.stdout  # same flags: nothing rebuilt
    notes = [l for l in r.stderr.splitlines() if "note" in l]
    assert len(notes) == 1 and "CUDA=0" in notes[0] and "MPI=0" in notes[0] \
        and "OPT=-O1" in notes[0], r.stderr
    r = run_make(tree, "--eval", show, "show", env=e)
    assert r.stdout.startswith("CUDA=0 MPI=0 OPT=-O1 CFLAGS=-O1 -g"), r.stdout
    # given again: the new value stays; a value with make and shell characters survives;
    # given as the detected value, it is detected again (and needs no note)
    r = run_make(tree, "--eval", show, "show", "CUDA=1", "CFLAGS=-O2 -DX='a b' -DH=#1 -DD=$$x",
                 env=e)
    assert r.stdout.startswith("CUDA=1 MPI=0"), r.stdout
    r = run_make(tree, "--eval", show, "show", env=e)
    assert r.stdout.strip() == "CUDA=1 MPI=0 OPT=-O1 CFLAGS=-O2 -DX='a b' -DH=#1 -DD=$x", r.stdout
    notes = [l for l in r.stderr.splitlines() if "note" in l]
    assert len(notes) == 1 and "CUDA" not in notes[0] and "MPI=0" in notes[0], r.stderr
    # a sub-make says nothing again
    r = run_make(tree, "--eval", "sub:;@+$(MAKE) --no-print-directory show", "--eval", show,
                 "sub", env=e)
    assert len([l for l in r.stderr.splitlines() if "note" in l]) == 1, r.stderr
    # make clean forgets them
    assert run_make(tree, "clean", env=e).returncode == 0
    r = run_make(tree, "--eval", show, "show", env=e)
    assert r.stdout == detected and "note" not in r.stderr
    # the detected value and the defaults given: nothing to remember
    run_make(tree, "--eval", show, "show", "CUDA=1", "OPT=-O2", env=e)
    assert not (tree / "build" / "config.mk").exists()


def phony_targets(make_db):
    targets = set()
    for line in make_db.splitlines():
        if line.startswith(".PHONY:"):
            targets.update(line.split(":", 1)[1].split())
    return targets


def test_help_lists_every_target():
    e = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    db = subprocess.run(["make", "--no-print-directory", "-C", str(REPO), "-pq", "help"],
                        capture_output=True, text=True, env=e, timeout=120).stdout
    targets = phony_targets(db)
    # the train targets and their -tb variants, compare, the tests and benchmarks
    assert {"train", "train-zero-tb", "compare", "test-unit", "bench", "help"} <= targets
    r = subprocess.run(["make", "--no-print-directory", "-C", str(REPO), "help"],
                       capture_output=True, text=True, env=e, timeout=120)
    assert r.returncode == 0, r.stderr
    listed = set(re.findall(r"[A-Za-z0-9_-]+", r.stdout))
    missing = sorted(targets - listed)
    assert not missing, f"make help does not list: {missing}"
