"""ft-train on the GPU (train.device cuda), on the tiny Llama of test_train_tool.py:

- a STEPS-step LoRA run tracks the CPU run's loss curve, in fp32 (to fp32 reduction-order
  drift) and in bf16 (to bf16 rounding); both learn;
- two GPU runs give the same adapter bit for bit, and a GPU run killed with SIGKILL after
  a checkpoint resumes to the losses and adapter of the uninterrupted run, bit for bit;
- QLoRA (NF4 base quantized on load) on the GPU tracks the CPU QLoRA run;
- one process with FT_DIST_BACKEND=nccl runs NCCL with world size 1 and trains as the
  plain run does; zero1, offload_optimizer, zero2, zero3, fsdp and model_parallel on the
  GPU equal the plain run, and resume from their checkpoints;
- every dist.strategy on 2 ranks (mpirun -np 2, one GPU a rank, NCCL) in bf16, with the
  compute copies the strategies keep beside their fp32 masters, equals the plain run:
  its first step to the fp32 summation order, the later ones to bf16 rounding (a data-
  parallel gradient is summed in another order than one process sums it, so the bf16
  copies of the masters may round apart; model_parallel equals it); strategies that run
  the same kernels in the same order equal each other bit for bit, and resumed from its
  checkpoint each continues as it did, bit for bit;
- ft-eval --device cuda gives the CPU's eval loss (fp32; bf16 to its rounding), and the
  CPU's figures with --preference too, both paths printing the rank's GPU;
- the TensorBoard events carry the GPU's utilization and memory in use (NVML);
- running out of GPU memory (FT_MEM_LIMIT; on the emulated device also the device's own
  memory, FT_EMU_MEM) prints the memory plan and the overrides that fit, and exits 1.

Runs where torch sees a CUDA GPU (the GPU machine, tests/run-gpu.sh), and on the emulated
device (FT_EMU=1 with FT_TRAIN and FT_EVAL the emulated build's tools: tests/run-gpu.sh's
emulated mode, make test-gpu-emu), which is slow: there FT_GPU_TRAIN_STEPS (20) shortens
the curves and the runs compared bit for bit are 6 steps instead of 12 (the runs on 2
ranks stay 12: see TWO_RANK_STEPS). Skipped elsewhere. Every comparison prints its
figure."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from rankrun import mpi_cmd
from test_train_tool import (FT_TRAIN, kill_after, tb_scalars, train, workdir,  # noqa: F401
                             write_config)

EMU = os.environ.get("FT_EMU") == "1"
pytestmark = pytest.mark.skipif(not (EMU or torch.cuda.is_available()),
                                reason="no CUDA GPU (and not the emulated device: FT_EMU unset)")

# the curves' length: 200 on a GPU; the emulated device takes ~0.3 s a step
STEPS = int(os.environ.get("FT_GPU_TRAIN_STEPS", "200"))
# the runs compared with each other (bit for bit, or to 1e-6)
SHORT = max(6, min(12, STEPS // 3))
# fp32: the GPU sums in another order than the CPU; the drift after 200 updates stays
# far below the loss's own step-to-step noise. bf16: weights and activations rounded to
# 8 bits of mantissa; compared as means over windows of STEPS / 10 steps (at least 5).
FP32_TOL = 2e-3
BF16_WINDOW_TOL = 3e-2
WINDOW = max(5, STEPS // 10)
# how far the loss must fall from its first value of 5.74: by 0.5 in 200 steps; in 20 (the
# learning rate decays over the run) the emulated device's runs reach 5.39
MIN_DROP = 0.5 if STEPS >= 100 else 0.2


def gpu_env(**extra):
    """The environment of a GPU run: on the emulated device, one device unless extra
    names more."""
    env = dict(os.environ)
    if EMU:
        env.setdefault("FT_EMU_DEVICES", "1")
    env.update(extra)
    return env


def need_nccl():
    """Skips where the build has no NCCL: an emulated build without the NCCL emulation
    (FT_EMU_NCCL=0: no MPI). A GPU build has it (make test-gpu)."""
    if EMU and os.environ.get("FT_EMU_NCCL", "1") != "1":
        pytest.skip("this emulated build has no NCCL (FT_EMU_NCCL=0: built without MPI)")


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
                         text=True, env=gpu_env(**(env or {})))
    assert out.returncode == 0, out.stderr[-3000:]
    return metrics_losses(workdir / name), out.stderr


def window_means(losses, w=WINDOW):
    steps = sorted(losses)
    return [sum(losses[s] for s in steps[i:i + w]) / w for i in range(0, len(steps) - w + 1, w)]


@pytest.fixture(scope="module")
def cpu_curve(workdir):
    return curve(workdir, "curve_cpu", "cpu")[0]


@pytest.fixture(scope="module")
def gpu_fp32(workdir):
    return curve(workdir, "curve_gpu_fp32", "cuda", bf16=False)


def test_gpu_fp32_tracks_cpu(gpu_fp32, cpu_curve):
    gpu, log = gpu_fp32
    assert "takes GPU" in log
    assert sorted(gpu) == sorted(cpu_curve) == list(range(1, STEPS + 1))
    worst = max(abs(gpu[s] - cpu_curve[s]) / max(1.0, abs(cpu_curve[s])) for s in gpu)
    print(f"\nfp32 GPU vs CPU, {STEPS} steps: worst relative loss difference {worst:.3g} "
          f"(tol {FP32_TOL}); first {cpu_curve[1]:.4f}, last CPU {cpu_curve[STEPS]:.4f} "
          f"GPU {gpu[STEPS]:.4f}")
    assert worst <= FP32_TOL
    assert gpu[STEPS] < gpu[1] - MIN_DROP


def test_gpu_utilization_in_events(workdir, gpu_fp32):
    """NVML's view of the GPU in the TensorBoard events (the driver ships NVML)."""
    if EMU:
        pytest.skip("the emulated device has no NVML (no utilization or memory to read)")
    log = gpu_fp32[1]
    if "no GPU utilization in the logs" in log:
        pytest.skip(log[log.index("no GPU utilization in the logs"):].splitlines()[0])
    tags = tb_scalars(workdir / "curve_gpu_fp32").Tags()["scalars"]
    assert "gpu/utilization_percent" in tags and "gpu/memory_used_bytes" in tags


