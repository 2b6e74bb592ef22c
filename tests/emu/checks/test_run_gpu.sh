#!/usr/bin/env bash
# tests/run-gpu.sh itself, without a GPU: a GPU tier whose Python model tests skip must
# fail. A fake python (PYTHON) answers the torch-with-CUDA check and plays pytest with the
# summary line given; fake nvidia-smi and compute-sanitizer on PATH stand for the GPU
# machine; no test binaries. Checks, on the real-GPU path:
#   - a python whose torch has no CUDA: run-gpu.sh fails with that message, before pytest;
#   - pytest reporting every test skipped: run-gpu.sh fails, naming the summary;
#   - pytest reporting passes: run-gpu.sh passes (so the two above fail for their cause),
#     and pytest was handed the tools it runs, ft-quantize's included (test_gpu_model.py's
#     prequantized QLoRA case runs it);
# and on the emulated path (FT_EMU=1) the same two pytest outcomes. Prints one line per
# check and "run_gpu: N passed, N failed".
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0; failed=0
ok() { passed=$((passed + 1)); echo "  $1: ok"; }
bad() { failed=$((failed + 1)); echo "  $1: FAIL${2:+: $2}"; }

mkdir -p "$work/bin"
cat >"$work/bin/python" <<'EOF'
#!/bin/sh
# -c ...: the torch check (FAKE_CUDA=0: torch without CUDA); -m pytest: FAKE_SUMMARY
case "$*" in
  *"-m pytest"*) echo "pytest ran: FT_TRAIN=$FT_TRAIN FT_EVAL=$FT_EVAL FT_QUANTIZE=$FT_QUANTIZE" >>"$FAKE_LOG"
                 echo "$FAKE_SUMMARY"; exit 0 ;;
  *) [ "${FAKE_CUDA:-1}" = 1 ] ;;
esac
EOF
printf '#!/bin/sh\necho "GPU 0: Fake GPU (UUID: GPU-0)"\n' >"$work/bin/nvidia-smi"
printf '#!/bin/sh\nexit 0\n' >"$work/bin/compute-sanitizer"
chmod +x "$work/bin/"*

# gpu_tier NAME [VAR=value ...]: run-gpu.sh with no binaries in a clean environment; its
# exit status, its output in $work/NAME.out
gpu_tier() {
  local name=$1
  shift
  env -i PATH="$work/bin:/usr/bin:/bin" HOME="$work" PYTHON="$work/bin/python" \
    FT_CONFORM=/nonexistent/ft-conform FAKE_LOG="$work/$name.pytest" "$@" \
    "$repo/tests/run-gpu.sh" >"$work/$name.out" 2>&1
}

gpu_tier nocuda FAKE_CUDA=0 FAKE_SUMMARY="3 passed in 0.01s"
if [ $? -ne 0 ] && grep -q "torch has no CUDA" "$work/nocuda.out" && [ ! -e "$work/nocuda.pytest" ]; then
  ok "GPU path: a python whose torch has no CUDA fails the tier before pytest"
else
  bad "GPU path: a python whose torch has no CUDA" "$(tail -n 3 "$work/nocuda.out" | tr '\n' ' ')"
fi

for mode in gpu emu; do
  case $mode in gpu) set -- ;; emu) set -- FT_EMU=1 ;; esac
  gpu_tier "$mode-skipped" "$@" FAKE_SUMMARY="38 skipped in 0.52s"
  if [ $? -ne 0 ] && grep -q "ran none: 38 skipped" "$work/$mode-skipped.out"; then
    ok "$mode path: Python GPU tests that all skipped fail the tier"
  else
    bad "$mode path: Python GPU tests that all skipped" "$(tail -n 3 "$work/$mode-skipped.out" | tr '\n' ' ')"
  fi
  gpu_tier "$mode-passed" "$@" FAKE_SUMMARY="36 passed, 2 skipped in 80.1s"
  rc=$?
  case $mode in gpu) bindir=$repo/bin ;; emu) bindir=$repo/build-emu/bin ;; esac
  want="FT_TRAIN=$bindir/ft-train FT_EVAL=$bindir/ft-eval FT_QUANTIZE=$bindir/ft-quantize"
  if [ $rc -eq 0 ] && grep -qxF "pytest ran: $want" "$work/$mode-passed.pytest"; then
    ok "$mode path: Python GPU tests that passed pass the tier"
  else
    bad "$mode path: Python GPU tests that passed" "$(tail -n 3 "$work/$mode-passed.out" | tr '\n' ' ')"
  fi
done

echo "run_gpu: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
