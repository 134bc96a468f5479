#!/usr/bin/env bash
# N processes precompiling the Llama-3-8B workload into one empty cache, on the GPU machine (for its 16 cores;
# the GPU itself is not used). From the repository root here, with the programs packed:
#   ../shared/tools/device-pack .device-procs build/bin/kiln build/bin/kiln-compile-worker build/bin/bench_precompile_procs
# then run `bash bench/compile/device_run_procs.sh` there, carrying .device-procs (with KILN_COMMIT set).
# Runs 1 process, 8 with build claims and 8 without (the reference: every process compiles everything), each on
# a fresh cache. The JSON, the table and every process's log go to $OUT. PROCS_ARGS adds or overrides options.
source "$(dirname "$0")/../support/device_env.sh" .device-procs
{ nproc; grep -m1 "model name" /proc/cpuinfo; } > "$OUT/cpu.txt" 2>&1
cat "$OUT/cpu.txt"
timeout ${PROCS_TIMEOUT:-500} $D/bench_precompile_procs --kiln $D/kiln --procs 1,8 --claims both \
  --workload examples/llama3-8b.json --arch sm_90a --work-dir "$OUT/work" --keep \
  --json "$OUT/precompile-procs.json" ${PROCS_ARGS:-} > "$OUT/precompile-procs.txt" 2>&1
echo "bench_precompile_procs rc=$?"
tail -20 "$OUT/precompile-procs.txt"
# Every process's log, without the caches (large): they are what the JSON's per-process summaries came from.
rm -rf "$OUT"/work/*/cache
