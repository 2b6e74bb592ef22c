#!/usr/bin/env bash
# The NCCL emulation of the emulated CUDA device (tests/emu/runtime/nccl_emu.cc) under real
# Open MPI ranks, on the emulated runtime (make CUDA=emu):
#   tests/emu/run-nccl-emu.sh [BIN]     BIN: test_nccl_emu (default $FT_NCCL_EMU_BIN, else
#                                       build-emu/tests/nccl-emu/test_nccl_emu)
# (make test-nccl-emu, and make test-gpu-emu, which says FT_EMU_NCCL=0 for an emulated
# build without the NCCL emulation: then this prints 0 passed, 0 failed.)
#
# test_nccl_emu runs alone (a one-rank communicator without MPI) and under mpirun -np 1, 2
# and 3; its "N passed, N failed" lines are added up. Then the misuses, one check each:
# `test_nccl_emu --fail=CASE` must exit non-zero, within the time limit, with the message
# of the emulated device ("ft-emu: <call>: ...") on stderr. Every run is under `timeout`,
# so a bug cannot hang CI. Prints "nccl-emu: N passed, N failed"; exits non-zero on any
# failure.
set -u
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:-${FT_NCCL_EMU_BIN:-$repo/build-emu/tests/nccl-emu/test_nccl_emu}}
if [ "${FT_EMU_NCCL:-1}" = 0 ]; then
  echo "nccl-emu: 0 passed, 0 failed (skipped: this emulated build has no NCCL emulation)"
  exit 0
fi
unset CUDA_VISIBLE_DEVICES # the emulated devices, all of them
limit=${FT_NCCL_EMU_TEST_LIMIT:-120} # seconds any one run may take
passed=0
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

[ -x "$bin" ] || { echo "$bin: not built"; echo "nccl-emu: 0 passed, 1 failed"; exit 1; }
if ! command -v mpirun >/dev/null 2>&1; then
  echo "mpirun not found (scripts/install-deps.sh installs openmpi-bin)"
  echo "nccl-emu: 0 passed, 1 failed"
  exit 1
fi

mpirun=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
# as tests/run-dist.sh: more ranks than cores, and no cross-memory attach in containers
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}

show_tail() { sed -n '1,40p' "$1" | sed 's/^/    /'; }

# run NP [VAR=VALUE...] -- ARGS: BIN ARGS alone (NP 0) or under mpirun -np NP.
run() {
  local np=$1
  shift
  local vars=()
  while [ "$1" != "--" ]; do vars+=("$1"); shift; done
  shift
  # (in a subshell whose stderr is dropped: bash's "Aborted" notes are not the test's)
  if [ "$np" -eq 0 ]; then
    ( env -u OMPI_COMM_WORLD_SIZE -u PMI_SIZE -u PMIX_RANK "${vars[@]}" \
      timeout "$limit" "$bin" "$@" >"$tmp/out" 2>"$tmp/err"; exit $? ) 2>/dev/null
  else
    ( env "${vars[@]}" timeout "$limit" "${mpirun[@]}" -np "$np" "$bin" "$@" >"$tmp/out" \
      2>"$tmp/err"; exit $? ) 2>/dev/null
  fi
}

suite() {
  local label=$1 np=$2 rc line p f
  run "$np" --
  rc=$?
  echo "== $label"
  cat "$tmp/out"
  line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$tmp/out" | tail -n 1)
  if [ -z "$line" ]; then
    echo "FAIL $label: no summary line (exit $rc)"
    show_tail "$tmp/err"
    failed=$((failed + 1))
    return
  fi
  p=$(printf '%s' "$line" | sed -E 's/.*[^0-9]([0-9]+) passed.*/\1/')
  f=$(printf '%s' "$line" | sed -E 's/.*passed, ([0-9]+) failed.*/\1/')
  passed=$((passed + p))
  failed=$((failed + f))
  if [ "$f" -ne 0 ]; then
    show_tail "$tmp/err"
  elif [ "$rc" -ne 0 ]; then
    echo "FAIL $label: every test passed, but the run exited $rc"
    show_tail "$tmp/err"
    failed=$((failed + 1))
  fi
}

# failure LABEL NP "VAR=VALUE..." CASE NEEDLE...: --fail=CASE must exit non-zero with
# every NEEDLE on stderr.
failure() {
  local label=$1 np=$2 envs=$3 case=$4 rc why="" s
  shift 4
  # shellcheck disable=SC2086 # envs is a word list
  run "$np" $envs -- --fail="$case"
  rc=$?
  [ "$rc" -ne 0 ] || why="$why; exited 0"
  [ "$rc" -ne 124 ] || why="$why; did not stop within ${limit} s"
  grep -q "returned from the call" "$tmp/err" && why="$why; the call returned"
  for s in "$@"; do
    grep -qF -- "$s" "$tmp/err" || why="$why; stderr lacks \"$s\""
  done
  if [ -z "$why" ]; then
    echo "ok $label (exit $rc)"
    passed=$((passed + 1))
  else
    echo "FAIL $label: ${why#; } (exit $rc)"
    show_tail "$tmp/err"
    failed=$((failed + 1))
  fi
}

suite "alone (one rank, no MPI)" 0
for np in 1 2 3; do
  suite "mpirun -np $np" "$np"
done

echo "== misuse that must stop the process"
failure "a host pointer as sendbuff (alone)" 0 "" host-pointer \
  "ft-emu: ncclAllReduce: sendbuff" "not device memory"
failure "a host pointer as sendbuff (2 ranks)" 2 "" host-pointer \
  "ft-emu: ncclAllReduce: sendbuff" "not device memory"
failure "a host pointer as recvbuff" 2 "" host-recvbuff "ft-emu: ncclAllGather: recvbuff"
failure "recvbuff one element short" 3 "" short-buffer \
  "ft-emu: ncclAllGather: recvbuff" "past the end"
failure "a sendbuff never written" 2 "" unwritten \
  "ft-emu: ncclAllReduce: sendbuff" "never written"
failure "a freed buffer" 1 "" freed "ft-emu: ncclBroadcast: sendbuff" "freed"
failure "sendbuff and recvbuff overlap" 1 "" overlap "ft-emu: ncclAllReduce:" "overlap"
failure "counts differ between ranks" 2 "" count-mismatch \
  "ft-emu: ncclAllReduce: collective #1 of this communicator differs between ranks" \
  "ncclAllReduce(count 10, ncclFloat32, ncclSum)" "ncclAllReduce(count 11, ncclFloat32, ncclSum)"
failure "different collectives on two ranks" 3 "" call-mismatch "differs between ranks" \
  "ncclBroadcast(count 8, ncclFloat32, root 0)" "ncclAllReduce(count 8, ncclFloat32, ncclSum)"
failure "a receive longer than the send" 2 "" recv-longer "ft-emu: ncclRecv:" "which sent 40"
failure "a receive shorter than the send" 2 "" recv-shorter "ft-emu: ncclRecv:" "which sent more"
failure "a receive from itself with nothing sent" 0 "" recv-self "ft-emu: ncclRecv:" \
  "sent itself nothing"
failure "a rank that never joins: the timeout" 2 "FT_EMU_NCCL_TIMEOUT=2" hang \
  "ft-emu: ncclAllReduce: rank 0:" "did not complete within 2 s"

echo "nccl-emu: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
