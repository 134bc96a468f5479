#!/usr/bin/env bash
# The process pool's 16-worker efficiency under settings of its environment, A/B on the GPU machine's 16 cores,
# compiling kiln's own gemm_wgmma_sm90 configurations without PCH (what a tune compiles). Each configuration
# runs `kiln-bench pool` (1 and 16 workers; submission order and longest first by the compile-cost estimate) in
# turn, AB_PASSES times (default 3), so that a drift of the machine meets every configuration alike. The workers
# inherit the bench's environment.
#   here:  bash scripts/pack_device.sh device-pool build/bin/kiln-bench build/bin/kiln-compile-worker
#   there: tar xJf .device-pool-tar/pack.txz && bash bench/pool/env_ab.sh .device-pool NAME 'LABEL|VAR=VALUE ...' ...
# One JSON per run under $OUT/NAME-ab/, named PASS-LABEL.json, and a table on stdout.
set -u
source "$(dirname "$0")/../support/device_env.sh" "$1"
name=$2
shift 2
configs=("$@")
dir=$OUT/$name-ab
mkdir -p "$dir"
{ nproc; grep -m1 "model name" /proc/cpuinfo; cat /sys/kernel/mm/transparent_hugepage/enabled; } > "$dir/machine.txt" 2>&1
# Warm the page cache and NVRTC's files first: the first run of a fresh machine would pay it alone.
$D/kiln-bench pool --kernel wgmma --arch sm_90a --executor process --workers 1 --kernels 2 --pch off --rounds 1 \
  --overhead-samples 0 --no-cpu-reference > "$dir/warm-up.txt" 2>&1
first=1
for pass in $(seq 1 "${AB_PASSES:-3}"); do
  for c in "${configs[@]}"; do
    label=${c%%|*}
    envs=${c#*|}
    json=$dir/$pass-$label.json
    env $envs timeout 150 $D/kiln-bench pool --kernel wgmma --arch sm_90a --executor process,process-model \
      --workers 1,16 --pch off --per-worker ${AB_PER_WORKER:-8} --rounds 1 --overhead-samples 0 --no-cpu-reference \
      --json "$json" > "$dir/$pass-$label.txt" 2>&1 || echo "$label rc=$?"
    python3 "$(dirname "$0")/ab_row.py" "$json" "$pass" "$label" $( ((first)) && echo --header) 2>/dev/null \
      || echo "$pass $label: no JSON (see $pass-$label.txt)"
    first=0
  done
done
