"""Distributed training benchmark (make bench-dist): ft-train on real Open MPI ranks for
every strategy, LoRA and full fine-tuning, then a scaling model that projects 1..64 GPUs.

Measured: a random Llama model made with transformers, ft-train once per strategy (none
on 1 rank; ddp, zero1, zero2, zero3, fsdp, zero2 + offload_optimizer cpu and
model_parallel on each of --ranks), one thread per rank. Every rank writes one line per
step (FT_DIST_PROFILE, lib/dist/dist_engine.h): the step's wall time, the time it was blocked
in communication and the bytes it sent. Steps after the warm-up are averaged. Runs with
more ranks than cores take only 3 steps after the warm-up: their times mean little, their
bytes check the (N-1)/N factor; the projections use the 2-rank runs.

Modelled (scaling_model.py): per strategy, the step time and scaling efficiency on 1..64
GPUs over NVLink within 8-GPU nodes and InfiniBand across them, for the measured model
(measured compute per rank, measured bytes and calls per step) and for Llama-2-7B (bytes
from its parameter counts by ftkit's engine schedule, compute at an assumed MFU).

Prints the tables; writes results.json, measured.tsv and projection.tsv to --out.

usage: python bench_dist.py --ft-train bin/ft-train [--out runs/bench-dist] [--ranks 2,4]
                            [--steps 16] [--warmup 3] [--batch 4] [--seq 128]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scaling_model as sm  # noqa: E402

TINY = sm.LlamaShape("bench model", vocab=4096, hidden=256, intermediate=688, layers=4,
                     heads=8, kv_heads=4)
LORA_R = 16
DP = ("ddp", "zero1", "zero2", "zero3", "fsdp")
# label -> (dist.strategy, extra --set options)
STRATEGIES = {s: (s, []) for s in DP}
STRATEGIES["zero2+offload"] = ("zero2", ["dist.offload_optimizer=cpu"])
STRATEGIES["model_parallel"] = ("model_parallel", [])
PIPELINE_CHUNKS = 1        # dist.pipeline_micro_batches, its default: the naive pipeline
BIG_ROWS, BIG_SEQ = 4, 2048  # the 7B projection's micro-batch per GPU
NOISY = 1.2  # a mean step this much over the median: something else took the cores
BUSY = 0.25  # a load average over this many per core before the start: a shared machine


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def make_model(d, shape):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # (save_pretrained's shard bar among the log lines)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden,
                      intermediate_size=shape.intermediate, num_hidden_layers=shape.layers,
                      num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                      max_position_embeddings=1024, tie_word_embeddings=shape.tied)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(d, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def make_data(path, rows, seq, vocab):
    """Rows of exactly seq tokens, every token in the loss: each step has the same work."""
    import random
    rng = random.Random(1)
    with open(path, "w") as f:
        for _ in range(rows):
            ids = [rng.randrange(2, vocab) for _ in range(seq)]
            f.write(json.dumps({"input_ids": ids, "labels": ids}) + "\n")


def write_config(path, model, data, a):
    path.write_text(f"""model:
  name: {model}
  max_seq_len: {a.seq}
tuning:
  lora:
    r: {LORA_R}
    alpha: {2 * LORA_R}
    dropout: 0.0
train:
  batch_size: {a.batch}
  max_steps: {a.steps}
  learning_rate: 1e-4
  lr_scheduler: constant
  logging_steps: 1
  save_steps: 1000000
data:
  train_path: {data}
  format: tokens
  shuffle: false
