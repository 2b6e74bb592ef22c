#!/usr/bin/env bash
# ft-train of the emulated build on the emulated GPU (train.device cuda), on the demo model
# with short rows: the GPU path of the trainer end to end, every step under the
# emulation's checks (a host pointer handed to a kernel, a copy the wrong way, reads of
# memory never written... stop the run):
#   - fp32 on the GPU gives the CPU run's losses (the same binary, train.device cpu);
#   - each strategy on one process (zero1, zero2, zero3, fsdp, model_parallel, zero2 with
#     the optimizer offloaded) gives the plain GPU run's losses and writes its checkpoint
#     and adapter, the adapter bit for bit; zero3 and model_parallel (the strategies that
#     gather the weights on the host to save them) resumed from the checkpoint end with the
#     same adapter;
#   - QLoRA (NF4 base on the GPU) gives the CPU QLoRA run's losses; bf16 learns.
# Prints one line per check and "emu_train: N passed, N failed". FT_EMU_TRAIN names the
# ft-train to run (default build-emu/bin/ft-train).
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
train=${FT_EMU_TRAIN:-$repo/build-emu/bin/ft-train}
if [ ! -x "$train" ]; then
  echo "emu_train: $train is not built (make CUDA=emu)"; echo "emu_train: 0 passed, 1 failed"; exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0; failed=0
ok() { passed=$((passed + 1)); echo "  $1: ok"; }
bad() { failed=$((failed + 1)); echo "  $1: FAIL${2:+: $2}"; }

# run NAME [--set key=value ...]: 3 steps, a checkpoint at step 2, no evaluation (short:
# a save runs a sum-of-squares kernel of 1024 x 256 threads for each weight)
run() {
  local name=$1
  shift
  ( cd "$repo" && env -u CUDA_VISIBLE_DEVICES "$train" --config configs/default.yaml \
      --set model.max_seq_len=64 --set train.batch_size=4 --set train.max_steps=3 \
      --set train.save_steps=2 --set train.save_total_limit=10 --set train.logging_steps=1 \
      --set train.eval_strategy=no --set train.predict_with_generate=false \
      --set train.output_dir="$work/$name" "$@" >"$work/$name.out" 2>"$work/$name.err"; exit $? ) \
    2>/dev/null
}

# the losses of a run, one a line
losses() { sed -n 's/.*"loss": \([^,]*\),.*/\1/p' "$work/$1/metrics.jsonl" 2>/dev/null; }

# same_losses A B TOL: every step's loss within TOL relative
same_losses() {
  local a b
  a=$(losses "$1"); b=$(losses "$2")
  [ -n "$a" ] && [ "$(echo "$a" | wc -l)" -eq 3 ] && [ "$(echo "$b" | wc -l)" -eq 3 ] &&
    paste <(echo "$a") <(echo "$b") |
      awk -v tol="$3" '{d = $1 - $2; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2; if (m < 1) m = 1;
                        if (d > tol * m) bad = 1} END {exit bad}'
}

# check NAME: the run exited 0; else its error (the emulation's message first)
check_run() {
  if [ "$2" -eq 0 ]; then return 0; fi
  bad "$1" "exit $2: $(grep -m1 '^ft-emu: \|error' "$work/$1.err" | cut -c1-300)"
  return 1
}

run cpu --set train.device=cpu --set train.bf16=false
check_run cpu $? || true
run gpu --set train.device=cuda --set train.bf16=false
if check_run gpu $?; then
  if grep -q "emulated CUDA GPU" "$work/gpu.err" && same_losses gpu cpu 1e-4; then
    ok "fp32 on the emulated GPU = the CPU run ($(losses gpu | tr '\n' ' '))"
  else
    bad "fp32 on the emulated GPU vs the CPU" "$(losses gpu | tr '\n' ' ') vs $(losses cpu | tr '\n' ' ')"
  fi
fi

for s in zero1 zero2 zero3 fsdp model_parallel offload; do
  case $s in
    offload) sets=(--set dist.strategy=zero2 --set dist.offload_optimizer=cpu) ;;
    *) sets=(--set dist.strategy=$s) ;;
  esac
  run "$s" --set train.device=cuda --set train.bf16=false "${sets[@]}"
  check_run "$s" $? || continue
  if same_losses "$s" gpu 0 &&
     cmp -s "$work/$s/final/adapter_model.safetensors" "$work/gpu/final/adapter_model.safetensors" &&
     [ -f "$work/$s/checkpoint-2/adapter_model.safetensors" ]; then
    ok "$s on one process = the plain run (losses, checkpoint, adapter bit for bit)"
  else
    bad "$s on one process vs the plain run"
    continue
  fi
  # resumed from the step-2 checkpoint: the same adapter at the end
  case $s in zero3 | model_parallel) ;; *) continue ;; esac
  rm -rf "$work/$s/final" "$work/$s/run_summary.json"
  run "$s" --set train.device=cuda --set train.bf16=false "${sets[@]}" --resume auto
  check_run "$s (resumed)" $? || continue
  if cmp -s "$work/$s/final/adapter_model.safetensors" "$work/gpu/final/adapter_model.safetensors"; then
    ok "$s resumed from its checkpoint = the uninterrupted run"
  else
    bad "$s resumed from its checkpoint vs the uninterrupted run"
  fi
done

run qlora-cpu --set train.device=cpu --set train.bf16=false --set tuning.mode=qlora
check_run qlora-cpu $? || true
run qlora-gpu --set train.device=cuda --set train.bf16=false --set tuning.mode=qlora
if check_run qlora-gpu $?; then
  if same_losses qlora-gpu qlora-cpu 1e-4; then ok "QLoRA (NF4) on the emulated GPU = the CPU QLoRA run"
  else bad "QLoRA on the emulated GPU vs the CPU"; fi
fi

run bf16 --set train.device=cuda --set train.bf16=true --set train.max_steps=10
if check_run bf16 $?; then
  first=$(losses bf16 | head -n 1); last=$(losses bf16 | tail -n 1)
  if grep -q ", bf16" "$work/bf16.err" && awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < a)}'; then
    ok "bf16 on the emulated GPU learns ($first -> $last)"
  else
    bad "bf16 on the emulated GPU" "$first -> $last"
  fi
fi

echo "emu_train: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
