#!/usr/bin/env bash
# ft-train of the emulated build on several ranks of emulated GPUs (mpirun, NCCL
# emulation), and the GPU paths of lib/dist, lib/memory and lib/device that only ranks or
# a full device show:
#   - a rank that sees one GPU of its own (Slurm's --gpus-per-task=1: CUDA_VISIBLE_DEVICES
#     per rank) takes it as device 0 and NCCL starts: ft-train trains as when every rank
#     sees both GPUs, and test_dist_nccl passes on 2 such ranks; two ranks on one GPU are
#     refused with a message;
#   - batch_size auto opens a context on the rank's own GPU only (FT_EMU_CONTEXT_LOG), with
#     both GPUs visible to each rank and with one each, and a budget that is another
#     rank's says what it is (that rank's free GPU memory);
#   - a device too small for cuBLAS's workspace: the memory plan, the advice and exit 1,
#     not an abort inside an op;
#   - zero1 and zero2 in bf16 on 2 ranks give ddp's losses, checkpoint and adapter bit for
#     bit, and gather the bf16 copies: the allgather moves half the bytes of the fp32
#     gradients' reduce-scatter (FT_DIST_PROFILE);
#   - QLoRA (NF4 + double quantization) under fsdp and zero3, with and without
#     dist.offload_params cpu, on 2 ranks: the quantized base sharded by blocks (each rank
#     about half of ddp's whole base, run_summary.json), the losses and the adapter of
#     ddp's run; an offloaded shard is page-locked on every rank (FT_EMU_PIN_LOG), and
#     nothing is without offload; fsdp's checkpoint (base offloaded) resumes under zero3
#     with ddp's last loss and adapter.
# Prints one line per check and "emu_dist: N passed, N failed". FT_EMU_TRAIN names the
# ft-train to run (default build-emu/bin/ft-train); FT_EMU_NCCL=0 (a build without MPI)
# runs the one-process checks only.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
train=${FT_EMU_TRAIN:-$repo/build-emu/bin/ft-train}
nccl_test=$(dirname "$(dirname "$train")")/tests/gpu/test_dist_nccl
if [ ! -x "$train" ]; then
  echo "emu_dist: $train is not built (make CUDA=emu)"; echo "emu_dist: 0 passed, 1 failed"; exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0; failed=0
ok() { passed=$((passed + 1)); echo "  $1: ok"; }
bad() { failed=$((failed + 1)); echo "  $1: FAIL${2:+: $2}"; }

mpirun=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
unset CUDA_VISIBLE_DEVICES FT_DIST_BACKEND FT_EMU_CONTEXT_LOG
# each rank sees one emulated GPU of its own, as under srun --gpus-per-task=1 (RANK1_MEM:
# rank 1's device memory, FT_EMU_MEM of that rank only)
cat >"$work/own-gpu" <<'EOF'
#!/bin/sh
if [ -n "${RANK1_MEM:-}" ] && [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then export FT_EMU_MEM=$RANK1_MEM; fi
CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK exec "$@"
EOF
chmod +x "$work/own-gpu"

# run NAME NP [VAR=VALUE...] -- [--set key=value ...]: ft-train on 2 emulated GPUs, 3 steps
# of 4 rows, a checkpoint at step 2; NP 0 is one process without mpirun; OWN_GPU=1 in the
# variables runs each rank with a GPU of its own.
run() {
  local name=$1 np=$2 vars=() wrap=()
  shift 2
  while [ "$1" != "--" ]; do
    case $1 in OWN_GPU=1) wrap=("$work/own-gpu") ;; *) vars+=("$1") ;; esac
    shift
  done
  shift
  local cmd=("${wrap[@]}" "$train" --config configs/default.yaml --set model.max_seq_len=64
    --set train.batch_size=4 --set train.max_steps=3 --set train.save_steps=2
    --set train.save_total_limit=10 --set train.logging_steps=1 --set train.eval_strategy=no
    --set train.predict_with_generate=false --set train.device=cuda
    --set train.output_dir="$work/$name" "$@")
  [ "$np" -gt 0 ] && cmd=("${mpirun[@]}" -np "$np" "${cmd[@]}")
  ( cd "$repo" && env FT_EMU_DEVICES=2 "${vars[@]}" timeout 300 "${cmd[@]}" \
      >"$work/$name.out" 2>"$work/$name.err"; exit $? ) 2>/dev/null
}