def test_gpu_bf16_tracks_cpu(workdir, cpu_curve):
    gpu, _ = curve(workdir, "curve_gpu_bf16", "cuda", bf16=True)
    a, b = window_means(cpu_curve), window_means(gpu)
    worst = max(abs(x - y) / max(1.0, abs(x)) for x, y in zip(a, b))
    print(f"\nbf16 GPU vs CPU, {STEPS} steps: {WINDOW}-step means {['%.3f' % x for x in b]} vs "
          f"{['%.3f' % x for x in a]}; worst relative difference {worst:.3g} "
          f"(tol {BF16_WINDOW_TOL})")
    assert worst <= BF16_WINDOW_TOL
    # progress from the first step (the first window's mean already holds most of the
    # drop: on an H200 the 20-step means fell 5.48 -> 5.13 from a first step of 5.74)
    assert b[-1] < gpu[1] - MIN_DROP


def test_gpu_runs_repeat_bitwise(workdir):
    a, _ = curve(workdir, "rep_a", "cuda", max_steps=SHORT)
    b, _ = curve(workdir, "rep_b", "cuda", max_steps=SHORT)
    assert a == b
    assert (workdir / "rep_a" / "final" / "adapter_model.safetensors").read_bytes() == \
        (workdir / "rep_b" / "final" / "adapter_model.safetensors").read_bytes()


def test_gpu_resume_after_kill_is_bitwise(workdir):
    # 40 steps, a checkpoint every 4, killed after the second; on the emulated device 8,
    # every 2
    n, every = (40, 4) if STEPS >= 100 else (8, 2)
    mark = f"checkpoint-{2 * every}"
    ref, _ = curve(workdir, "gk_ref", "cuda", max_steps=n, save_steps=every)
    cfg = write_config(workdir, "gk", max_steps=n, save_steps=every, eval_strategy="no",
                       learning_rate=2e-3, logging_steps=1, device="cuda")
    kill_after(cfg, mark, timeout=120)
    out = train(cfg, "--resume", "auto")
    assert "resumed from" in out.stderr
    got = metrics_losses(workdir / "gk")
    assert got == ref, {s: (got[s], ref.get(s)) for s in got if got[s] != ref.get(s)}
    print(f"\nGPU kill -9 after {mark} and resume: {len(got)} losses equal bit for bit")
    assert (workdir / "gk" / "final" / "adapter_model.safetensors").read_bytes() == \
        (workdir / "gk_ref" / "final" / "adapter_model.safetensors").read_bytes()


