#!/usr/bin/env bash
# shellcheck disable=SC2317 # the phase_* functions are called by name ("phase_$child")
# A short GPU lease in one command: what the first minutes on a GPU machine must learn,
# in the order a cut-off run would want it (GPU-BRINGUP: build and pack here with
# `make gpu-bundle`, send few complete commands, keep every log).
#
#   scripts/gpu-session.sh [--budget SECONDS] [PHASE[:SECONDS] ...]
#
# Run from the repo root of the GPU machine's copy. It unpacks .gpu/ftkit.tar.xz (the
# binaries and the shared libraries they need) and installs a bitsandbytes wheel carried in
# .gpu/ (make gpu-bundle copies one from the wheel cache) into a private directory, then
# runs the phases given (default: all, in this order), each under its own time limit and
# all within the budget (default 480 s; a phase that would start with under 20 s left is
# skipped and said so):
#
#   env       nvidia-smi, gpu-info, ldd of ft-train, python's torch and CUDA       (45 s)
#   ops       the GPU tier's binaries: every op against the CPU in fp32 and bf16,
#             attention, MoE, QLoRA, NCCL in one process                           (30 s)
#   memcheck  compute-sanitizer memcheck on each op test (test_cuda_*)             (60 s)
#   model     test_gpu_model.py: the model on the GPU against transformers + PEFT  (150 s)
#   train     test_gpu_train.py: the 200-step curve against the CPU, resume bit for
#             bit, every strategy under NCCL, QLoRA, out-of-memory advice           (90 s)
#   moe       test_gpu_moe.py, test_gpu_qwen3_moe.py, test_gpu_qwen2_moe.py       (120 s)
#   profile   FT_CUDA_PROFILE=1 bench-train, LoRA and full fine-tuning of a
#             Llama-3.2-1B shape (batch 4 x 2048), one step each: the GPU time of
#             every op, largest first, in profile.txt; then LoRA again with
#             FT_CUDA_SPLITK=0 (every GEMM whole), for what split-K gains           (90 s)
#   gemm      bench-gemm: linear.cu's GEMMs of those steps, cublasGemmEx with a bf16
#             and an fp32 output against each algorithm cublasLt's heuristic offers    (40 s)
#   bench     tests/bench/bench_gpu.py: lora-1b, full-1b, lora-8b, qlora-8b against
#             transformers + PEFT (+ bitsandbytes) in the same call                (240 s)
#
# (The limits are what the phases took on an H200 on 2026-11-27, with some room: ops 9 s,
# memcheck 9 s, train 53 s; model ran 230 of its tests in 90 s, moe 100 in 60 s.)
#
# e.g. `scripts/gpu-session.sh --budget 300 env ops model:120` or `... bench:400`.
#
# Output, under OUT (the device tool's folder; ./gpu-out elsewhere), at most 8 files as
# the device tool brings back: summary.txt (one line per phase: passed, FAILED, TIMED OUT
# after N s or skipped, with its seconds and the log's last summary line), logs.tar.gz (a
# log per phase), bench.md / bench.json (the bench table, when it ran) and profile.txt
# (when the profile phase ran). stdout gets
# each phase's log as it runs and the summary at the end. Exits 0 when every phase run
# passed.
#
# FT_EMU=1 runs the same phases on the emulated device (make CUDA=emu's build-emu/, no
# bundle, no GPU, PYTHON defaulting to the suite's .venv; memcheck skipped, bench as
# bench_gpu.py's CPU dry run). tests/emu/checks/test_gpu_session.sh checks the script
# itself with fakes.
set -u -o pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo" || exit 1

# internal: `gpu-session.sh --phase NAME SECONDS` runs one phase in the child that the
# parent runs under timeout, with the parent's environment (the bundle unpacked, the logs'
# folder in FT_SESSION_LOGS)
child=
if [ "${1:-}" = --phase ]; then
  child=$2 child_secs=$3
  shift 3
fi

budget=480
if [ "${1:-}" = --budget ]; then
  budget=${2:?--budget needs seconds}
  shift 2
fi
case "$budget" in '' | *[!0-9]*) echo "gpu-session: --budget: not a number of seconds: $budget" >&2; exit 2 ;; esac

declare -A limit=([env]=45 [ops]=30 [memcheck]=60 [model]=150 [train]=90 [moe]=120 [profile]=90 [gemm]=40 [bench]=240)
order=(env ops memcheck model train moe profile gemm bench)
phases=()
for arg in "${@:-${order[@]}}"; do
  name=${arg%%:*}
  [ -n "${limit[$name]+x}" ] || { echo "gpu-session: unknown phase '$name' (${order[*]})" >&2; exit 2; }
  if [ "$arg" != "$name" ]; then
    secs=${arg#*:}
    case "$secs" in '' | *[!0-9]*) echo "gpu-session: $arg: not a number of seconds" >&2; exit 2 ;; esac
    limit[$name]=$secs
  fi
  phases+=("$name")
