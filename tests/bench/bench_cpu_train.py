"""CPU training throughput and memory: ftkit vs Hugging Face transformers + PEFT, same
model, same tokens, same machine, in one run.

Makes random Llama-architecture models with transformers: SmolLM-135M's shape (hidden
576, 30 layers, 9/3 heads, vocab 49152, tied embeddings) and a tiny one (hidden 512, 4
layers, 8/4 heads, vocab 8000). For each shape, LoRA (r=16, alpha=32, all linear layers)
and full fine-tuning, gradient checkpointing off and on, it times N AdamW steps (after
one warm-up step) with both stacks: bench-train for ours, and transformers + PEFT on the
suite's torch with sdpa attention, in a child process each, interleaved (ours, HF, ours,
HF, ... --reps times) so that load from elsewhere falls on both alike. It prints, per
case, the best tokens/s of each stack over the repetitions, the least CPU time per step
(user + system, all threads: on a machine shared with other jobs a steadier measure of
the work than the wall clock), the peak RSS of the child process (VmHWM, the kernel's
high-water mark: weights, activations, optimizer state, libraries) and the ratios:
tokens/s ours / HF (want >= 1.5), CPU time HF / ours (the same sense: > 1 is ours
ahead) and RSS ours / HF (want <= 0.5).

Both stacks use every CPU (torch.set_num_threads(os.cpu_count()), OpenMP's default for
ours) and run with the environment given; ours sets OMP_WAIT_POLICY=passive for itself
unless the environment sets a policy, and OPENBLAS_CORETYPE where OpenBLAS mistakes the
CPU for one without AVX2 (lib/core/cpu_env.c). --hf-env K=V adds a
variable to HF's children only (e.g. OMP_WAIT_POLICY=passive, to see torch with the
same wait policy).

usage: python bench_cpu_train.py BENCH_TRAIN_BINARY [--steps N] [--seq T] [--batch B]
           [--reps R] [--shapes tiny,smollm] [--modes lora,full] [--ckpt off,on]
           [--hf-env K=V]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SHAPES = {
    "smollm": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                   num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                   max_position_embeddings=2048, tie_word_embeddings=True, rms_norm_eps=1e-5),
    "tiny": dict(vocab_size=8000, hidden_size=512, intermediate_size=1408,
                 num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                 max_position_embeddings=1024),
}


def hf_worker(model_dir, mode, batch, seq, steps, ckpt):
    """One HF + PEFT measurement in this (child) process: prints tokens/s as JSON."""
    import torch
    from transformers import LlamaForCausalLM
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                             attn_implementation="sdpa")
    if ckpt:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
    if mode == "lora":
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                 target_modules="all-linear"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    t0 = c0 = 0.0
    for s in range(steps + 1):
        if s == 1:
            t0 = time.perf_counter()
            c0 = time.process_time()
        opt.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    tps = batch * seq * steps / (time.perf_counter() - t0)
    cpu_ms = (time.process_time() - c0) * 1e3 / steps
    print(json.dumps({"tokens_per_s": tps, "cpu_ms_per_step": cpu_ms,
                      "peak_rss_bytes": peak_rss()}))


def peak_rss():
    """This process's peak resident set (VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def run_child(argv, env):
    """Runs argv; returns (its JSON line, its peak RSS in MiB, as it reports VmHWM: the
    rusage of a child forked from this process would count this one's pages too)."""
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    if p.returncode:
        sys.exit(f"{argv[0]} failed ({p.returncode}): {p.stderr[-2000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return r, r["peak_rss_bytes"] / 2**20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_train")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--shapes", default="tiny,smollm")
    ap.add_argument("--modes", default="lora,full")
    ap.add_argument("--ckpt", default="off,on")
    ap.add_argument("--hf-env", action="append", default=[])
    ap.add_argument("--hf-worker", nargs=5, metavar=("DIR", "MODE", "B", "T", "STEPS"))
    ap.add_argument("--hf-ckpt", action="store_true")
    a = ap.parse_args()
    if a.hf_worker:
        d, mode, b, t, steps = a.hf_worker
        return hf_worker(d, mode, int(b), int(t), int(steps), a.hf_ckpt)

    from importlib.metadata import version

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # (save_pretrained's shard bar: one line a table row)
    hf_env = dict(os.environ)
    for kv in a.hf_env:
        k, _, v = kv.partition("=")
        hf_env[k] = v
    print(f"{os.cpu_count()} CPU threads, load {os.getloadavg()[0]:.1f}; torch "
          f"{torch.__version__}, transformers {version('transformers')}, peft "
          f"{version('peft')} (sdpa); batch {a.batch} x seq {a.seq}, {a.steps} timed steps, "
          f"best of {a.reps} interleaved; HF env extra: {' '.join(a.hf_env) or 'none'}")
    hdr = (f"{'shape':7} {'mode':4} {'ckpt':4} | {'ours tok/s':>10} {'HF tok/s':>9} "
           f"{'ratio':>6} | {'ours CPU':>9} {'HF CPU':>8} {'ratio':>6} | {'ours RSS':>9} "
           f"{'HF RSS':>8} {'ratio':>6}")
    print(hdr)
    print("-" * len(hdr))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in a.shapes.split(","):
            d = os.path.join(tmp, shape)
            torch.manual_seed(0)
            LlamaForCausalLM(LlamaConfig(**SHAPES[shape])).save_pretrained(d)
            for mode in a.modes.split(","):
                for ck in a.ckpt.split(","):
                    ours_cmd = [a.bench_train, d, "--mode", mode, "--batch", str(a.batch),
                                "--seq", str(a.seq), "--steps", str(a.steps)]
                    hf_cmd = [sys.executable, os.path.abspath(__file__), "-",
                              "--hf-worker", d, mode, str(a.batch), str(a.seq), str(a.steps)]
                    if ck == "on":
                        ours_cmd.append("--ckpt")
                        hf_cmd.append("--hf-ckpt")
                    best = {"ours": (0.0, float("inf"), 0.0), "hf": (0.0, float("inf"), 0.0)}
                    for _ in range(a.reps):
                        for who, cmd, env in (("ours", ours_cmd, None), ("hf", hf_cmd, hf_env)):
                            r, rss = run_child(cmd, env)
                            tps, cpu, peak = best[who]
                            best[who] = (max(tps, r["tokens_per_s"]),
                                         min(cpu, r["cpu_ms_per_step"]), max(peak, rss))
                    (ot, oc, orss), (ht, hc, hrss) = best["ours"], best["hf"]
                    row = dict(shape=shape, mode=mode, ckpt=ck, ours_tokens_per_s=ot,
                               hf_tokens_per_s=ht, ours_cpu_ms_per_step=oc,
                               hf_cpu_ms_per_step=hc, ours_rss_mib=orss, hf_rss_mib=hrss)
                    results.append(row)
                    print(f"{shape:7} {mode:4} {ck:4} | {ot:10.0f} {ht:9.0f} {ot / ht:6.2f} | "
                          f"{oc:7.0f}ms {hc:6.0f}ms {hc / oc:6.2f} | "
                          f"{orss:7.0f}Mi {hrss:6.0f}Mi {orss / hrss:6.2f}", flush=True)
    print(f"load after: {os.getloadavg()[0]:.1f}")
    print("bench-cpu-train json: " + json.dumps(results))


if __name__ == "__main__":
    main()