def test_gpu_one_process_nccl_and_zero1_offload_equal_plain(workdir):
    need_nccl()
    plain, _ = curve(workdir, "eq_plain", "cuda", max_steps=SHORT)
    nccl, log = curve(workdir, "eq_nccl", "cuda", max_steps=SHORT,
                      env={"FT_DIST_BACKEND": "nccl"})
    assert "1 rank (nccl)" in log
    assert nccl == plain
    for name, keys in [("eq_zero1", ["--set", "dist.strategy=zero1"]),
                       ("eq_offload", ["--set", "dist.offload_optimizer=cpu"])]:
        got, _ = curve(workdir, name, "cuda", max_steps=SHORT, extra=keys)
        worst = max(abs(got[s] - plain[s]) for s in plain)
        print(f"\n{name}: worst loss difference to the plain GPU run {worst:.3g}")
        assert worst <= 1e-6


def test_gpu_oom_prints_plan_and_overrides(workdir):
    cfg = write_config(workdir, "g_oom", max_steps=2, eval_strategy="no", device="cuda")
    out = subprocess.run([FT_TRAIN, "--config", str(cfg)], capture_output=True, text=True,
                         env=gpu_env(FT_MEM_LIMIT="64KiB"))
    assert out.returncode == 1, out.stderr[-2000:]
    assert "out of memory on rank 0 (GPU 0)" in out.stderr
    assert "memory plan:" in out.stderr and "budget per rank: 0.1 MiB (FT_MEM_LIMIT)" in out.stderr
    assert "error: " in out.stderr and "out of GPU memory allocating" in out.stderr
    assert "cudaError" not in out.stderr


def assert_oom_advice(out, what):
    """out (a finished ft-train) ran out of GPU memory and said so as a run must: exit 1,
    the memory plan, the budget against it and what would fit, the allocation that did
    not; not an abort with a CUDA error."""
    err = out.stderr
    assert out.returncode == 1, f"{what}: exit {out.returncode}\n{err[-2000:]}"
    assert "out of memory on rank 0 (GPU 0)" in err and "memory plan:" in err, f"{what}\n{err}"
    assert "budget per rank:" in err and "free memory of GPU 0" in err, f"{what}\n{err}"
    assert "error: " in err and "out of GPU memory" in err, f"{what}\n{err}"
    assert "CUDA error" not in err and "cudaError" not in err, f"{what}\n{err}"


@pytest.mark.skipif(not EMU, reason="FT_EMU_MEM sizes the emulated device; a GPU's memory "
                                    "cannot shrink (FT_MEM_LIMIT above covers the advice)")
@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "fp32"])
def test_emulated_device_out_of_memory(workdir, bf16):
    """The device itself out of memory (cudaMalloc fails past FT_EMU_MEM): ft-train prints
    the memory plan and the overrides and exits 1, whichever allocation is the first that
    does not fit (the backend's context with cuBLAS's workspace, the weights, the optimizer
    state, the activations, a workspace); at the smallest size that holds the run, it
    trains. Sizes: doubling from 32 KiB to one that trains, the boundary found by bisection
    to 32 KiB, then every 32 KiB in the 2 MiB below it, where the run's own allocations
    (everything after the context's fixed 33 MiB) meet the limit one by one."""
    cfg = write_config(workdir, f"emu_oom_{bf16}", max_steps=1, eval_strategy="no",
                       save_steps=10_000, device="cuda", bf16=str(bf16).lower())
    tried = {}

    def trains(kib):
        if kib not in tried:
            shutil.rmtree(workdir / f"emu_oom_{bf16}", ignore_errors=True)
            out = subprocess.run([FT_TRAIN, "--config", str(cfg)], capture_output=True,
                                 text=True, env=gpu_env(FT_EMU_MEM=f"{kib}KiB"), timeout=120)
            if out.returncode != 0:
                assert_oom_advice(out, f"FT_EMU_MEM={kib}KiB")
            tried[kib] = out.returncode == 0
        return tried[kib]

    high = 32
    while not trains(high):
        assert high < 1 << 20, "no FT_EMU_MEM up to 1 GiB trains"
        high *= 2
    low = high // 2  # fails (or 16 KiB, below anything that could)
    while high - low > 32:
        mid = (low + high) // 2 // 32 * 32
        low, high = (low, mid) if trains(mid) else (mid, high)
    for kib in range(max(32, high - 2048), high, 32):
        assert not trains(kib), f"FT_EMU_MEM={kib}KiB trains, below {high} KiB which was the least"
    failed = sorted(k for k, ok in tried.items() if not ok)
    print(f"\nFT_EMU_MEM, {'bf16' if bf16 else 'fp32'}: out of memory with the advice at "
          f"{len(failed)} sizes from 32 KiB to {max(failed)} KiB, trains at {high} KiB")
    assert failed and failed[0] == 32 and trains(high)


