#!/usr/bin/env bash
# The pool benchmark on the GPU machine (for its 16 cores; the GPU itself is not used). From the repository
# root here, with the programs packed:
#   ../shared/tools/device-pack .device-pool build-pool/bin/kiln-bench build-pool/bin/kiln-compile-worker
# then run `bash bench/pool/device_run.sh` there, carrying .device-pool (with KILN_COMMIT set to the commit).
# The JSON, the full log and the CPU description go to $OUT; the table to stdout. POOL_BENCH_ARGS adds options,
# e.g. POOL_BENCH_ARGS="--executor process --workers 1,16" for the process pool's end points alone.
source "$(dirname "$0")/../support/device_env.sh" .device-pool
{ nproc; grep -m1 "model name" /proc/cpuinfo; lscpu 2>/dev/null | grep -E "^(CPU\(s\)|Thread|Core|Socket|Model name|CPU max|L3)"; } > "$OUT/cpu.txt" 2>&1
cat "$OUT/cpu.txt"
KILN_MACHINE=nvidia-h200 timeout ${POOL_BENCH_TIMEOUT:-170} $D/kiln-bench pool --rounds ${POOL_BENCH_ROUNDS:-2} \
  --deadline ${POOL_BENCH_DEADLINE:-115} --json "$OUT/pool.json" ${POOL_BENCH_ARGS:-} > "$OUT/pool.txt" 2>&1
echo "kiln-bench pool rc=$?"
grep -v "^  round" "$OUT/pool.txt" | tail -50
