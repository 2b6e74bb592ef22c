#!/usr/bin/env bash
# The GPU tier: runs each CUDA test binary given (their "N passed, N failed" lines are
# added up by run-unit.sh), then each again under compute-sanitizer's memcheck
# (out-of-bounds and misaligned accesses, API errors), which must report none.
# Prints "gpu: N passed, N failed" and "memcheck: N passed, N failed". Then, with
# FT_CONFORM set to the conformance harness, the whole model on the GPU against
# transformers + PEFT on the same GPU (tests/conformance/test_gpu_model.py, run by
# ${PYTHON:-python3}, which must have torch with CUDA, transformers and peft).
set -u -o pipefail
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "test-gpu: no NVIDIA GPU visible (nvidia-smi -L failed)" >&2
  exit 1
fi
nvidia-smi -L
status=0
"$here/run-unit.sh" "$@" | sed 's/^unit: /gpu: /' || status=1

sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
passed=0; failed=0
if [ -x "$sanitizer" ]; then
  for bin in "$@"; do
    if "$sanitizer" --tool memcheck --error-exitcode 99 \
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
  "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider "$here/conformance/test_gpu_model.py" \
    || status=1
fi
exit $status
