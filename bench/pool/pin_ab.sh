#!/usr/bin/env bash
# The process pool's 16-worker efficiency with each worker pinned to one CPU (ProcessPoolOptions::pin_workers,
# KILN_POOL_PIN=1) against the scheduler's placement, A/B on the GPU machine's 16 cores, compiling kiln's own
# gemm_wgmma_sm90 configurations without PCH (what a tune compiles). Each configuration runs `kiln-bench pool`
# (1 and 16 workers; submission order and longest first by the compile-cost estimate) in turn, PIN_AB_PASSES
# times (default 3), so that a drift of the machine meets both alike.
#   here:  bash scripts/pack_device.sh device-pool build/bin/kiln-bench build/bin/kiln-compile-worker
#   there: tar xJf .device-pool-tar/pack.txz && bash bench/pool/pin_ab.sh .device-pool
# One JSON per run under $OUT/pin-ab/, named PASS-CONFIG.json, and a table on stdout.
set -u
source "$(dirname "$0")/../support/device_env.sh" ${1:-.device-pool}
mkdir -p "$OUT/pin-ab"
{ nproc; grep -m1 "model name" /proc/cpuinfo; } > "$OUT/pin-ab/machine.txt" 2>&1
# Warm the page cache and NVRTC's files first: the first run of a fresh machine would pay it alone.
$D/kiln-bench pool --kernel wgmma --arch sm_90a --executor process --workers 1 --kernels 2 --pch off --rounds 1 \
  --overhead-samples 0 --no-cpu-reference > "$OUT/pin-ab/warm-up.txt" 2>&1
first=1
for pass in $(seq 1 "${PIN_AB_PASSES:-3}"); do
  for c in unpinned pinned; do
    json=$OUT/pin-ab/$pass-$c.json
    KILN_POOL_PIN=$([ $c = pinned ] && echo 1 || echo 0) timeout 150 $D/kiln-bench pool --kernel wgmma --arch sm_90a \
      --executor process,process-model --workers 1,16 --pch off --per-worker ${PIN_AB_PER_WORKER:-8} --rounds 1 \
      --overhead-samples 0 --no-cpu-reference --json "$json" > "$OUT/pin-ab/$pass-$c.txt" 2>&1 || echo "$c rc=$?"
    python3 "$(dirname "$0")/ab_row.py" "$json" "$pass" "$c" $( ((first)) && echo --header) 2>/dev/null \
      || echo "$pass $c: no JSON (see $pass-$c.txt)"
    first=0
  done
done