""")


def mpi_prefix(np_):
    mpirun = shutil.which("mpirun")
    if not mpirun:
        sys.exit("bench-dist: mpirun not found (scripts/install-deps.sh installs openmpi-bin)")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [mpirun, *root, "--oversubscribe", "--bind-to", "none", "-np", str(np_),
            "-x", "OMP_NUM_THREADS", "-x", "FT_DIST_PROFILE"]


def oversubscribed(np_):
    return np_ > (os.cpu_count() or 1)


def run_one(a, cfg, runs, label, mode, np_):
    strategy, extra = STRATEGIES.get(label, ("none", []))
    name = f"{mode}-{label}-np{np_}"
    run_dir = runs / name
    shutil.rmtree(run_dir, ignore_errors=True)  # the profile appends
    prof = run_dir / "profile"
    cmd = [a.ft_train, "--config", str(cfg), "--set", f"tuning.mode={mode}",
           "--set", f"dist.strategy={strategy}", "--set", f"train.output_dir={run_dir}"]
    for s in extra:
        cmd += ["--set", s]
    if oversubscribed(np_):  # only their bytes are compared: a few steps do
        cmd += ["--set", f"train.max_steps={min(a.steps, a.warmup + 3)}"]
    if np_ > 1:
        cmd = mpi_prefix(np_) + cmd
    env = dict(os.environ, OMP_NUM_THREADS="1", FT_DIST_PROFILE=str(prof))
    t0 = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode:
        sys.exit(f"bench-dist: {name} failed ({' '.join(cmd)}):\n{out.stderr[-3000:]}")
    log(f"bench-dist: {name}: {time.time() - t0:.1f} s")
    shutil.rmtree(run_dir / "final", ignore_errors=True)  # the weights are not needed
    return summarize(a, label, strategy, mode, np_, run_dir, prof)


def summarize(a, label, strategy, mode, np_, run_dir, prof):
    ranks, steps = [], []
    for r in range(np_):
        rows = [json.loads(l) for l in (prof / f"rank-{r}.jsonl").read_text().splitlines()]
        rows = [x for x in rows if x["step"] > a.warmup]
        if not rows:
            sys.exit(f"bench-dist: {prof}: no step after the warm-up")
        n = len(rows)
        steps += [x["step_s"] for x in rows]
        step = sum(x["step_s"] for x in rows) / n
        wait = sum(x["comm_wait_s"] for x in rows) / n
        ranks.append({"rank": r, "steps": n, "step_s": step, "comm_s": wait,
                      "compute_s": step - wait,
                      "comm_bytes": sum(x["comm_bytes"] for x in rows) / n,
                      "tokens": rows[0]["tokens"], "calls": rows[0]["calls"]})
    def mean(key):
        return sum(r[key] for r in ranks) / len(ranks)

    pipeline = strategy == "model_parallel"
    tokens = ranks[0]["tokens"] if pipeline else sum(r["tokens"] for r in ranks)
    step = mean("step_s")
    median = sorted(steps)[len(steps) // 2]
    units = sm.unit_params(TINY, mode, LORA_R)
    return {
        "strategy": label, "dist_strategy": strategy, "mode": mode, "world": np_,
        "oversubscribed": oversubscribed(np_),
        "step_ms": 1e3 * step, "step_ms_median": 1e3 * median,
        "noisy": step > NOISY * median,
        "compute_ms": 1e3 * mean("compute_s"),
        "comm_ms": 1e3 * mean("comm_s"),
        "compute_total_ms": 1e3 * sum(r["compute_s"] for r in ranks),
        "comm_bytes_per_rank": mean("comm_bytes"), "calls_per_step": ranks[0]["calls"],
        "tokens_per_step": tokens, "tokens_per_s": tokens / step,
        "model_bytes_per_rank": predicted_bytes(strategy, units, np_, a.batch, a.seq),
        "per_rank": ranks, "run_dir": str(run_dir),
    }


def add_scaling(measured):
    """Each run's measured scaling efficiency: its tokens/s over world x the 1-rank run's
    (same mode, 1 thread a rank). On more ranks than cores it is at most cores / world."""
    one = {m["mode"]: m["tokens_per_s"] for m in measured if m["world"] == 1}
    for m in measured:
        m["scaling_eff"] = m["tokens_per_s"] / (m["world"] * one[m["mode"]])


def predicted_bytes(strategy, units, n, rows, seq):
    """The bytes per rank and step that the engine's schedule gives (scaling_model), the
    mean over ranks: a check of the 7B projection's byte counts against measurement."""
    if n == 1:
        return 0.0
    if strategy == "model_parallel":
        act = sm.pipeline_act_bytes(TINY, rows, seq)
        sends = 2 * act + (n - 2) * 2 * act  # end stages send one way, the middle both
        return sends / n + 2 * (n - 1) / n * 16  # + the loss and norm allreduce
    return sm.StepComm.from_collectives(sm.engine_collectives(strategy, units)).sent_bytes(n)


# ---- projections ------------------------------------------------------------------------