_plain = {}


@pytest.mark.parametrize("strategy", ["zero2", "zero3", "fsdp", "model_parallel"])
def test_gpu_unbound_strategies_equal_plain(workdir, strategy):
    """The strategies that bind the model to buffers of their own (fp32 masters beside
    bf16 compute copies, bf16 gathers and sends), on one GPU under NCCL: the plain GPU
    run's losses, LoRA and full fine-tuning; a resume from their checkpoint continues
    with the same losses."""
    need_nccl()
    half = SHORT // 2
    for mode in ["lora", "full"]:
        keys = ["--set", f"tuning.mode={mode}"]
        if mode not in _plain:
            _plain[mode] = curve(workdir, f"ub_plain_{mode}", "cuda", max_steps=SHORT,
                                 extra=keys)[0]
        plain = _plain[mode]
        name = f"ub_{strategy}_{mode}"
        over = keys + ["--set", f"dist.strategy={strategy}"]
        got, log = curve(workdir, name, "cuda", max_steps=SHORT, save_steps=half, extra=over,
                         env={"FT_DIST_BACKEND": "nccl"})
        assert "1 rank (nccl)" in log
        worst = max(abs(got[s] - plain[s]) for s in plain)
        print(f"\n{strategy} {mode} on the GPU: worst loss difference to the plain run "
              f"{worst:.3g}")
        assert sorted(got) == sorted(plain) and worst <= 1e-6
        resumed, _ = curve(workdir, f"{name}_resumed", "cuda", max_steps=SHORT,
                           extra=over + ["--resume", str(workdir / name / f"checkpoint-{half}")],
                           env={"FT_DIST_BACKEND": "nccl"})
        assert sorted(resumed) == list(range(half + 1, SHORT + 1))
        assert max(abs(resumed[s] - plain[s]) for s in resumed) <= 1e-6


def test_gpu_qlora_tracks_cpu_qlora(workdir):
    """tuning.mode qlora (NF4 with double quantization, quantized on load) on the GPU in
    fp32 against the same run on the CPU: the same quantized base, the same curve (30
    steps; STEPS where shorter); bf16 learns."""
    n = min(30, STEPS)
    keys = ["--set", "tuning.mode=qlora"]
    cpu, _ = curve(workdir, "q_cpu", "cpu", max_steps=n, extra=keys)
    gpu, _ = curve(workdir, "q_gpu", "cuda", bf16=False, max_steps=n, extra=keys)
    assert sorted(gpu) == sorted(cpu) == list(range(1, n + 1))
    worst = max(abs(gpu[s] - cpu[s]) / max(1.0, abs(cpu[s])) for s in cpu)
    print(f"\nqlora fp32 GPU vs CPU, {n} steps: worst relative loss difference {worst:.3g}")
    assert worst <= FP32_TOL
    bf, _ = curve(workdir, "q_gpu_bf16", "cuda", bf16=True, max_steps=n, extra=keys)
    assert bf[n] < bf[1]


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


