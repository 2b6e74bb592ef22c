#!/usr/bin/env python3
"""Tokenizer benchmark: ftkit's C tokenizer (ft-tokenize bench) against Hugging Face
`tokenizers` on the same text, plus an id-for-id check on that text.

    FT_TOKENIZE=$PWD/build/tests/ft-tokenize .venv/bin/python tests/bench/bench_tokenizer.py

Builds ~8 MB of varied text (tests/conformance/tokref.py's generator: prose, code,
whitespace runs, numbers, CJK, emoji, combining marks), trains a Llama-3-style and a
Llama-2-style BPE tokenizer (vocab 8000) on part of it, and for each reports MB/s of:
  ours          ft-tokenize bench: each line (with its newline) encoded separately,
                no special tokens, one thread;
  HF batch 1T   tokenizer.encode_batch(lines) with RAYON_NUM_THREADS=1;
  HF loop 1T    a Python loop of tokenizer.encode(line) with RAYON_NUM_THREADS=1;
  HF batch NT   tokenizer.encode_batch(lines) with rayon's default thread count.
The ratio is ours / HF batch 1T (both single-threaded, no Python per-line overhead).
Exit status 1 if the ids differ anywhere on the benchmark text.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "conformance"))

import tokref  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

# Timed in a child process, so that RAYON_NUM_THREADS is read before rayon's pool exists.
HF_TIMER = r"""
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
data = open(sys.argv[2], "rb").read()
mode, repeat = sys.argv[3], int(sys.argv[4])
text = data.decode("utf-8")
lines = [x + "\n" for x in text.split("\n")]
lines[-1] = lines[-1][:-1]
if not lines[-1]:
    lines.pop()
tok.encode_batch(lines[:1000], add_special_tokens=False)   # warm-up
best = None
for _ in range(repeat):
    t0 = time.monotonic()
    if mode == "batch":
        n = sum(len(e.ids) for e in tok.encode_batch(lines, add_special_tokens=False))
    else:
        n = 0
        for x in lines:
            n += len(tok.encode(x, add_special_tokens=False).ids)
    s = time.monotonic() - t0
    best = s if best is None else min(best, s)
print(json.dumps({"bytes": len(data), "seconds": best, "mb_per_s": len(data) / best / 1e6,
                  "tokens": n}))
"""


def hf_time(path, file, mode, threads, repeat):
    env = dict(os.environ)
    env.pop("RAYON_NUM_THREADS", None)
    env.pop("RAYON_RS_NUM_CPUS", None)
    if threads:
        env["RAYON_NUM_THREADS"] = str(threads)
    env["TOKENIZERS_PARALLELISM"] = "true"
    out = subprocess.run([sys.executable, "-c", HF_TIMER, str(path), str(file), mode,
                          str(repeat)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def build_text(target_bytes, seed=11):
    lines, size, k = [], 0, 0
    while size < target_bytes:
        chunk = tokref.corpus_lines(seed + k, 2000)
        k += 1
        for x in chunk:
            lines.append(x)
            size += len(x.encode("utf-8")) + 1
            if size >= target_bytes:
                break
    return "\n".join(lines) + "\n"


def check_ids(exe, d, hf, file):
    text = Path(file).read_bytes().decode("utf-8")
    lines = [x + "\n" for x in text.split("\n")][:-1]
    want = [e.ids for e in hf.encode_batch(lines, add_special_tokens=False)]
    got = tokref.ft_encode(exe, d, lines, add_special=False)
    bad = [i for i, (w, g) in enumerate(zip(want, got)) if w != g]
    for i in bad[:5]:
        print(tokref.describe_mismatch(hf, lines[i], want[i], got[i]))
    return len(lines), len(bad)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--exe", default=os.environ.get("FT_TOKENIZE"),
                    help="ft-tokenize harness (default: $FT_TOKENIZE)")
    ap.add_argument("--mb", type=float, default=8.0, help="benchmark text size in MB")
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--repeat", type=int, default=3,
                    help="passes over the text; ours reports the mean, HF the best")
    ap.add_argument("--workdir", help="keep the text and tokenizers here")
    args = ap.parse_args()
    if not args.exe:
        sys.exit("bench-tokenizer: set FT_TOKENIZE (or --exe) to the ft-tokenize harness")
    exe = os.path.abspath(args.exe)

    tmp = None
    if args.workdir:
        work = Path(args.workdir)
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="bench-tokenizer-")
        work = Path(tmp.name)

    t0 = time.monotonic()
    text = build_text(int(args.mb * 1e6))
    file = work / "bench.txt"
    file.write_bytes(text.encode("utf-8"))
    train = text[: 3_000_000].split("\n")
    dirs = {
        "llama3": tokref.build_llama3(work / "llama3", train, args.vocab),
        "llama2": tokref.build_spm_family(work / "spm", train, args.vocab,
                                          limit_alphabet=400)["llama2"],
    }
    print(f"bench-tokenizer: {file.stat().st_size / 1e6:.2f} MB of text, "
          f"{text.count(chr(10))} lines, vocab {args.vocab}; setup {time.monotonic() - t0:.1f}s",
          flush=True)

    rows, failed = [], False
    for name, d in dirs.items():
        tj = d / "tokenizer.json"
        hf = Tokenizer.from_file(str(tj))
        n_lines, n_bad = check_ids(exe, d, hf, file)
        ours = tokref.ft_bench(exe, d, file, args.repeat)
        b1 = hf_time(tj, file, "batch", 1, args.repeat)
        l1 = hf_time(tj, file, "loop", 1, args.repeat)
        bn = hf_time(tj, file, "batch", None, args.repeat)
        if ours["tokens"] != b1["tokens"]:
            n_bad = max(n_bad, 1)
        failed |= n_bad > 0
        rows.append((name, ours, b1, l1, bn, n_lines, n_bad))

    hdr = (f"{'tokenizer':<10} {'ours MB/s':>10} {'HF batch 1T':>12} {'HF loop 1T':>11} "
           f"{'HF batch NT':>12} {'ratio':>7} {'tokens':>10}  ids")
    print(hdr)
    print("-" * len(hdr))
    for name, ours, b1, l1, bn, n_lines, n_bad in rows:
        ratio = ours["mb_per_s"] / b1["mb_per_s"]
        ids = "identical" if n_bad == 0 else f"{n_bad}/{n_lines} lines DIFFER"
        print(f"{name:<10} {ours['mb_per_s']:>10.2f} {b1['mb_per_s']:>12.2f} "
              f"{l1['mb_per_s']:>11.2f} {bn['mb_per_s']:>12.2f} {ratio:>7.2f} "
              f"{ours['tokens']:>10}  {ids}")
    for name, ours, b1, l1, bn, n_lines, n_bad in rows:
        print(f"bench-tokenizer: {name}: ours {ours['mb_per_s']:.2f} MB/s, "
              f"HF {b1['mb_per_s']:.2f} MB/s, ratio {ours['mb_per_s'] / b1['mb_per_s']:.2f}"
              f" (HF single-thread encode_batch; encode loop {l1['mb_per_s']:.2f} MB/s, "
              f"all threads {bn['mb_per_s']:.2f} MB/s)")
    if tmp is not None:
        tmp.cleanup()
    if failed:
        print("bench-tokenizer: FAILED: ids differ from tokenizers on the benchmark text")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
