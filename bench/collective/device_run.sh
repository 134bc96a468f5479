#!/usr/bin/env bash
# Issue 19 on a multi-GPU machine (nvidia-h200-x2, nvidia-h200-x4), from the repository root, with the programs
# packed on the development machine and PyTorch's anchor copied beside them:
#   bash scripts/pack_device.sh device-symm build/bin/{kiln-bench,kiln-compile-worker,\
#     test_runtime_collective_heap,test_runtime_collective_gpu,test_runtime_comm_gpu}
#   cp ../shared/device/allreduce_anchor.py .device-symm-tar/
# and there (carry ".device-symm-tar"): `bash bench/collective/device_run.sh`.
# Steps (STEPS, default "tests bench anchor table"; split them over calls if one call's 10 minutes are short):
#   tests   the symmetric heap's CPU tests, then the collective GPU tests (all ranks on this machine's GPUs)
#   bench   kiln-bench allreduce --heap: every kind of call tuned on eager timings (heap-eager.json), then the
#           in-place kind tuned on graph replays (heap-graph.json)
#   anchor  ../shared/device/allreduce_anchor.py at every power of two from 4 KiB to 256 MiB (anchor.txt)
#   table   bench/collective/issue_table.py: the issue's table (allreduce-issue19.json) and plot, when matplotlib is
#           there
# Everything goes to $OUT; a summary to stdout.
if [[ -f .device-symm-tar/pack.txz && ! -d .device-symm ]]; then tar xJf .device-symm-tar/pack.txz; fi
source "$(dirname "$0")/../support/device_env.sh" "${PACK:-.device-symm}"
steps=${STEPS:-tests bench anchor table}
gpus=${GPUS:-$(nvidia-smi -L | wc -l)}
log=$OUT/issue19.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$log"
nvidia-smi topo -m >> "$log" 2>&1
py=${KILN_DEVICE_PYTHON:-/opt/torch/.venv/bin/python}
[[ -x $py ]] || py=python3
has() { [[ " $steps " == *" $1 "* ]]; }

if has tests; then
  for t in test_runtime_collective_heap test_runtime_comm_gpu test_runtime_collective_gpu; do
    timeout ${TEST_TIMEOUT:-420} $D/$t > /tmp/$t.log 2>&1; echo "$t rc=$?" | tee -a "$log"
    cat /tmp/$t.log >> "$log"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|Failure|rank [0-9]:" /tmp/$t.log | head -30
  done
fi
if has bench; then
  # EAGER_CALLS (e.g. "in-place") limits the eager tables to the issue's headline kind of call (less device time).
  timeout ${BENCH_TIMEOUT:-420} $D/kiln-bench allreduce --gpus "$gpus" --heap ${EAGER_CALLS:+--calls $EAGER_CALLS} \
    --json "$OUT/heap-eager.json" > /tmp/heap-eager.txt 2>&1
  echo "kiln-bench allreduce --heap rc=$?" | tee -a "$log"; cat /tmp/heap-eager.txt | tee -a "$log"
  timeout ${BENCH_TIMEOUT:-420} $D/kiln-bench allreduce --gpus "$gpus" --heap --graph --calls in-place \
    --json "$OUT/heap-graph.json" > /tmp/heap-graph.txt 2>&1
  echo "kiln-bench allreduce --heap --graph rc=$?" | tee -a "$log"; cat /tmp/heap-graph.txt | tee -a "$log"
fi
if has anchor; then
  anchor=${ANCHOR:-.device-symm-tar/allreduce_anchor.py}
  if [[ -f $anchor ]]; then
    SIZES_KB=${SIZES_KB:-4,8,16,32,64,128,256,512,1024,2048,4096,8192,16384,32768,65536,131072,262144} \
      timeout ${ANCHOR_TIMEOUT:-300} "$py" "$anchor" > "$OUT/anchor.txt" 2> /tmp/anchor.err
    echo "allreduce_anchor rc=$?" | tee -a "$log"; cat "$OUT/anchor.txt"; tail -5 /tmp/anchor.err >> "$log"
  else
    echo "no anchor at $anchor (cp ../shared/device/allreduce_anchor.py .device-symm-tar/)" | tee -a "$log"
  fi
fi
if has table && [[ -s $OUT/heap-eager.json ]]; then
  args=(--eager "$OUT/heap-eager.json" --out "$OUT/allreduce-issue19.json" --plot "$OUT/allreduce-issue19.png")
  [[ -s $OUT/heap-graph.json ]] && args+=(--graph "$OUT/heap-graph.json")
  [[ -s $OUT/anchor.txt ]] && args+=(--anchor "$OUT/anchor.txt")
  "$py" bench/collective/issue_table.py "${args[@]}" | tee -a "$log"
fi