losses() { sed -n 's/.*"loss": \([^,]*\),.*/\1/p' "$work/$1/metrics.jsonl" 2>/dev/null; }
first_err() { grep -m1 '^ft-emu: \|error' "$work/$1.err" | cut -c1-300; }

# contexts NAME RANK: the emulated devices rank RANK opened a context on (sorted, unique)
contexts() { sed -n "s/^ft-emu: context: pid [0-9]* rank $2 device \([0-9]*\) .*/\1/p" \
               "$work/$1.ctx" 2>/dev/null | sort -u | tr '\n' ' '; }

# ---- one process: out of device memory for cuBLAS's workspace -------------------------
# 16 MiB holds the tiny model (the plan: about 10 MiB) but not cuBLAS's 32 MiB (sm_90)
run oom 0 FT_EMU_MEM=16MiB FT_EMU_DEVICES=1 --
rc=$?
if [ "$rc" -eq 1 ] && grep -q "out of memory on rank 0 (GPU 0)" "$work/oom.err" &&
   grep -q "overrides that fit" "$work/oom.err" &&
   grep -q "error: .*cuBLAS's workspace" "$work/oom.err" && ! grep -q '^ft-emu:' "$work/oom.err"; then
  ok "no room for cuBLAS's workspace: the memory plan, the advice, exit 1"
else
  bad "no room for cuBLAS's workspace" "exit $rc: $(grep -m2 'error\|ft-emu\|CUBLAS\|CUDA' "$work/oom.err" | tr '\n' ' ' | cut -c1-300)"
fi

if [ "${FT_EMU_NCCL:-1}" = 0 ]; then
  echo "  (the checks on several ranks: skipped, this emulated build has no NCCL emulation)"
  echo "emu_dist: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]; exit
fi

# ---- a GPU per rank, seen as all of the node's or as one of its own ------------------
run shared 2 FT_DIST_BACKEND=nccl -- --set dist.strategy=ddp
rc_shared=$?
run own 2 OWN_GPU=1 FT_DIST_BACKEND=nccl -- --set dist.strategy=ddp
rc=$?
if [ "$rc" -ne 0 ]; then
  bad "NCCL with one GPU of its own per rank" "exit $rc: $(first_err own)"
elif [ "$rc_shared" -ne 0 ]; then
  bad "NCCL with both GPUs visible to each rank" "exit $rc_shared: $(first_err shared)"
elif grep -q "2 ranks (nccl)" "$work/own.err" && [ -n "$(losses own)" ] &&
     [ "$(losses own)" = "$(losses shared)" ] &&
     cmp -s "$work/own/final/adapter_model.safetensors" "$work/shared/final/adapter_model.safetensors"; then
  ok "NCCL with one GPU of its own per rank = with both visible to each ($(losses own | tr '\n' ' '))"
else
  bad "NCCL with one GPU of its own per rank vs both visible" "$(losses own | tr '\n' ' ') vs $(losses shared | tr '\n' ' ')"
fi

if [ -x "$nccl_test" ]; then
  out=$(cd "$repo" && env FT_EMU_DEVICES=2 timeout 300 "${mpirun[@]}" -np 2 "$work/own-gpu" \
          "$nccl_test" 2>&1); rc=$?
  n=$(printf '%s\n' "$out" | grep -cE '^dist_nccl: [0-9]+ passed, 0 failed')
  if [ "$rc" -eq 0 ] && [ "$n" -eq 2 ]; then
    ok "test_dist_nccl on 2 ranks with one GPU of its own each"
  else
    bad "test_dist_nccl on 2 ranks with one GPU of its own each" \
        "exit $rc: $(printf '%s\n' "$out" | grep -m2 'error\|failed\|ft-emu' | tr '\n' ' ' | cut -c1-300)"
  fi