def test_gpu_eval_preference_equals_cpu_and_names_gpu(workdir):
    """ft-eval places the loss path and the preference path alike (one helper): on the
    GPU both print "rank 0 takes GPU" and, in fp32, give the CPU's figures (the DPO
    metrics of --preference, with the head chunked as the loss path's)."""
    ft_eval = os.environ.get("FT_EVAL") or str(Path(FT_TRAIN).with_name("ft-eval"))
    pairs = workdir / "pref.jsonl"
    pairs.write_text("".join(
        json.dumps({"prompt": f"Q: colour of item {i}?", "chosen": f" {c}",
                    "rejected": f" {['blue', 'red', 'green'][i % 3]}"}) + "\n"
        for i, c in enumerate(["red", "green", "blue"] * 3)))

    def run(*extra):
        out = subprocess.run([ft_eval, "--model", str(workdir / "model"), "--json", *extra],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout), out.stderr

    for data in (["--data", str(workdir / "eval.jsonl")],
                 ["--data", str(pairs), "--preference"]):
        cpu, cpu_log = run(*data, "--device", "cpu")
        gpu, gpu_log = run(*data, "--device", "cuda", "--fp32")
        assert "rank 0 takes GPU 0" in gpu_log, gpu_log
        assert "takes GPU" not in cpu_log, cpu_log
        assert cpu.keys() == gpu.keys()
        for k, v in cpu.items():
            if isinstance(v, float):
                assert abs(gpu[k] - v) <= 1e-5 * max(1.0, abs(v)), (data, k, v, gpu[k])
            else:
                assert gpu[k] == v, (data, k)


# ---- 2 ranks, one GPU each (mpirun -np 2; on the emulated device FT_EMU_DEVICES=2: every
# rank's process sees two devices and takes the one of its node-local rank)

# The 2-rank runs take 12 steps on the emulated device too (not SHORT): the bf16 rounding
# flips below first show at step 9 of zero2 here, so a shorter run would not see what the
# GPU tier sees.
TWO_RANK_STEPS = 12
# Why a data-parallel run on 2 ranks cannot equal the one-process run bit for bit in bf16,
# and by how much it may differ. Each rank's GEMM sums a weight gradient over its own 4
# rows in fp32 and the collective adds the ranks' sums; one process sums its 8 rows in one
# GEMM. fp32 addition is not associative, so the fp32 gradients differ in their last bits
# from the first step on (about 600 of the 4096 LoRA values here, for ddp as for zero2;
# with grad_accum 2, ddp and zero1 add each rank's micro-batches before the reduction and
# zero2, zero3 and fsdp reduce every micro-batch, so the two groups differ from each other
# too), and so do the fp32 masters AdamW makes of them. The forward reads the masters
# rounded to bf16: the same bits unless a master lies within those last bits of a bf16
# rounding midpoint. When one does (zero2 here: 0xbc2b7fff in the plain run, 0xbc2b8000
# on 2 ranks, before step 9), that weight differs by one bf16 ulp (2^-8 relative) and the
# runs differ from then on by bf16 rounding. Which run meets such a master first is chance:
# at learning rate 1.5e-3 ddp differs from step 4 on, at 8e-3 from step 12 where zero2
# does not differ at all.
# So: before the first update both hold the same weights and the first step's loss and
# gradient norm differ only by the fp32 order (FIRST_STEP_TOL, on the events' float32,
# which keep the norm's 7 digits); after it, the losses to BF16_LOSS_TOL and the gradient
# norms to BF16_GRAD_NORM_TOL (one bf16 ulp). On the emulated device, ddp and zero2 at 21
# learning rates from 1e-3 to 1e-2 stayed within 2.6e-5 and 3.7e-4 over 12 steps (7.7e-5
# and 1.6e-3 over 40), where a compute copy gathered stale every other step gives 2.0e-3
# and 7.5e-2, and a gradient rounded to bf16 before its reduction 2.1e-5 in the first
# step's norm. Exact where the math is: model_parallel (each stage runs the plain run's
# GEMMs on the same rows) and the first step meet FIRST_STEP_TOL; a strategy that runs
# another's kernels on the same buffers in the same order (SAME_ORDER) equals it bit for
# bit, and a resumed run its uninterrupted run.
FIRST_STEP_TOL = 1e-6
BF16_LOSS_TOL = 2e-4
BF16_GRAD_NORM_TOL = 2.0 ** -8
SAME_ORDER = {"zero1": "ddp", "fsdp": "zero3", "zero2+offload": "zero2"}
_plain2 = {}
_two_rank_runs = {}