done

out=${OUT:-$repo/gpu-out}
emu=${FT_EMU:-0}
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

if [ "$emu" = 1 ]; then
  bindir=$repo/build-emu/bin testdir=$repo/build-emu/tests
  [ -z "${PYTHON:-}" ] && [ -x "$repo/.venv/bin/python" ] && py=$repo/.venv/bin/python
  export FT_EMU=1 FT_EMU_ASYNC=${FT_EMU_ASYNC:-1} FT_GPU_TEST_SMALL=1 FT_GPU_TRAIN_STEPS=${FT_GPU_TRAIN_STEPS:-20}
else
  bindir=$repo/bin testdir=$repo/build/tests
fi
if [ "$emu" != 1 ] && [ -z "$child" ]; then
  if [ -f .gpu/ftkit.tar.xz ]; then
    tar xJf .gpu/ftkit.tar.xz || { echo "gpu-session: .gpu/ftkit.tar.xz did not unpack" >&2; exit 1; }
    export LD_LIBRARY_PATH=$repo/.gpu-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  # libnccl.so.2 from python's nvidia-nccl package where the system has none
  if ldd "$bindir/ft-train" 2>/dev/null | grep -q 'libnccl.so.2 => not found'; then
    nccl=$("$py" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
    [ -n "$nccl" ] && export LD_LIBRARY_PATH=$nccl:$LD_LIBRARY_PATH
  fi
  wheels=(.gpu/bitsandbytes-*.whl)
  wheel=${wheels[0]}
  if [ -f "$wheel" ] && ! "$py" -c 'import bitsandbytes' 2>/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/ftkit-site "$wheel" &&
      export PYTHONPATH=/tmp/ftkit-site${PYTHONPATH:+:$PYTHONPATH}
  fi
fi
export FT_CONFORM=$testdir/ft-conform FT_TRAIN=$bindir/ft-train FT_EVAL=$bindir/ft-eval \
       FT_QUANTIZE=$bindir/ft-quantize
gpu_bins=()
for b in "$testdir"/gpu/test_*; do
  case "$b" in *.log) ;; *) [ -x "$b" ] && gpu_bins+=("$b") ;; esac
done

# pytest on conformance files, with its summary line at the end of the log
run_pytest() {
  "$py" -m pytest -q -s -rs -p no:cacheprovider "${@/#/tests/conformance/}"
}

phase_env() {
  if [ "$emu" = 1 ]; then echo "emulated device (FT_EMU=1): no nvidia-smi"; else nvidia-smi; fi
  "$bindir/gpu-info" && ldd "$bindir/ft-train" &&
    "$py" -c 'import torch, transformers, peft; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "transformers", transformers.__version__, "peft", peft.__version__)' &&
    { timeout 20 "$py" -c 'import bitsandbytes as b; print("bitsandbytes", b.__version__)' || echo "bitsandbytes: none, or its import took over 20 s (the qlora-8b baseline needs it)"; }
}

phase_ops() {
  [ ${#gpu_bins[@]} -gt 0 ] || { echo "no GPU test binaries in $testdir/gpu"; return 1; }
  tests/run-unit.sh "${gpu_bins[@]}"
}

phase_memcheck() {
  if [ "$emu" = 1 ]; then
    echo "memcheck: skipped on the emulated device (its checks run in every test)"; return 0
  fi
  local san p=0 f=0 b
  san=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
  [ -x "$san" ] || { echo "memcheck: compute-sanitizer not found"; return 1; }
  for b in "${gpu_bins[@]}"; do
    case "$(basename "$b")" in test_cuda_*) ;; *) continue ;; esac
    if FT_UNDER_MEMCHECK=1 "$san" --tool memcheck --error-exitcode 99 "$b" >"$FT_SESSION_LOGS/$(basename "$b").memcheck" 2>&1; then
      p=$((p + 1))
    else
      f=$((f + 1)); echo "memcheck: $b failed:"; tail -n 30 "$FT_SESSION_LOGS/$(basename "$b").memcheck"
    fi
  done
  echo "memcheck: $p passed, $f failed"
  [ "$f" -eq 0 ]
}

phase_model() { run_pytest test_gpu_model.py; }
phase_train() { run_pytest test_gpu_train.py; }
phase_moe() { run_pytest test_gpu_moe.py test_gpu_qwen3_moe.py test_gpu_qwen2_moe.py; }