else
  bad "test_dist_nccl on 2 ranks with one GPU of its own each" "$nccl_test is not built"
fi

run one-gpu 2 FT_EMU_DEVICES=1 FT_DIST_BACKEND=nccl -- --set dist.strategy=ddp
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "share GPU .*NCCL needs one GPU per rank" "$work/one-gpu.err"; then
  ok "two ranks on one GPU: NCCL refused with a message (exit $rc)"
else
  bad "two ranks on one GPU" "exit $rc: $(first_err one-gpu)"
fi

# ---- batch_size auto: a context on the rank's own GPU only ----------------------------
for how in shared own; do
  vars=(FT_EMU_CONTEXT_LOG="$work/auto-$how.ctx")
  [ "$how" = own ] && vars+=(OWN_GPU=1 RANK1_MEM=128MiB)
  # (a small device keeps the batch auto picks small)
  run "auto-$how" 2 FT_EMU_MEM=160MiB "${vars[@]}" -- --set dist.strategy=ddp \
    --set train.batch_size=auto --set train.max_steps=1
  rc=$?
  label="batch_size auto on 2 ranks, $( [ "$how" = own ] && echo "one GPU each" || echo "both GPUs visible")"
  c0=$(contexts "auto-$how" 0); c1=$(contexts "auto-$how" 1)
  if [ "$rc" -ne 0 ]; then
    bad "$label" "exit $rc: $(first_err "auto-$how")"
  elif grep -q "batch_size auto = " "$work/auto-$how.err" && [ "$c0" = "0 " ] && [ "$c1" = "1 " ]; then
    ok "$label: each rank opened a context on its own GPU only"
  else
    bad "$label" "contexts: rank 0 on devices [${c0% }], rank 1 on [${c1% }] (want [0] and [1])"
  fi
done
# (rank 1's device was the smaller: rank 0 names where the budget came from)
if grep -q "another rank's free GPU memory x 0.9, the smallest" "$work/auto-own.err"; then
  ok "batch_size auto: a budget from another rank's GPU says so"
else
  bad "batch_size auto: a budget from another rank's GPU" "$(grep -m1 -o 'budget of .*' "$work/auto-own.err")"
fi

# ---- zero1 / zero2 in bf16: the bf16 copies travel, the results stay ------------------
# step_bytes NAME KIND: rank 0's bytes of KIND in step 1 (FT_DIST_PROFILE)
step_bytes() {
  sed -n '1s/.*"bytes": {\(.*\)}}/\1/p' "$work/$1.prof/rank-0.jsonl" 2>/dev/null |
    tr ',' '\n' | sed -n "s/ *\"$2\": \([0-9.e+]*\)/\1/p"
}
run ddp-bf16 2 FT_DIST_PROFILE="$work/ddp-bf16.prof" -- --set dist.strategy=ddp
check_ddp=$?
for s in zero1 zero2; do
  run "$s-bf16" 2 FT_DIST_PROFILE="$work/$s-bf16.prof" -- --set dist.strategy=$s
  rc=$?
  if [ "$rc" -ne 0 ] || [ "$check_ddp" -ne 0 ]; then
    bad "$s in bf16 on 2 ranks" "exit $rc (ddp: $check_ddp): $(first_err "$s-bf16") $(first_err ddp-bf16)"
    continue
  fi
  rs=$(step_bytes "$s-bf16" reduce_scatter); ag=$(step_bytes "$s-bf16" allgather)
  if [ -n "$(losses "$s-bf16")" ] && [ "$(losses "$s-bf16")" = "$(losses ddp-bf16)" ] &&
     cmp -s "$work/$s-bf16/final/adapter_model.safetensors" "$work/ddp-bf16/final/adapter_model.safetensors" &&
     cmp -s "$work/$s-bf16/checkpoint-2/adapter_model.safetensors" \
            "$work/ddp-bf16/checkpoint-2/adapter_model.safetensors"; then
    ok "$s in bf16 on 2 ranks = ddp (losses, checkpoint, adapter bit for bit)"
  else
    bad "$s in bf16 on 2 ranks vs ddp" "$(losses "$s-bf16" | tr '\n' ' ') vs $(losses ddp-bf16 | tr '\n' ' ')"
  fi
  if [ -n "$rs" ] && [ -n "$ag" ] && awk -v rs="$rs" -v ag="$ag" 'BEGIN {exit !(rs > 0 && 2 * ag == rs)}'; then
    ok "$s in bf16 gathers the bf16 copies: allgather $ag bytes = half the fp32 reduce-scatter's $rs"
  else
    bad "$s in bf16: the allgather moves ${ag:-?} bytes, the fp32 reduce-scatter ${rs:-?} (want half)"
  fi