def two_rank_keys(batch):
    """bf16 LoRA without dropout (whose masks depend on the rank's rows), micro-batch
    `batch`."""
    return ["--set", "tuning.lora.dropout=0", "--set", f"train.batch_size={batch}"]


def run_two_ranks(workdir, name, extra, **train_keys):
    keys = dict(max_steps=TWO_RANK_STEPS, save_steps=10_000, eval_strategy="no",
                learning_rate=2e-3, logging_steps=1, device="cuda", bf16="true")
    keys.update(train_keys)
    cfg = write_config(workdir, name, **keys)
    env = gpu_env(FT_DIST_BACKEND="nccl", OMP_NUM_THREADS="1")
    if EMU:
        env["FT_EMU_DEVICES"] = "2"
        env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
    out = subprocess.run(mpi_cmd(2, FT_TRAIN, "--config", str(cfg), *extra), capture_output=True,
                         text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stderr


def figures(run_dir):
    """{step: (loss, grad_norm)} from the run's TensorBoard events (float32: metrics.jsonl
    rounds the norm to 6 digits)."""
    acc = tb_scalars(run_dir)
    loss = {e.step: e.value for e in acc.Scalars("train/loss")}
    norm = {e.step: e.value for e in acc.Scalars("train/grad_norm")}
    assert sorted(loss) == sorted(norm), run_dir
    return {s: (loss[s], norm[s]) for s in loss}


def assert_two_ranks_equal_plain(what, got, want):
    """got (a run on 2 ranks) against want (the plain run): the first step to
    FIRST_STEP_TOL, the rest to bf16 rounding (the comment above TWO_RANK_STEPS)."""
    assert sorted(got) == sorted(want) == list(range(1, TWO_RANK_STEPS + 1))

    def worst(k, steps):
        return max(abs(got[s][k] - want[s][k]) / abs(want[s][k]) for s in steps)

    later = range(2, TWO_RANK_STEPS + 1)
    first, loss, norm = max(worst(0, [1]), worst(1, [1])), worst(0, later), worst(1, later)
    print(f"\n{what} on 2 ranks, bf16, against the plain run: first step {first:.3g} (tol "
          f"{FIRST_STEP_TOL}); steps 2-{TWO_RANK_STEPS}: loss {loss:.3g} (tol {BF16_LOSS_TOL}), "
          f"grad norm {norm:.3g} (tol {BF16_GRAD_NORM_TOL:.3g})")
    assert first <= FIRST_STEP_TOL, "the first step, before any bf16 rounding could differ"
    assert loss <= BF16_LOSS_TOL and norm <= BF16_GRAD_NORM_TOL
    return first, loss, norm


def run_strategy(workdir, strategy):
    """The 2-rank run of strategy ("zero2+offload": zero2 with the optimizer on the host),
    a checkpoint halfway, once a module: its directory and its command-line overrides."""
    if strategy not in _two_rank_runs:
        over = two_rank_keys(4) + ["--set", "dist.strategy=" + strategy.split("+")[0]]
        if strategy.endswith("+offload"):
            over += ["--set", "dist.offload_optimizer=cpu"]
        name = "p2_" + strategy.replace("+", "_")
        log = run_two_ranks(workdir, name, over, save_steps=TWO_RANK_STEPS // 2)
        assert "2 ranks (nccl)" in log
        _two_rank_runs[strategy] = workdir / name, over
    return _two_rank_runs[strategy]


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "fsdp", "model_parallel",
                                      "zero2+offload"])
