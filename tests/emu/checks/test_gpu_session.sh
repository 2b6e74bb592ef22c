#!/usr/bin/env bash
# scripts/gpu-session.sh itself, without a GPU: the one command a short GPU lease runs. A
# copy of it in a scratch repo, with fake GPU test binaries, gpu-info, nvidia-smi,
# compute-sanitizer and a fake python (pytest, pip, bench_gpu.py), checks that:
#   - every phase runs in order and passes, summary.txt says so line by line, the bundle
#     is unpacked, the carried bitsandbytes wheel installed where python finds it, and
#     OUT holds summary.txt, logs.tar.gz (a log per phase), the bench table and the
#     profile phase's three FT_CUDA_PROFILE tables (LoRA, full, LoRA with split-K off);
#   - a failing op test fails its phase and the session, and the phases after it run;
#   - a phase past its limit is stopped (its processes too), reported as timed out, and
#     the session goes on to the next phase;
#   - a spent budget skips the phases left, saying so;
#   - an unknown phase or a bad number of seconds is refused (exit 2).
# Prints one line per check and "gpu_session: N passed, N failed".
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0; failed=0
ok() { passed=$((passed + 1)); echo "  $1: ok"; }
bad() { failed=$((failed + 1)); echo "  $1: FAIL${2:+: $2}"; }

# the scratch repo: the script, run-unit.sh, fake binaries and a bundle holding a marker
fake=$work/repo
mkdir -p "$fake/scripts" "$fake/tests/bench" "$fake/build/tests/gpu" "$fake/bin" "$fake/.gpu" \
         "$work/path" "$work/bundle"
cp "$repo/scripts/gpu-session.sh" "$fake/scripts/"
cp "$repo/tests/run-unit.sh" "$fake/tests/"
cp /bin/true "$fake/bin/ft-train"
printf '#!/bin/sh\n[ "$FT_CUDA_PROFILE" = 1 ] && echo "FT_CUDA_PROFILE: ops 1.00 ms of a 1.00 ms span (split-K ${FT_CUDA_SPLITK:-on})" >&2\necho "{}"\n' \
  >"$fake/build/tests/bench-train"
printf '#!/bin/sh\necho "GPU 0: Fake GPU"\n' >"$fake/bin/gpu-info"
for t in test_cuda_ops test_cuda_attention; do
  printf '#!/bin/sh\n[ "$FAIL_OP" = %s ] && { echo "%s: 1 passed, 1 failed"; exit 1; }\necho "%s: 2 passed, 0 failed"\n' \
    "$t" "$t" "$t" >"$fake/build/tests/gpu/$t"