done

# ---- QLoRA: the quantized base sharded by blocks, offloaded or not -------------------
qbytes() { sed -n 's/.*"quantized_base_bytes": \[\([0-9, ]*\)\].*/\1/p' "$work/$1/run_summary.json" 2>/dev/null | tr -d ' '; }
run q-ddp 2 -- --set tuning.mode=qlora --set dist.strategy=ddp
check_ddp=$?
for v in "fsdp none" "zero3 cpu" "fsdp cpu"; do
  set -- $v
  name="q-$1-$2"
  label="QLoRA under $1 on 2 ranks, dist.offload_params $2"
  run "$name" 2 FT_EMU_PIN_LOG="$work/$name.pin" -- --set tuning.mode=qlora \
    --set dist.strategy=$1 --set dist.offload_params=$2
  rc=$?
  pinned=$(sed -n 's/^ft-emu: pinned: pid [0-9]* rank \([0-9]*\) bytes [0-9]*$/\1/p' \
             "$work/$name.pin" 2>/dev/null | sort -u | tr '\n' ' ')
  want_pinned=""; [ "$2" = cpu ] && want_pinned="0 1 "
  if [ "$pinned" = "$want_pinned" ]; then
    ok "$label: the ranks that page-locked an offloaded shard: [${pinned% }]"
  else
    bad "$label: the ranks that page-locked an offloaded shard" "[${pinned% }], want [${want_pinned% }]"
  fi
  if [ "$rc" -ne 0 ] || [ "$check_ddp" -ne 0 ]; then
    bad "$label" "exit $rc (ddp: $check_ddp): $(first_err "$name") $(first_err q-ddp)"
    continue
  fi
  whole=$(qbytes q-ddp); got=$(qbytes "$name")
  if [ -n "$(losses "$name")" ] && [ "$(losses "$name")" = "$(losses q-ddp)" ] &&
     cmp -s "$work/$name/final/adapter_model.safetensors" "$work/q-ddp/final/adapter_model.safetensors" &&
     awk -v w="$whole" -v g="$got" 'BEGIN {split(w, a, ","); split(g, b, ",");
       exit !(a[1] == a[2] && a[1] > 0 && b[1] + b[2] >= a[1] && b[1] < 0.55 * a[1] && b[2] < 0.55 * a[1])}'; then
    ok "$label = ddp (losses, adapter bit for bit); quantized base per rank $got of $whole bytes"
  else
    bad "$label vs ddp" "$(losses "$name" | tr '\n' ' ') vs $(losses q-ddp | tr '\n' ' '); bytes $got of $whole"
  fi
done

run q-resume 2 -- --set tuning.mode=qlora --set dist.strategy=zero3 \
  --resume "$work/q-fsdp-cpu/checkpoint-2"
rc=$?
if [ "$rc" -ne 0 ]; then
  bad "QLoRA: fsdp's checkpoint resumed under zero3" "exit $rc: $(first_err q-resume)"
elif [ "$(losses q-resume)" = "$(losses q-ddp | tail -n 1)" ] &&
     cmp -s "$work/q-resume/final/adapter_model.safetensors" "$work/q-ddp/final/adapter_model.safetensors"; then
  ok "QLoRA: fsdp's checkpoint (base offloaded) resumed under zero3 = ddp's step 3 and adapter"
else
  bad "QLoRA: fsdp's checkpoint resumed under zero3" "$(losses q-resume | tr '\n' ' ') vs ddp's $(losses q-ddp | tr '\n' ' ')"
fi

echo "emu_dist: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
