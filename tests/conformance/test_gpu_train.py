"""ft-train on the GPU (train.device cuda), on the tiny Llama of test_train_tool.py:

- a 200-step LoRA run tracks the CPU run's loss curve, in fp32 (to fp32 reduction-order
  drift) and in bf16 (to bf16 rounding); both learn;
- two GPU runs give the same adapter bit for bit, and a GPU run killed with SIGKILL after
  a checkpoint resumes to the losses and adapter of the uninterrupted run, bit for bit;
- QLoRA (NF4 base quantized on load) on the GPU tracks the CPU QLoRA run;
- one process with FT_DIST_BACKEND=nccl runs NCCL with world size 1 and trains as the
  plain run does; zero1, offload_optimizer, zero2, zero3, fsdp and model_parallel on the
  GPU equal the plain run, and resume from their checkpoints;
- ft-eval --device cuda gives the CPU's eval loss (fp32; bf16 to its rounding);
- the TensorBoard events carry the GPU's utilization and memory in use (NVML);
- running out of GPU memory (FT_MEM_LIMIT) prints the memory plan and the overrides that
  fit, and exits non-zero.

Runs where torch sees a CUDA GPU (the GPU machine, tests/run-gpu.sh); skipped elsewhere.
Every comparison prints its figure."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from test_train_tool import (FT_TRAIN, kill_after, tb_scalars, train, workdir,  # noqa: F401
                             write_config)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

STEPS = 200
# fp32: the GPU sums in another order than the CPU; the drift after 200 updates stays
# far below the loss's own step-to-step noise. bf16: weights and activations rounded to
# 8 bits of mantissa; compared as 20-step means.
FP32_TOL = 2e-3
BF16_WINDOW_TOL = 3e-2


def metrics_losses(run_dir):
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "loss" in r:
            out[r["step"]] = r["loss"]
    return out


def curve(workdir, name, device, bf16=True, extra=(), env=None, **train_keys):
    keys = dict(max_steps=STEPS, save_steps=10_000, eval_strategy="no", learning_rate=2e-3,
                logging_steps=1, device=device, bf16=str(bf16).lower())
    keys.update(train_keys)
    cfg = write_config(workdir, name, **keys)
    out = subprocess.run([FT_TRAIN, "--config", str(cfg), *extra], capture_output=True,
                         text=True, env=dict(os.environ, **(env or {})))
    assert out.returncode == 0, out.stderr[-3000:]
    return metrics_losses(workdir / name), out.stderr


def window_means(losses, w=20):
    steps = sorted(losses)
    return [sum(losses[s] for s in steps[i:i + w]) / w for i in range(0, len(steps) - w + 1, w)]


@pytest.fixture(scope="module")
def cpu_curve(workdir):
    return curve(workdir, "curve_cpu", "cpu")[0]


def test_gpu_fp32_tracks_cpu(workdir, cpu_curve):
    gpu, log = curve(workdir, "curve_gpu_fp32", "cuda", bf16=False)
    assert "takes GPU" in log
    assert sorted(gpu) == sorted(cpu_curve) == list(range(1, STEPS + 1))
    worst = max(abs(gpu[s] - cpu_curve[s]) / max(1.0, abs(cpu_curve[s])) for s in gpu)
    print(f"\nfp32 GPU vs CPU, {STEPS} steps: worst relative loss difference {worst:.3g} "
          f"(tol {FP32_TOL}); first {cpu_curve[1]:.4f}, last CPU {cpu_curve[STEPS]:.4f} "
          f"GPU {gpu[STEPS]:.4f}")
    assert worst <= FP32_TOL
    assert gpu[STEPS] < gpu[1] - 0.5
    # NVML's view of the GPU in the TensorBoard events (the driver ships NVML)
    tags = tb_scalars(workdir / "curve_gpu_fp32").Tags()["scalars"]
    if "no GPU utilization in the logs" not in log:
        assert "gpu/utilization_percent" in tags and "gpu/memory_used_bytes" in tags


def test_gpu_bf16_tracks_cpu(workdir, cpu_curve):
    gpu, _ = curve(workdir, "curve_gpu_bf16", "cuda", bf16=True)
    a, b = window_means(cpu_curve), window_means(gpu)
    worst = max(abs(x - y) / max(1.0, abs(x)) for x, y in zip(a, b))
    print(f"\nbf16 GPU vs CPU, {STEPS} steps: 20-step means {['%.3f' % x for x in b]} vs "
          f"{['%.3f' % x for x in a]}; worst relative difference {worst:.3g} "
          f"(tol {BF16_WINDOW_TOL})")
    assert worst <= BF16_WINDOW_TOL
    assert b[-1] < b[0] - 0.5


def test_gpu_runs_repeat_bitwise(workdir):
    a, _ = curve(workdir, "rep_a", "cuda", max_steps=12)
    b, _ = curve(workdir, "rep_b", "cuda", max_steps=12)
    assert a == b
    assert (workdir / "rep_a" / "final" / "adapter_model.safetensors").read_bytes() == \
        (workdir / "rep_b" / "final" / "adapter_model.safetensors").read_bytes()


def test_gpu_resume_after_kill_is_bitwise(workdir):
    ref, _ = curve(workdir, "gk_ref", "cuda", max_steps=40, save_steps=4)
    cfg = write_config(workdir, "gk", max_steps=40, save_steps=4, eval_strategy="no",
                       learning_rate=2e-3, logging_steps=1, device="cuda")
    kill_after(cfg, "checkpoint-8", timeout=120)
    out = train(cfg, "--resume", "auto")
    assert "resumed from" in out.stderr
    got = metrics_losses(workdir / "gk")
    assert got == ref, {s: (got[s], ref.get(s)) for s in got if got[s] != ref.get(s)}
    print(f"\nGPU kill -9 after checkpoint-8 and resume: {len(got)} losses equal bit for bit")
    assert (workdir / "gk" / "final" / "adapter_model.safetensors").read_bytes() == \
        (workdir / "gk_ref" / "final" / "adapter_model.safetensors").read_bytes()


def test_gpu_one_process_nccl_and_zero1_offload_equal_plain(workdir):
    plain, _ = curve(workdir, "eq_plain", "cuda", max_steps=12)
    nccl, log = curve(workdir, "eq_nccl", "cuda", max_steps=12,
                      env={"FT_DIST_BACKEND": "nccl"})
    assert "1 rank (nccl)" in log
    assert nccl == plain
    for name, keys in [("eq_zero1", ["--set", "dist.strategy=zero1"]),
                       ("eq_offload", ["--set", "dist.offload_optimizer=cpu"])]:
        got, _ = curve(workdir, name, "cuda", max_steps=12, extra=keys)
        worst = max(abs(got[s] - plain[s]) for s in plain)
        print(f"\n{name}: worst loss difference to the plain GPU run {worst:.3g}")
        assert worst <= 1e-6


def test_gpu_oom_prints_plan_and_overrides(workdir):
    cfg = write_config(workdir, "g_oom", max_steps=2, eval_strategy="no", device="cuda")
    out = subprocess.run([FT_TRAIN, "--config", str(cfg)], capture_output=True, text=True,
                         env=dict(os.environ, FT_MEM_LIMIT="64KiB"))
    assert out.returncode == 1, out.stderr[-2000:]
    assert "out of memory on rank 0 (GPU 0)" in out.stderr
    assert "memory plan:" in out.stderr and "budget per rank: 0.1 MiB (FT_MEM_LIMIT)" in out.stderr
    assert "error: " in out.stderr and "out of GPU memory allocating" in out.stderr
    assert "cudaError" not in out.stderr


_plain = {}


@pytest.mark.parametrize("strategy", ["zero2", "zero3", "fsdp", "model_parallel"])
def test_gpu_unbound_strategies_equal_plain(workdir, strategy):
    """The strategies that bind the model to buffers of their own (fp32 masters beside
    bf16 compute copies, bf16 gathers and sends), on one GPU under NCCL: the plain GPU
    run's losses, LoRA and full fine-tuning; a resume from their checkpoint continues
    with the same losses."""
    for mode in ["lora", "full"]:
        keys = ["--set", f"tuning.mode={mode}"]
        if mode not in _plain:
            _plain[mode] = curve(workdir, f"ub_plain_{mode}", "cuda", max_steps=12, extra=keys)[0]
        plain = _plain[mode]
        name = f"ub_{strategy}_{mode}"
        over = keys + ["--set", f"dist.strategy={strategy}"]
        got, log = curve(workdir, name, "cuda", max_steps=12, save_steps=6, extra=over,
                         env={"FT_DIST_BACKEND": "nccl"})
        assert "1 rank (nccl)" in log
        worst = max(abs(got[s] - plain[s]) for s in plain)
        print(f"\n{strategy} {mode} on the GPU: worst loss difference to the plain run "
              f"{worst:.3g}")
        assert sorted(got) == sorted(plain) and worst <= 1e-6
        resumed, _ = curve(workdir, f"{name}_resumed", "cuda", max_steps=12,
                           extra=over + ["--resume", str(workdir / name / "checkpoint-6")],
                           env={"FT_DIST_BACKEND": "nccl"})
        assert sorted(resumed) == list(range(7, 13))
        assert max(abs(resumed[s] - plain[s]) for s in resumed) <= 1e-6


def test_gpu_qlora_tracks_cpu_qlora(workdir):
    """tuning.mode qlora (NF4 with double quantization, quantized on load) on the GPU in
    fp32 against the same run on the CPU: the same quantized base, the same curve."""
    keys = ["--set", "tuning.mode=qlora"]
    cpu, _ = curve(workdir, "q_cpu", "cpu", max_steps=30, extra=keys)
    gpu, _ = curve(workdir, "q_gpu", "cuda", bf16=False, max_steps=30, extra=keys)
    worst = max(abs(gpu[s] - cpu[s]) / max(1.0, abs(cpu[s])) for s in cpu)
    print(f"\nqlora fp32 GPU vs CPU, 30 steps: worst relative loss difference {worst:.3g}")
    assert worst <= FP32_TOL
    bf, _ = curve(workdir, "q_gpu_bf16", "cuda", bf16=True, max_steps=30, extra=keys)
    assert bf[30] < bf[1]


def test_gpu_eval_equals_cpu_eval(workdir):
    """ft-eval --device cuda: the loss of the base model on the eval set, fp32 to the
    CPU's reduction-order difference, bf16 to bf16 rounding."""
    ft_eval = os.environ.get("FT_EVAL") or str(Path(FT_TRAIN).with_name("ft-eval"))
    base = [ft_eval, "--model", str(workdir / "model"), "--data",
            str(workdir / "eval.jsonl"), "--json"]

    def loss(*extra):
        out = subprocess.run(base + list(extra), capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout)["loss"]

    cpu, fp32, bf16 = loss("--device", "cpu"), loss("--device", "cuda", "--fp32"), \
        loss("--device", "cuda")
    print(f"\nft-eval loss: CPU {cpu:.6f}, GPU fp32 {fp32:.6f}, GPU bf16 {bf16:.6f}")
    assert abs(fp32 - cpu) <= 1e-5 * max(1.0, abs(cpu))
    assert abs(bf16 - cpu) <= 2e-2 * max(1.0, abs(cpu))
