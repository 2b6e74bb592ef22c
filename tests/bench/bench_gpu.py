"""GPU training throughput and memory: ftkit against Hugging Face transformers + PEFT on
the same GPU, in one run (issue 8's benchmark; `make bench`).

For each config it writes a random-weight model of the named shape (bf16 safetensors),
times N optimizer steps of ours (build/tests/bench-train) and of transformers + PEFT
(sdpa attention, bf16 autocast, the same batch, sequence length and gradient
checkpointing, AdamW, each in a fresh process), and measures the device's bf16 GEMM rate
with a large cuBLAS matmul. It prints one table and writes it, with every raw figure, to
OUT/<device>.md and OUT/<device>.json.

  config      what is trained
  lora-1b     LoRA r=16 on every linear layer of a Llama-3.2-1B-shaped model
  lora-8b     the same on a Llama-3.1-8B shape
  full-1b     every weight of the 1B shape (ours: fp32 master weights, bf16 compute;
              HF: fp32 weights under bf16 autocast, as Trainer(bf16=True) runs it)
  qlora-8b    LoRA on the 8B shape quantized to NF4 with double quantization (HF:
              bitsandbytes, skipped when it is not installed)

Model FLOPs per token (for MFU) count every matmul once, as the model defines it, not the
recomputation of gradient checkpointing: 2 FLOPs per weight for the forward, 2 more for
the input gradients, 2 more for the weight gradients of what is trained, and causal
attention at 2*T*head_dim per head and layer forward, twice that backward. MFU = model
FLOPs per token x tokens/s / measured GEMM rate. Peak memory: ours is the tracked
allocator's peak (every device buffer the model, optimizer and activations take); HF's is
torch.cuda.max_memory_allocated. Neither counts the CUDA context or library workspaces.

  python bench_gpu.py --bench-train build/tests/bench-train [--out bench/results]
                      [--configs lora-1b,lora-8b,full-1b,qlora-8b] [--steps N]
  python bench_gpu.py --device cpu --tiny ...   # a dry run of the harness without a GPU
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext

# name -> (hidden, intermediate, layers, heads, kv heads, vocab, tied)
SHAPES = {
    "1b": (2048, 8192, 16, 32, 8, 128256, True),   # Llama-3.2-1B
    "8b": (4096, 14336, 32, 32, 8, 128256, False),  # Llama-3.1-8B
    "tiny": (64, 160, 2, 4, 2, 512, False),        # --tiny dry runs
}
CONFIGS = {  # name -> (shape, mode, batch)
    "lora-1b": ("1b", "lora", 4),
    "lora-8b": ("8b", "lora", 2),
    "full-1b": ("1b", "full", 4),
    "qlora-8b": ("8b", "qlora", 2),
}
LORA_R = 16


def llama_config(shape):
    from transformers import LlamaConfig
    C, I, L, H, KV, V, tied = SHAPES[shape]
    return LlamaConfig(hidden_size=C, intermediate_size=I, num_hidden_layers=L,
                       num_attention_heads=H, num_key_value_heads=KV, vocab_size=V,
                       tie_word_embeddings=tied, max_position_embeddings=131072,
                       rope_theta=500000.0, rms_norm_eps=1e-5)


def model_flops_per_token(shape, mode, seq):
    """Model FLOPs of one trained token (see the module doc)."""
    C, I, L, H, KV, V, _ = SHAPES[shape]
    D = C // H
    per_layer = [(C, H * D), (C, KV * D), (C, KV * D), (H * D, C), (C, I), (C, I), (I, C)]
    linear = L * sum(i * o for i, o in per_layer) + V * C  # + lm_head
    attention = L * 2 * seq * H * D  # forward, causal
    if mode == "full":
        return 6 * linear + 3 * attention
    lora = L * sum(LORA_R * (i + o) for i, o in per_layer)
    return 4 * linear + 6 * lora + 3 * attention


def gemm_rate(device):
    """FLOP/s of a large bf16 matmul (fp32 on the CPU dry run)."""
    import torch
    n, dtype = (8192, torch.bfloat16) if device == "cuda" else (512, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    reps = 20 if device == "cuda" else 3
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n ** 3 * reps / (time.perf_counter() - t0)


def sync(device):
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


def write_model(shape, path, device):
    """A random-weight bf16 checkpoint of the shape (weights N(0, 0.02), norms 1)."""
    import torch
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # (save_pretrained's shard bar: no use in a log)
    torch.manual_seed(0)
    cfg = llama_config(shape)
    torch.set_default_dtype(torch.bfloat16)
    # built on the GPU where torch can (2.0 and later): an 8B init on the host is slow
    where = torch.device(device) if hasattr(torch.device, "__enter__") else nullcontext()
    try:
        with where:
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()


def run_ours(bench_train, model_dir, mode, batch, seq, steps, device, timeout):
    cmd = [bench_train, model_dir, "--mode", mode, "--batch", str(batch), "--seq", str(seq),
           "--steps", str(steps), "--ckpt", "--device", device]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if out.returncode:
        return {"error": (out.stderr or out.stdout).strip()[-400:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_hf(model_dir, mode, batch, seq, steps, device, timeout):
    """transformers + PEFT in a fresh process (its own CUDA memory statistics)."""
    job = json.dumps({"dir": model_dir, "mode": mode, "batch": batch, "seq": seq,
                      "steps": steps, "device": device})
    try:
        out = subprocess.run([sys.executable, __file__, "--hf-worker", job],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if out.returncode:
        return {"error": (out.stderr or out.stdout).strip()[-400:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def hf_worker(job):
    import torch
    from transformers import LlamaForCausalLM
    device, mode = job["device"], job["mode"]
    cuda = device == "cuda"
    # sdpa (the GPU baseline); eager on the CPU dry run, whose torch may predate sdpa
    kw = {"attn_implementation": "sdpa" if cuda else "eager"}
    if mode == "qlora":
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            print(json.dumps({"error": "bitsandbytes is not installed"}))
            return
        from transformers import BitsAndBytesConfig
        kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16)
        kw["device_map"] = {"": 0}
        kw["torch_dtype"] = torch.bfloat16
    else:
        # full: fp32 master weights under autocast; LoRA: a bf16 base (fp32 adapters)
        kw["torch_dtype"] = torch.float32 if mode == "full" or not cuda else torch.bfloat16
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    model = LlamaForCausalLM.from_pretrained(job["dir"], **kw)
    if mode != "qlora":
        model.to(device)
    if mode == "qlora":
        from peft import prepare_model_for_kbit_training
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if mode != "full":
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=LORA_R, lora_alpha=2 * LORA_R,
                                                 lora_dropout=0.0, target_modules="all-linear"))
    model.config.use_cache = False
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)  # as bench-train
    g = torch.Generator().manual_seed(42)
    ids = torch.randint(0, model.config.vocab_size, (job["batch"], job["seq"]), generator=g)
    ids = ids.to(device)
    t0 = 0.0
    for step in range(job["steps"] + 1):
        if step == 1:
            sync(device)
            t0 = time.perf_counter()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16) if cuda else nullcontext():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = loss.item()
    dt = time.perf_counter() - t0
    tokens = job["batch"] * job["seq"] * job["steps"]
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    print(json.dumps({"tokens_per_s": tokens / dt, "ms_per_step": dt * 1e3 / job["steps"],
                      "loss": loss, "peak_bytes": {"total": peak},
                      "torch": torch.__version__}))


def device_name(device):
    import torch
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"CPU ({os.cpu_count()} threads)"


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def write_table(a, dev, torch_version, rate, rows, final):
    """The table (printed when final) and OUT/<device>.md and .json, rewritten after each
    config so that a run cut off by its time limit still leaves the configs it finished."""
    gib = 2 ** 30
    lines = [f"Device: {dev}. torch {torch_version}. Measured "
             f"{'bf16' if a.device == 'cuda' else 'fp32'} GEMM rate: {rate / 1e12:.1f} TFLOP/s. "
             f"Sequence {a.seq}, gradient checkpointing, {a.steps} timed steps after one warm-up.",
             "",
             "| config | batch | ours tokens/s | HF tokens/s | ratio | ours peak GiB | "
             "HF peak GiB | mem ratio | ours MFU | HF MFU |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        op = r["ours"].get("peak_bytes", {}).get("total")
        hp = r["hf"].get("peak_bytes", {}).get("total")
        lines.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            r["config"], r["batch"], fmt(r["ours"].get("tokens_per_s"), ".0f"),
            fmt(r["hf"].get("tokens_per_s"), ".0f"), fmt(r["ratio"], ".2f"),
            fmt(op / gib if op else None, ".2f"), fmt(hp / gib if hp else None, ".2f"),
            fmt(r["mem_ratio"], ".2f"), fmt(r["mfu"] and 100 * r["mfu"], ".1f"),
            fmt(r["hf_mfu"] and 100 * r["hf_mfu"], ".1f")))
    table = "\n".join(lines)
    if final:
        print(table)
    os.makedirs(a.out, exist_ok=True)
    slug = "".join(ch if ch.isalnum() else "-" for ch in dev).strip("-").lower()
    slug += "-tiny" if a.tiny else ""
    with open(os.path.join(a.out, slug + ".md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(a.out, slug + ".json"), "w") as f:
        json.dump({"device": dev, "gemm_flops": rate, "rows": rows}, f, indent=1)
    if final:
        print(f"wrote {os.path.join(a.out, slug)}.md and .json")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf-worker", help=argparse.SUPPRESS)
    ap.add_argument("--bench-train", default="build/tests/bench-train")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="every config on a tiny shape")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run")
    ap.add_argument("--models", default=None, help="where the random models go (a temp dir)")
    a = ap.parse_args()
    if a.hf_worker:
        hf_worker(json.loads(a.hf_worker))
        return
    names = [c for c in a.configs.split(",") if c]
    for c in names:
        if c not in CONFIGS:
            sys.exit(f"bench: unknown config '{c}' (one of {', '.join(CONFIGS)})")
    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench: no CUDA device visible to torch (use --device cpu --tiny for a dry run)")
    dev = device_name(a.device)
    rate = gemm_rate(a.device)
    print(f"device: {dev}; torch {torch.__version__}; measured "
          f"{'bf16' if a.device == 'cuda' else 'fp32'} GEMM {rate / 1e12:.1f} TFLOP/s", flush=True)
    rows = []
    models = a.models or tempfile.mkdtemp(prefix="ft-bench-")
    written = {}
    for name in names:
        shape, mode, batch = CONFIGS[name]
        if a.tiny:
            shape, batch = "tiny", 2
        path = os.path.join(models, shape)
        if shape not in written:
            t0 = time.perf_counter()
            write_model(shape, path, a.device)
            written[shape] = time.perf_counter() - t0
            print(f"model {shape}: written in {written[shape]:.0f} s", flush=True)
        ours = run_ours(a.bench_train, path, mode, batch, a.seq, a.steps, a.device, a.timeout)
        hf = run_hf(path, mode, batch, a.seq, a.steps, a.device, a.timeout)
        flops = model_flops_per_token(shape, mode, a.seq)
        row = {"config": name, "shape": shape, "mode": mode, "batch": batch, "seq": a.seq,
               "steps": a.steps, "flops_per_token": flops, "ours": ours, "hf": hf}
        ot, ht = ours.get("tokens_per_s"), hf.get("tokens_per_s")
        op = ours.get("peak_bytes", {}).get("total")
        hp = hf.get("peak_bytes", {}).get("total")
        row["ratio"] = ot / ht if ot and ht else None
        row["mem_ratio"] = op / hp if op and hp else None
        row["mfu"] = flops * ot / rate if ot else None
        row["hf_mfu"] = flops * ht / rate if ht else None
        rows.append(row)
        for who, r in (("ours", ours), ("hf", hf)):
            if "error" in r:
                print(f"{name} {who}: error: {r['error']}", flush=True)
        print(f"{name}: ours {fmt(ot, '.0f')} tokens/s, HF {fmt(ht, '.0f')} tokens/s", flush=True)

        write_table(a, dev, torch.__version__, rate, rows, final=False)
    write_table(a, dev, torch.__version__, rate, rows, final=True)


if __name__ == "__main__":
    main()
