#!/usr/bin/env bash
# The GPU tier: runs each CUDA test binary given (their "N passed, N failed" lines are
# added up by run-unit.sh; test_dist_nccl runs NCCL in one process), then each op test
# (test_cuda_*) again under compute-sanitizer's memcheck (out-of-bounds and misaligned
# accesses, API errors), which must report none. Prints "gpu: N passed, N failed" and
# "memcheck: N passed, N failed". Then, with FT_CONFORM set to the conformance harness,
# the whole model on the GPU against transformers + PEFT on the same GPU
# (tests/conformance/test_gpu_model.py) and ft-train on the GPU (test_gpu_train.py: the
# 200-step curve against the CPU, kill and resume, NCCL, out-of-memory), run by
# ${PYTHON:-python3}, which must have torch with CUDA, transformers, peft and tensorboard:
# a python whose torch has no CUDA fails the tier before anything runs (its model tests
# would all skip). libnccl.so.2 is taken from that python's nvidia-nccl package when the
# system has none.
#
# FT_EMU=1 (make test-gpu-emu): the binaries are the emulated build's (make CUDA=emu), which
# run on the emulated device of tests/emu: no GPU, no nvidia-smi, no compute-sanitizer. The
# emulation checks what memcheck would (host pointers where device ones belong, copy kinds,
# use after free, out-of-bounds accesses, reads of memory never written) in every run, so
# there is no second pass. test_dist_nccl runs under mpirun on 1, 2 and 3 ranks when the
# build has the NCCL emulation (FT_EMU_NCCL=1), each rank an emulated device of its own.
# The Python GPU tests run there too (FT_EMU=1 tells them: transformers + PEFT on the CPU
# as the model's reference, FT_GPU_TRAIN_STEPS=20 steps for the training curves), on the
# emulated build's harness and tools (FT_CONFORM, FT_TRAIN, FT_EVAL, FT_QUANTIZE).
#
# Either way, a run of the Python GPU tests in which none passed (all skipped: a torch
# without CUDA, FT_EMU not reaching them, ...) fails the tier: a GPU tier that skips its
# model tests has not tested the model.
set -u -o pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)

# python_tests BUILD_DIR: pytest on the Python GPU files, with the tools of BUILD_DIR
# (bin or build-emu/bin) unless FT_* names them; fails when they failed or none passed.
python_tests() {
  local bindir=$1 log rc summary passed
  log=$(mktemp)
  FT_TRAIN=${FT_TRAIN:-$bindir/ft-train} FT_EVAL=${FT_EVAL:-$bindir/ft-eval} \
    FT_QUANTIZE=${FT_QUANTIZE:-$bindir/ft-quantize} OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} \
    "${PYTHON:-python3}" -m pytest -q -s -rs -p no:cacheprovider \
    "$here/conformance/test_gpu_model.py" "$here/conformance/test_gpu_train.py" \
    "$here/conformance/test_gpu_moe.py" "$here/conformance/test_gpu_qwen3_moe.py" \
    "$here/conformance/test_gpu_qwen2_moe.py" 2>&1 \
    | tee "$log"
  rc=${PIPESTATUS[0]}
  # pytest's last line: "1 failed, 40 passed, 2 skipped in 80.1s"
  summary=$(grep -E '^[= ]*[0-9]+ (passed|failed|skipped|error|deselected)' "$log" | tail -n 1)
  rm -f "$log"
  passed=$(printf '%s\n' "$summary" | sed -nE 's/(^|.*[^0-9])([0-9]+) passed.*/\2/p')
  if [ "${passed:-0}" -eq 0 ]; then
    echo "test-gpu: the Python GPU tests (test_gpu_model.py, test_gpu_train.py) ran none:" \
         "${summary:-no pytest summary} (a GPU tier whose model tests skip fails)" >&2
    return 1
  fi
  return "$rc"
}