def test_gpu_two_ranks_equal_plain(workdir, strategy):
    """Each strategy on 2 ranks in bf16 (the sharded ones keep bf16 compute copies of the
    trainables beside fp32 masters, refreshed after every update and load) against the
    plain one-GPU run (data parallel: a micro-batch of 4 a rank against 8 in one process;
    model_parallel: both ranks on the same batch of 4): the loss and gradient norm of the
    first step equal, the later ones to bf16 rounding (model_parallel: equal); one that
    runs another's kernels in the same order (SAME_ORDER) equals it bit for bit; resumed
    from its checkpoint halfway it continues bit for bit."""
    need_nccl()
    if not EMU and torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs (one rank a GPU under NCCL); torch sees "
                    f"{torch.cuda.device_count()}")
    if not shutil.which("mpirun"):
        pytest.skip("mpirun not found")
    batch = 4 if strategy == "model_parallel" else 8
    if batch not in _plain2:
        curve(workdir, f"p2_plain_{batch}", "cuda", max_steps=TWO_RANK_STEPS,
              extra=two_rank_keys(batch))
        _plain2[batch] = figures(workdir / f"p2_plain_{batch}")
    run, over = run_strategy(workdir, strategy)
    got = figures(run)
    _, loss, norm = assert_two_ranks_equal_plain(strategy, got, _plain2[batch])
    if strategy == "model_parallel":
        assert max(loss, norm) <= FIRST_STEP_TOL, "model_parallel computes the plain run's GEMMs"
    if strategy in SAME_ORDER:
        ref = figures(run_strategy(workdir, SAME_ORDER[strategy])[0])
        assert got == ref, f"{strategy} against {SAME_ORDER[strategy]}: " + str(
            {s: (got[s], ref[s]) for s in got if got[s] != ref[s]})
        print(f"{strategy}: {SAME_ORDER[strategy]}'s figures bit for bit")
    half = TWO_RANK_STEPS // 2
    run_two_ranks(workdir, run.name + "_resumed", over + [
        "--resume", str(run / f"checkpoint-{half}")])
    resumed = figures(workdir / (run.name + "_resumed"))
    assert sorted(resumed) == list(range(half + 1, TWO_RANK_STEPS + 1))
    assert all(resumed[s] == got[s] for s in resumed), {s: (resumed[s], got[s]) for s in resumed}


@pytest.fixture(scope="module")
def tied_model(workdir):
    """The run's model with tied word embeddings (the embedding its head)."""
    from transformers import AutoConfig, LlamaForCausalLM

    d = workdir / "model_tied"
    if not d.exists():
        cfg = AutoConfig.from_pretrained(workdir / "model")
        cfg.tie_word_embeddings = True
        torch.manual_seed(1)
        LlamaForCausalLM(cfg).save_pretrained(d)
        for f in (workdir / "model").iterdir():  # the tokenizer's files
            if "token" in f.name and not (d / f.name).exists():
                shutil.copy(f, d / f.name)
    return d


@pytest.mark.parametrize("strategy", ["zero2", "zero3", "model_parallel", "ddp+offload"])
def test_gpu_two_ranks_tied_lora_pair(workdir, tied_model, strategy):
    """LoRA on a tied model's embedding and head under ensure_weight_tying (the head's pair
    the embedding's, one storage stepped twice: its owners' updates exchanged after each
    step, lib/dist/dist_tied.c) on 2 GPUs in bf16: the loss and gradient norm equal the
    plain one-GPU run's, after the first step to bf16 rounding (model_parallel: equal)."""
    need_nccl()
    if not EMU and torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs (one rank a GPU under NCCL); torch sees "
                    f"{torch.cuda.device_count()}")
    if not shutil.which("mpirun"):
        pytest.skip("mpirun not found")
    tie = ["--set", f"model.name={tied_model}",
           "--set", "tuning.lora.target_modules=q_proj,v_proj,embed_tokens,lm_head",
           "--set", "tuning.lora.ensure_weight_tying=true"]
    batch = 4 if strategy == "model_parallel" else 8
    plain = workdir / f"tie_plain_{batch}"
    if not plain.exists():
        curve(workdir, plain.name, "cuda", max_steps=TWO_RANK_STEPS,
              extra=two_rank_keys(batch) + tie)
    over = two_rank_keys(4) + tie + ["--set", "dist.strategy=" + strategy.split("+")[0]]
    if strategy.endswith("+offload"):
        over += ["--set", "dist.offload_optimizer=cpu"]
    name = "tie2_" + strategy.replace("+", "_")
    assert "2 ranks (nccl)" in run_two_ranks(workdir, name, over)
    _, loss, norm = assert_two_ranks_equal_plain(f"tied pair, {strategy}",
                                                 figures(workdir / name), figures(plain))
    if strategy == "model_parallel":
        assert max(loss, norm) <= FIRST_STEP_TOL, "model_parallel computes the plain run's GEMMs"