done
echo unpacked >"$work/bundle/marker"
tar -C "$work/bundle" -cJf "$fake/.gpu/ftkit.tar.xz" marker
: >"$fake/.gpu/bitsandbytes-0.0-py3-none-any.whl"
cat >"$work/path/python3" <<'EOF'
#!/bin/bash
# the GPU machine's python: -c checks, pip install, pytest (FAKE_SLEEP seconds, then
# "N passed"), bench_gpu.py (writes its table where --out says)
case "$*" in
  *"import bitsandbytes"*) [ -n "${PYTHONPATH:-}" ] && echo "bitsandbytes 0.0" ;;
  "-c "*) echo "torch fake" ;;
  *"-m pip install"*) echo "pip: $*" >>"$FAKE_LOG" ;;
  *"-m pytest"*) echo "pytest: $*" >>"$FAKE_LOG"
                 if [ -n "${FAKE_SLEEP:-}" ]; then sleep "$FAKE_SLEEP" & echo $! >"$FAKE_LOG.sleeper"; wait; fi
                 echo "3 passed in 0.01s" ;;
  *bench_gpu.py*) args="$*"; out=${args#*--out }; out=${out%% *}; mkdir -p "$out"
                  echo "| config | ratio |" >"$out/fake.md"; echo '{}' >"$out/fake.json"
                  echo "bench: PYTHONPATH=${PYTHONPATH:-}" >>"$FAKE_LOG" ;;
esac
EOF
printf '#!/bin/sh\necho "GPU 0: Fake GPU (UUID: GPU-0)"\n' >"$work/path/nvidia-smi"
printf '#!/bin/sh\nwhile [ "${1#-}" != "$1" ] || [ "$1" = memcheck ] || [ "$1" = 99 ]; do shift; done\nexec "$@"\n' \
  >"$work/path/compute-sanitizer"
printf '#!/bin/sh\necho "fwd  N=8 in=8 out=8 cublasGemmEx ->bf16 1.0 us 0.0 TFLOP/s"\n' >"$fake/build/tests/bench-gemm"
chmod +x "$fake/build/tests/gpu/"* "$fake/build/tests/bench-train" "$fake/build/tests/bench-gemm" "$fake/bin/"* "$work/path/"*

# session NAME [VAR=value ...] -- ARGS: the script in a clean environment, OUT=$work/NAME;
# its exit status, its output in $work/NAME.out
session() {
  local name=$1 envs=()
  shift
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  rm -rf "${fake:?}/marker" "/tmp/ftkit-site"
  env -i PATH="$work/path:/usr/bin:/bin" HOME="$work" OUT="$work/$name" FAKE_LOG="$work/$name.log" \
    "${envs[@]}" "$fake/scripts/gpu-session.sh" "$@" >"$work/$name.out" 2>&1
}

session all --
rc=$?
lines=$(grep -c ' passed ' "$work/all/summary.txt")
order=$(awk '{print $1}' "$work/all/summary.txt" | tr '\n' ' ')
logs=$(tar -tzf "$work/all/logs.tar.gz" 2>/dev/null | grep -c '\.log$')
if [ "$rc" -eq 0 ] && [ "$lines" -eq 9 ] && [ "$order" = "env ops memcheck model train moe profile gemm bench " ] &&
   [ "$logs" -eq 9 ] && [ -f "$work/all/bench.md" ] && [ -f "$work/all/bench.json" ] &&
   [ "$(grep -c '^FT_CUDA_PROFILE: ops' "$work/all/profile.txt" 2>/dev/null)" = 3 ] &&
   [ "$(grep -c '^FT_CUDA_PROFILE: ops.*(split-K 0)' "$work/all/profile.txt")" = 1 ] &&
   [ "$(cat "$fake/marker" 2>/dev/null)" = unpacked ] &&
   grep -q "ops .*passed .*4 passed, 0 failed" "$work/all/summary.txt"; then
  ok "every phase in order, summary, logs, bench table, profiles, bundle unpacked"
else
  bad "every phase" "rc $rc, $lines passed lines, order '$order', $logs logs: $(tail -n 9 "$work/all.out" | tr '\n' ' ')"
fi
if grep -q "pip: .*install .*--target /tmp/ftkit-site .*bitsandbytes-0.0" "$work/all.log" &&
   grep -q "bench: PYTHONPATH=/tmp/ftkit-site" "$work/all.log"; then
  ok "the carried bitsandbytes wheel is installed and on the bench's PYTHONPATH"
else
  bad "bitsandbytes wheel" "$(tr '\n' ' ' <"$work/all.log")"
fi

session failop FAIL_OP=test_cuda_attention -- ops model
rc=$?
if [ "$rc" -ne 0 ] && grep -q "^ops .*FAILED (exit 1)" "$work/failop/summary.txt" &&
   grep -q "^model .*passed" "$work/failop/summary.txt"; then
  ok "a failing op test fails the session; the next phase still runs"
else
  bad "failing op test" "rc $rc: $(tr '\n' ' ' <"$work/failop/summary.txt")"
fi

t0=$SECONDS
session slow FAKE_SLEEP=60 -- model:2 env
rc=$? took=$((SECONDS - t0))
sleeper=$(cat "$work/slow.log.sleeper" 2>/dev/null)
# alive: still running after 5 s (a killed process may take a moment to be reaped)
alive() {
  local i
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    kill -0 "$1" 2>/dev/null || return 1
    [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ] && return 1
    sleep 0.5
  done
}
if [ "$rc" -ne 0 ] && [ "$took" -lt 30 ] && grep -q "^model .*TIMED OUT after 2 s" "$work/slow/summary.txt" &&
   grep -q "^env .*passed" "$work/slow/summary.txt" && [ -n "$sleeper" ] && ! alive "$sleeper"; then
  ok "a phase past its limit is stopped with its processes, the next runs"
else
  bad "phase past its limit" "rc $rc, ${took}s, sleeper ${sleeper:-none}: $(tr '\n' ' ' <"$work/slow/summary.txt")"
fi

session spent -- --budget 10 env
rc=$?
if [ "$rc" -eq 0 ] && grep -q "^env .*skipped (the budget of 10 s is spent)" "$work/spent/summary.txt"; then
  ok "a spent budget skips the phases left"
else
  bad "spent budget" "rc $rc: $(tr '\n' ' ' <"$work/spent/summary.txt" 2>/dev/null)"
fi

session unknown -- env warp
rc1=$?
session badsecs -- model:soon
rc2=$?
if [ "$rc1" -eq 2 ] && grep -q "unknown phase 'warp'" "$work/unknown.out" &&
   [ "$rc2" -eq 2 ] && grep -q "model:soon: not a number of seconds" "$work/badsecs.out"; then
  ok "an unknown phase or bad seconds is refused"
else
  bad "bad arguments" "rc $rc1 $rc2: $(cat "$work/unknown.out" "$work/badsecs.out" | tr '\n' ' ')"
fi

echo "gpu_session: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