def project_measured(measured):
    """The measured model from its 2-rank runs (not oversubscribed): measured compute per
    rank, measured bytes and calls per step."""
    out = []
    for m in measured:
        if m["world"] != 2:
            continue
        for fab in sm.FABRICS:
            if m["dist_strategy"] == "model_parallel":
                sends = m["calls_per_step"].get("send", 0) or 1
                act = m["comm_bytes_per_rank"] / sends
                pts = sm.project_pipeline(m["compute_total_ms"] / 1e3, act, PIPELINE_CHUNKS, fab,
                                          max_stages=TINY.layers + 2)
            else:
                comm = sm.StepComm.from_measured(m["comm_bytes_per_rank"], m["world"],
                                                 m["calls_per_step"])
                pts = sm.project_data_parallel(m["compute_ms"] / 1e3, comm, fab)
            out.append({"model": "measured", "strategy": m["strategy"], "mode": m["mode"],
                        "fabric": fab.name, "source": "measured compute and bytes", "points": pts})
    return out


def project_7b(shape=sm.LLAMA2_7B):
    out = []
    tokens = BIG_ROWS * BIG_SEQ
    for mode in ("lora", "full"):
        units = sm.unit_params(shape, mode, LORA_R)
        params = sum(t + f for t, f in units)
        trainable = sum(t for t, _ in units)
        compute = sm.step_flops(params, tokens, mode) / (sm.ASSUMED_MFU * sm.H100_BF16_FLOPS)
        for label, (strategy, extra) in STRATEGIES.items():
            for fab in sm.FABRICS:
                if strategy == "model_parallel":
                    act = sm.pipeline_act_bytes(shape, BIG_ROWS, BIG_SEQ)
                    pts = sm.project_pipeline(compute, act, PIPELINE_CHUNKS, fab,
                                              max_stages=shape.layers + 2)
                else:
                    comm = sm.StepComm.from_collectives(sm.engine_collectives(strategy, units))
                    host = sm.offload_host_s(trainable) if extra else None
                    pts = sm.project_data_parallel(compute, comm, fab, host_s=host)
                out.append({"model": shape.name, "strategy": label, "mode": mode,
                            "fabric": fab.name, "source": "assumed", "params": params,
                            "trainable": trainable, "compute_s": compute, "points": pts})
    return out


# ---- output -----------------------------------------------------------------------------

def fmt_mb(b):
    return f"{b / 1e6:.3f}"


def print_measured(measured, a, params):
    lora_t = sum(t for t, _ in sm.unit_params(TINY, "lora", LORA_R))
    print(f"model: random Llama (transformers), hidden {TINY.hidden}, {TINY.layers} layers, "
          f"{TINY.heads}/{TINY.kv_heads} heads, vocab {TINY.vocab}: {params / 1e6:.2f}M "
          f"parameters, LoRA r={LORA_R} all-linear {lora_t / 1e6:.2f}M trainable")
    print(f"each rank: {a.batch} x {a.seq} tokens a step, 1 thread; {os.cpu_count()} cores; "
          f"mean of steps {a.warmup + 1}..{a.steps} (after {a.warmup} warm-up)")
    print()
    print("Measured on CPU ranks (mean over ranks and steps; comm = time blocked in "
          "communication, compute = step - comm;")
    print("model MB = bytes per rank predicted from the parameter counts by the engine's "
          "schedule, as the 7B projection uses them)")
    hdr = (f"{'strategy':<15} {'world':>5} {'mode':<4} {'step ms':>7}  {'compute ms':>10} "
           f"{'comm ms':>8} {'comm MB/step/rank':>17} {'calls':>5} {'tokens/s':>9} "
           f"{'model MB':>9} {'scaling':>7}")
    print(hdr)
    for m in measured:
        calls = sum(m["calls_per_step"].values()) if m["world"] > 1 else 0
        star = "*" if m["oversubscribed"] else " "
        noisy = "~" if m["noisy"] else " "
        print(f"{m['strategy']:<15} {m['world']:>4}{star} {m['mode']:<4} {m['step_ms']:7.1f}{noisy} "
              f"{m['compute_ms']:10.1f} {m['comm_ms']:8.1f} "
              f"{fmt_mb(m['comm_bytes_per_rank']):>17} {calls:5d} {m['tokens_per_s']:9.0f} "
              f"{fmt_mb(m['model_bytes_per_rank']):>9} {100 * m['scaling_eff']:6.0f}%")
    print("scaling = tokens/s / (world x the 1-rank tokens/s of the mode): the measured scaling "
          "efficiency (1 thread a rank)")
    if any(m["oversubscribed"] for m in measured):
        print(f"* more ranks than the {os.cpu_count()} cores: times are not comparable; the "
              f"bytes check the (N-1)/N factor")
    if any(m["noisy"] for m in measured):
        print(f"~ the mean step is over {NOISY} x the median (results.json: step_ms_median): "
              "another process took the cores for a while")
    print("model_parallel: comm ms is mostly the pipeline bubble (a stage waiting for the "
          "other's compute); compute ms is per stage")