emulated() {
  echo "test-gpu: the emulated CUDA device (tests/emu): ${FT_EMU_DEVICES:-1} device(s) of" \
       "${FT_EMU_ARCH:-sm_90}, ${FT_EMU_MEM:-4GiB} each; no GPU"
  local bins=() nccl=() status=0
  for bin in "$@"; do
    case "$(basename "$bin")" in test_dist_nccl) nccl+=("$bin") ;; *) bins+=("$bin") ;; esac
  done
  "$here/run-unit.sh" "${bins[@]}" | sed 's/^unit: /gpu: /' || status=1
  if [ ${#nccl[@]} -gt 0 ] && [ "${FT_EMU_NCCL:-0}" = 1 ]; then
    local mpirun=(mpirun --oversubscribe) p=0 f=0 np out rc line
    [ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
    export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
    for np in 1 2 3; do
      out=$(FT_EMU_DEVICES=3 timeout 300 "${mpirun[@]}" -np "$np" "${nccl[0]}" 2>&1); rc=$?
      printf '%s\n' "$out" | sed "s/^/  [np=$np] /"
      line=$(printf '%s\n' "$out" | grep -E '^dist_nccl: [0-9]+ passed, [0-9]+ failed' | wc -l)
      if [ "$rc" -ne 0 ] || [ "$line" -ne "$np" ]; then
        f=$((f + 1)); status=1; echo "dist_nccl on $np rank(s): failed (exit $rc)"
      else
        p=$((p + 1))
      fi
    done
    echo "dist_nccl: $p passed, $f failed (mpirun -np 1, 2, 3)"
  elif [ ${#nccl[@]} -gt 0 ]; then
    echo "dist_nccl: skipped: this emulated build has no NCCL (it needs" \
         "tests/emu/runtime/nccl_emu.cc and tests/emu/include/nccl.h, and MPI)"
  fi
  echo "memcheck: 0 passed, 0 failed (compute-sanitizer needs a GPU: on the emulated device" \
       "its checks ran in every test above instead)"
  if [ -n "${FT_CONFORM:-}" ]; then
    FT_EMU=1 FT_GPU_TRAIN_STEPS=${FT_GPU_TRAIN_STEPS:-20} python_tests "$repo/build-emu/bin" || status=1
  fi
  return $status
}
if [ "${FT_EMU:-0}" = 1 ]; then
  emulated "$@"
  exit $?
fi

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "test-gpu: no NVIDIA GPU visible (nvidia-smi -L failed)" >&2
  exit 1
fi
nvidia-smi -L
if [ -n "${FT_CONFORM:-}" ] &&
   ! "${PYTHON:-python3}" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "test-gpu: ${PYTHON:-python3}'s torch has no CUDA (torch.cuda.is_available() is False," \
       "or no torch): the model tests would all skip. Set PYTHON to a python with torch for" \
       "CUDA, transformers, peft and tensorboard" >&2
  exit 1
fi
if [ -n "${1:-}" ] && ldd "$1" 2>/dev/null | grep -q "libnccl.so.2 => not found"; then
  nccl_dir=$("${PYTHON:-python3}" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [ -n "$nccl_dir" ] && export LD_LIBRARY_PATH="$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "test-gpu: libnccl.so.2 from $nccl_dir"
fi
status=0
"$here/run-unit.sh" "$@" | sed 's/^unit: /gpu: /' || status=1

sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
passed=0; failed=0
if [ -x "$sanitizer" ]; then
  for bin in "$@"; do
    case "$(basename "$bin")" in test_cuda_*) ;; *) continue ;; esac
    if FT_UNDER_MEMCHECK=1 "$sanitizer" --tool memcheck --error-exitcode 99 \
        "$bin" >"$bin.memcheck.log" 2>&1; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1)); status=1
      echo "memcheck: $bin failed; the end of $bin.memcheck.log:"; tail -n 30 "$bin.memcheck.log"
    fi
  done
else
  echo "memcheck: compute-sanitizer not found" >&2; failed=1; status=1
fi
echo "memcheck: $passed passed, $failed failed"

if [ -n "${FT_CONFORM:-}" ]; then
  python_tests "$repo/bin" || status=1
fi
exit $status
