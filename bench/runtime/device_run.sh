#!/usr/bin/env bash
# The runtime's held-over figures on the GPU machine: a cold tune of GEMM 4096³ into an empty cache, then the
# warm start (same problem, new processes, decisions cached) five times, then the dispatch overhead. Pack here:
#   bash scripts/pack_device.sh device-rt build/bin/bench_runtime build/bin/kiln-compile-worker build/bin/kiln-bench-worker
# and there, carrying .device-rt-tar: `tar xJf .device-rt-tar/pack.txz && bash bench/runtime/device_run.sh`.
# JSON per phase and the full logs go to $OUT; the tables to stdout.
source "$(dirname "$0")/../support/device_env.sh" .device-rt
export KILN_MACHINE=${KILN_MACHINE:-nvidia-h200}
problem=${RUNTIME_PROBLEM:-gemm:4096,4096,4096}
cache=$(mktemp -d)
echo "== cold tune ($problem, empty cache)"
timeout 300 $D/bench_runtime tune --problem "$problem" --cache-dir "$cache" --json "$OUT/tune-cold.json" 2>&1 | tail -25
for i in 1 2 3 4 5; do
  echo "== warm start $i"
  TIMEFORMAT="process wall %R s"
  time (timeout 120 $D/bench_runtime tune --problem "$problem" --cache-dir "$cache" --json "$OUT/tune-warm-$i.json" \
    2>&1 | tail -8)
done
echo "== dispatch overhead"
timeout 300 $D/bench_runtime dispatch --problem "$problem" --cache-dir "$cache" --json "$OUT/dispatch.json" 2>&1 | tail -20
rm -rf "$cache"