# bench-train under FT_CUDA_PROFILE on a random-weight Llama-3.2-1B shape (tiny, batch 1 x
# 64, on the emulated device), LoRA then full fine-tuning; the tables into profile.txt
phase_profile() {
  local tmp dir shape=1b batch=4 seq=2048 where=cuda mode rc=0
  tmp=$(mktemp -d) && dir=$tmp/model || return 1
  [ "$emu" = 1 ] && shape=tiny batch=1 seq=64 where=cpu
  "$py" -c "import sys; sys.path.insert(0, 'tests/bench'); import bench_gpu; bench_gpu.write_model('$shape', '$dir', '$where')" ||
    { echo "profile: writing the $shape model failed"; rm -rf "$tmp"; return 1; }
  : >"$out/profile.txt"
  for run in lora full lora:FT_CUDA_SPLITK=0; do
    mode=${run%%:*} extra=
    [ "$run" != "$mode" ] && extra=${run#*:}
    echo "=== profile: $mode, $shape shape, batch $batch x $seq${extra:+, $extra} ===" |
      tee -a "$out/profile.txt"
    env FT_CUDA_PROFILE=1 ${extra:+"$extra"} "$testdir/bench-train" "$dir" --mode "$mode" --batch "$batch" \
      --seq "$seq" --steps 1 --ckpt --device cuda 2>&1 | tee -a "$out/profile.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  done
  rm -rf "$tmp"
  grep -q "^FT_CUDA_PROFILE: ops" "$out/profile.txt" || { echo "profile: no FT_CUDA_PROFILE table"; rc=1; }
  return "$rc"
}

phase_gemm() {
  if [ "$emu" = 1 ]; then
    echo "gemm: skipped on the emulated device (it has no cublasLt)"; return 0
  fi
  "$testdir/bench-gemm" --iters 10
}

# FT_BENCH_ARGS adds bench_gpu.py options (e.g. "--configs lora-1b,qlora-8b --steps 3")
phase_bench() {
  local args=(--bench-train "$testdir/bench-train" --out "$FT_SESSION_LOGS/bench" --timeout "$child_secs")
  [ "$emu" = 1 ] && args+=(--device cpu --tiny --steps 1)
  # shellcheck disable=SC2086 # FT_BENCH_ARGS is a list of options
  "$py" tests/bench/bench_gpu.py "${args[@]}" ${FT_BENCH_ARGS:-}
  local rc=$? f
  for f in "$FT_SESSION_LOGS"/bench/*.md; do [ -f "$f" ] && cp "$f" "$out/bench.md"; done
  for f in "$FT_SESSION_LOGS"/bench/*.json; do [ -f "$f" ] && cp "$f" "$out/bench.json"; done
  return "$rc"
}

if [ -n "$child" ]; then
  "phase_$child"
  exit $?
fi

mkdir -p "$out"
FT_SESSION_LOGS=$(mktemp -d)
export FT_SESSION_LOGS
trap 'rm -rf "$FT_SESSION_LOGS"' EXIT
summary=$out/summary.txt
: >"$summary"

start=$SECONDS
status=0
for name in "${phases[@]}"; do
  left=$((budget - (SECONDS - start)))
  secs=${limit[$name]}
  if [ "$left" -lt 20 ]; then
    printf '%-9s skipped (the budget of %d s is spent)\n' "$name" "$budget" >>"$summary"
    continue
  fi
  [ "$secs" -gt "$left" ] && secs=$left
  echo "=== gpu-session: $name (at most $secs s) ==="
  t0=$SECONDS
  # the phase in a child under timeout, its output to the console and to its log
  timeout --kill-after=10 "$secs" "$0" --phase "$name" "$secs" 2>&1 | tee "$FT_SESSION_LOGS/$name.log"
  rc=${PIPESTATUS[0]}
  took=$((SECONDS - t0))
  last=$(grep -E '[0-9]+ (passed|failed)' "$FT_SESSION_LOGS/$name.log" | tail -n 1 | sed 's/^[= ]*//; s/ *=*$//')
  case $rc in
    0) verdict=passed ;;
    124 | 137) verdict="TIMED OUT after $secs s"; status=1 ;;
    *) verdict="FAILED (exit $rc)"; status=1 ;;
  esac
  printf '%-9s %-22s %4d s  %s\n' "$name" "$verdict" "$took" "$last" >>"$summary"
done
tar -C "$FT_SESSION_LOGS" -czf "$out/logs.tar.gz" .
echo "=== gpu-session: summary (logs in $out/logs.tar.gz) ==="
cat "$summary"
exit $status