def print_projection(rows, title):
    print()
    print(title)
    cols = " ".join(f"{n:>5}" for n in sm.WORLDS)
    print(f"{'strategy':<15} {'mode':<4} {'fabric':<9} {cols}  {'step ms@64':>10} "
          f"{'comm MB/GPU@64':>14}")
    for r in rows:
        effs = " ".join(f"{100 * p['efficiency']:5.0f}" if p else f"{'-':>5}" for p in r["points"])
        last = r["points"][-1]
        tail = (f"{1e3 * last['step_s']:10.1f} {last['comm_bytes'] / 1e6:14.1f}" if last
                else f"{'-':>10} {'-':>14}")
        print(f"{r['strategy']:<15} {r['mode']:<4} {r['fabric']:<9} {effs}  {tail}")


ASSUMPTIONS = [
    "ring collectives: allreduce 2(N-1)/N*b/bw + 2(N-1)*lat; reduce-scatter and allgather "
    "(N-1)/N*b/bw + (N-1)*lat; per-rank bytes measured at 2 ranks scaled by the (N-1)/N factor",
    "fabric nvlink+ib: 8 GPUs per node on NVLink 4 (450 GB/s per GPU and direction, 3 us a "
    "hop); above 8 GPUs the ring crosses nodes and runs at InfiniBand NDR (50 GB/s per GPU, "
    "5 us); fabric ib: every hop on InfiniBand",
    "data parallel: weak scaling (batch per GPU fixed), efficiency T(1)/T(N) with T(1) the "
    "compute of one GPU, communication not overlapped with compute (an upper bound on T(N))",
    f"model_parallel: GPipe chunks k={PIPELINE_CHUNKS} (the default), T(N) = C(k+N-1)/(kN) + "
    "2 hops per stage link; efficiency T(1)/(N T(N)); at most one stage per unit "
    "(layers + 2)",
    "measured model: compute is one CPU thread per rank, as measured (not a GPU's)",
    f"Llama-2-7B: {BIG_ROWS} x {BIG_SEQ} tokens per GPU and step; compute 6P (full) or 4P "
    f"(LoRA) FLOP per token at {100 * sm.ASSUMED_MFU:.0f}% MFU of "
    f"{sm.H100_BF16_FLOPS / 1e12:.0f} TFLOP/s (H100 bf16); fp32 gradients and parameters on "
    "the wire as ftkit's engine sends them (bf16 would halve the bytes); offload adds the "
    f"shard's PCIe copies at {sm.PCIE5.bandwidth / 1e9:.0f} GB/s (not the host AdamW); "
    "memory fit not checked (make memory-check NUM_GPUS=n)",
]


