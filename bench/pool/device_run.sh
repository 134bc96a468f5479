#!/usr/bin/env bash
# The pool benchmark on the GPU machine (for its 16 cores; the GPU itself is not used). Pack here (the same
# pack as bench/cache/device_run.sh):
#   bash scripts/pack_device.sh device-speed build/bin/bench_cache build/bin/kiln-bench \
#     build/bin/kiln-compile-worker build/bin/test_cache_preload build/bin/test_jit_lazy
# then `tar xJf .device-speed-tar/pack.txz && bash bench/pool/device_run.sh` there, carrying .device-speed-tar
# (with KILN_COMMIT set to the commit). The default measures what issue 16 asks on what kiln compiles: its own
# gemm_wgmma_sm90 configurations, without PCH, through the process pool in submission order, longest first by the
# template's compile-cost estimate (process-model) and by times measured earlier (process-lpt), 1 and 16 workers,
# with the CPU-bound and memory-bound references and the per-batch breakdown (utilisation, tail, dispatch gap,
# per-job compile time, CPU time, page faults, involuntary switches). The JSON, the full log and the CPU
# description go to $OUT; the tables to stdout. POOL_BENCH_ARGS replaces the kernel/executor/worker choice, e.g.
# POOL_BENCH_ARGS="--executor process,process-lpt,process-spin --workers 1,16 --pch both --per-worker 4" for the
# stand-in GEMM (the figures before 1 Dec 2026) or "--executor process,arena,threads --workers 1,2,4,8,16 --pch
# both" for the whole grid.
source "$(dirname "$0")/../support/device_env.sh" ${1:-.device-speed}
{ nproc; grep -m1 "model name" /proc/cpuinfo; lscpu 2>/dev/null | grep -E "^(CPU\(s\)|Thread|Core|Socket|Model name|CPU max|L3)"; } > "$OUT/cpu.txt" 2>&1
cat "$OUT/cpu.txt"
KILN_MACHINE=nvidia-h200 timeout ${POOL_BENCH_TIMEOUT:-400} $D/kiln-bench pool --rounds ${POOL_BENCH_ROUNDS:-3} \
  --deadline ${POOL_BENCH_DEADLINE:-330} --json "$OUT/pool.json" \
  ${POOL_BENCH_ARGS:---kernel wgmma --arch sm_90a --executor process,process-model,process-lpt --workers 1,16 --pch off --per-worker 16} \
  > "$OUT/pool.txt" 2>&1
echo "kiln-bench pool rc=$?"
grep -v "^  round" "$OUT/pool.txt" | tail -60
