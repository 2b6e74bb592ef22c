#!/usr/bin/env bash
# The communication tests (tests/dist) under real Open MPI ranks:
#   tests/run-dist.sh [DIR]     DIR holds test_comm and test_comm_hang (build/tests/dist)
#
# test_comm runs alone (the single backend), under mpirun -np 1..4, and once with
# FT_DIST_CHUNK so that the MPI calls split into chunks; its "N passed, N failed" lines
# are added up. Then the failure cases, each one check: a rank that hangs or stops must
# make the others abort within the timeout with the collective named on stderr, and a
# rank killed mid-run must take the run down. Every mpirun is under `timeout`, so a bug
# cannot hang CI. Prints "dist: N passed, N failed"; exits non-zero on any failure.
set -u
dir=${1:-build/tests/dist}
comm=$dir/test_comm
hang=$dir/test_comm_hang
limit=${FT_DIST_TEST_LIMIT:-60} # seconds any one run may take
passed=0
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for bin in "$comm" "$hang"; do
  [ -x "$bin" ] || { echo "$bin: not built"; echo "dist: 0 passed, 1 failed"; exit 1; }
done
if ! command -v mpirun >/dev/null 2>&1; then
  echo "mpirun not found (scripts/install-deps.sh installs openmpi-bin)"
  echo "dist: 0 passed, 1 failed"
  exit 1
fi

mpirun=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
# More ranks than cores is fine here; and containers often forbid the cross-memory
# attach that Open MPI's shared-memory transport uses for large messages.
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

show_tail() { sed -n '1,40p' "$1" | sed 's/^/    /'; }

# suite LABEL NP [VAR=VALUE...]: test_comm under mpirun -np NP (0: alone, no launcher).
suite() {
  local label=$1 np=$2 rc line p f
  shift 2
  if [ "$np" -eq 0 ]; then
    env -u OMPI_COMM_WORLD_SIZE -u PMI_SIZE -u PMIX_RANK -u SLURM_PROCID "$@" \
      timeout "$limit" "$comm" >"$tmp/out" 2>"$tmp/err"
  else
    env "$@" timeout "$limit" "${mpirun[@]}" -np "$np" "$comm" >"$tmp/out" 2>"$tmp/err"
  fi
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

# failure LABEL NP MAX_S "ENV..." "ARGS" [NEEDLE...] [!ABSENT...]: test_comm_hang ARGS under
# mpirun must exit non-zero within MAX_S seconds, with each NEEDLE on stderr and no ABSENT.
failure() {
  local label=$1 np=$2 max_s=$3 envs=$4 args=$5 rc t0 ms why="" s
  shift 5
  t0=$(now_ms)
  # shellcheck disable=SC2086 # envs and args are word lists
  env $envs timeout "$limit" "${mpirun[@]}" -np "$np" "$hang" $args >"$tmp/out" 2>"$tmp/err"
  rc=$?
  ms=$(($(now_ms) - t0))
  [ "$rc" -ne 0 ] || why="$why; exited 0"
  [ "$ms" -le $((max_s * 1000)) ] || why="$why; took ${ms} ms (limit ${max_s} s)"
  grep -q "reached the end" "$tmp/err" && why="$why; a waiting rank got out of its collective"
  for s in "$@"; do
    case $s in
      !*) grep -qF -- "${s#!}" "$tmp/err" && why="$why; stderr has \"${s#!}\"" ;;
      *) grep -qF -- "$s" "$tmp/err" || why="$why; stderr lacks \"$s\"" ;;
    esac
  done
  if [ -z "$why" ]; then
    echo "ok $label (exit $rc after ${ms} ms)"
    passed=$((passed + 1))
  else
    echo "FAIL $label: ${why#; } (exit $rc)"
    show_tail "$tmp/err"
    failed=$((failed + 1))
  fi
}

suite "alone (single backend)" 0
for np in 1 2 3 4; do
  suite "mpirun -np $np" "$np"
done
suite "mpirun -np 3, FT_DIST_CHUNK=999" 3 FT_DIST_CHUNK=999
suite "alone, NCCL_TIMEOUT=1800 (the timeout it gives)" 0 NCCL_TIMEOUT=1800

echo "== failure cases"
failure "rank 1 sleeps through an allreduce: timeout" 2 15 "FT_DIST_TIMEOUT=2" \
  "sleep allreduce" \
  "ft: rank 0: allreduce #2 (1000 elements) did not complete within 2 s" \
  "Rerun with FT_DIST_DEBUG=1"
failure "rank 1 stopped (SIGSTOP) in an allreduce: timeout" 2 15 "FT_DIST_TIMEOUT=2" \
  "stop allreduce" "allreduce #2 (1000 elements) did not complete within 2 s"
failure "recv from a rank that sleeps: timeout" 2 15 "FT_DIST_TIMEOUT=2" "sleep recv" \
  "ft: rank 0: recv #1 (1000 elements) did not complete within 2 s"
failure "3 ranks, broadcast from a rank that sleeps: timeout" 3 15 "FT_DIST_TIMEOUT=2" \
  "sleep broadcast" "broadcast #2 (1000 elements) did not complete within 2 s"
failure "FT_DIST_DEBUG=1 shows which rank stopped where" 2 15 \
  "FT_DIST_TIMEOUT=2 FT_DIST_DEBUG=1" "sleep allreduce" \
  "ft: rank 0: start allreduce #2 n=1000" "ft: rank 1: done allreduce #1 n=1000" \
  "!ft: rank 1: start allreduce #2"
# NCCL_TIMEOUT (seconds, as the NCCL troubleshooting advice exports it) when
# FT_DIST_TIMEOUT is not set; FT_DIST_TIMEOUT wins over it
failure "NCCL_TIMEOUT=2: the timeout" 2 15 "NCCL_TIMEOUT=2" "sleep allreduce" \
  "ft: rank 0: allreduce #2 (1000 elements) did not complete within 2 s"
failure "FT_DIST_TIMEOUT=2 over NCCL_TIMEOUT=40" 2 15 "FT_DIST_TIMEOUT=2 NCCL_TIMEOUT=40" \
  "sleep allreduce" "did not complete within 2 s"
# the timeout is far off: only the launcher noticing the dead rank can end this in time
failure "rank 1 killed (SIGKILL) mid-run: the launcher ends the run" 2 20 \
  "FT_DIST_TIMEOUT=40" "kill allreduce" "!did not complete"

echo "dist: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