def write_tsv(path, header, rows):
    with open(path, "w") as f:
        f.write("\t".join(header) + "\n")
        for r in rows:
            f.write("\t".join(str(x) for x in r) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ft-train", default="bin/ft-train")
    ap.add_argument("--out", default="runs/bench-dist")
    ap.add_argument("--ranks", default="2,4", help="world sizes of the distributed runs")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    worlds = [int(x) for x in a.ranks.split(",") if x]
    if a.steps <= a.warmup or min(worlds, default=2) < 2 or 2 not in worlds:
        sys.exit("bench-dist: --steps must exceed --warmup, and --ranks must include 2")
    a.ft_train = str(Path(a.ft_train).resolve())
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    load0 = os.getloadavg()[0]  # others' work: this bench has not started yet
    params = make_model(out / "model", TINY)
    rows = a.batch * max(worlds) * a.steps
    make_data(out / "train.jsonl", rows, a.seq, TINY.vocab)
    cfg = out / "bench.yaml"
    write_config(cfg, (out / "model").resolve(), (out / "train.jsonl").resolve(), a)

    # the runs whose times count first, the oversubscribed ones (more load) last
    measured = []
    for mode in ("lora", "full"):
        measured.append(run_one(a, cfg, out / "runs", "none", mode, 1))
    for np_ in sorted(worlds, key=lambda n: (oversubscribed(n), n)):
        for mode in ("lora", "full"):
            for label in STRATEGIES:
                measured.append(run_one(a, cfg, out / "runs", label, mode, np_))
    measured.sort(key=lambda m: (m["mode"] != "lora", m["world"]))  # stable: strategy order
    add_scaling(measured)
    proj_measured = project_measured(measured)
    proj_7b = project_7b()

    if load0 > BUSY * (os.cpu_count() or 1):
        print(f"warning: the load average was {load0:.1f} on {os.cpu_count()} cores before the "
              "bench started: other processes shared the cores, so times are inflated and noisy")
    print_measured(measured, a, params)
    print_projection(proj_measured, "Projection of the measured model (modelled: measured "
                     "compute per CPU rank + fabric communication from the measured bytes): "
                     "efficiency % at N GPUs")
    base = sum(t for t, _ in sm.unit_params(sm.LLAMA2_7B, "full"))
    lora = sum(t for t, _ in sm.unit_params(sm.LLAMA2_7B, "lora", LORA_R))
    print_projection(proj_7b, f"Projection of {sm.LLAMA2_7B.name} (assumed: {base / 1e9:.2f}B "
                     f"parameters, LoRA r={LORA_R} {lora / 1e6:.1f}M trainable; bytes from the "
                     "parameter counts, compute from FLOPs): efficiency % at N GPUs")
    print()
    print("Assumptions (projection):")
    for s in ASSUMPTIONS:
        print(f"  - {s}")

    results = {
        "bench": "bench-dist", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cores": os.cpu_count(), "threads_per_rank": 1, "wall_s": time.time() - t0,
        "load_average_before": load0,
        "model": {"shape": vars(TINY), "params": params, "lora_r": LORA_R},
        "per_rank_batch": {"rows": a.batch, "seq": a.seq}, "steps": a.steps,
        "warmup_steps": a.warmup,
        "measured": measured,
        "assumptions": {
            "text": ASSUMPTIONS,
            "fabrics": [{"name": f.name, "gpus_per_node": f.gpus_per_node,
                         "intra": vars(f.intra), "inter": vars(f.inter)} for f in sm.FABRICS],
            "h100_bf16_flops": sm.H100_BF16_FLOPS, "mfu": sm.ASSUMED_MFU,
            "pcie": vars(sm.PCIE5), "llama_7b": vars(sm.LLAMA2_7B),
            "llama_7b_batch": {"rows": BIG_ROWS, "seq": BIG_SEQ},
            "pipeline_chunks": PIPELINE_CHUNKS,
        },
        "projection": proj_measured + proj_7b,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    write_tsv(out / "measured.tsv",
              ["strategy", "world", "mode", "step_ms", "compute_ms", "comm_ms",
               "comm_bytes_per_rank", "calls", "tokens_per_s", "model_bytes_per_rank",
               "oversubscribed", "scaling_efficiency"],
              [[m["strategy"], m["world"], m["mode"], f"{m['step_ms']:.3f}",
                f"{m['compute_ms']:.3f}", f"{m['comm_ms']:.3f}",
                f"{m['comm_bytes_per_rank']:.0f}", sum(m["calls_per_step"].values()),
                f"{m['tokens_per_s']:.1f}", f"{m['model_bytes_per_rank']:.0f}",
                int(m["oversubscribed"]), f"{m['scaling_eff']:.4f}"] for m in measured])
    write_tsv(out / "projection.tsv",
              ["model", "source", "strategy", "mode", "fabric", "world", "step_ms", "comm_ms",
               "comm_bytes_per_gpu", "efficiency"],
              [[r["model"], r["source"], r["strategy"], r["mode"], r["fabric"], p["world"],
                f"{1e3 * p['step_s']:.3f}", f"{1e3 * p['comm_s']:.3f}",
                f"{p['comm_bytes']:.0f}", f"{p['efficiency']:.4f}"]
               for r in results["projection"] for p in r["points"] if p])
    print()
    print(f"results: {out / 'results.json'} (tables: {out / 'measured.tsv'}, "
          f"{out / 'projection.tsv'}; {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
