#!/usr/bin/env bash
# Preload on the GPU machine: bench_cache (store latencies, then 100 and 1,000 preloaded kernels: raw
# cuModuleLoadData and cuLibraryLoadData references beside kiln's eager serial/parallel, library-API, lazy and
# verify-only variants, each with its read/verify/driver breakdown; then first launches), once under the
# driver's default module loading and once (1,000 kernels only) under CUDA_MODULE_LOADING=EAGER; then the GPU
# tests of preloading and lazy kernels. Pack here (one pack serves bench/pool/device_run.sh too):
#   bash scripts/pack_device.sh device-speed build/bin/bench_cache build/bin/kiln-bench \
#     build/bin/kiln-compile-worker build/bin/test_cache_preload build/bin/test_jit_lazy
# and there, carrying .device-speed-tar: `tar xJf .device-speed-tar/pack.txz && bash bench/cache/device_run.sh`.
# JSON and logs go to $OUT; the tables to stdout.
source "$(dirname "$0")/../support/device_env.sh" ${1:-.device-speed}
export KILN_MACHINE=${KILN_MACHINE:-nvidia-h200}
echo "== bench_cache (default CUDA_MODULE_LOADING)"
timeout ${CACHE_BENCH_TIMEOUT:-300} $D/bench_cache --sizes ${CACHE_BENCH_SIZES:-100,1000} --reps ${CACHE_BENCH_REPS:-5} \
  --threads 1,2,4,8 --json "$OUT/cache.json" > "$OUT/cache.txt" 2>&1
echo "bench_cache rc=$?"
cat "$OUT/cache.txt"
echo "== bench_cache, CUDA_MODULE_LOADING=EAGER, 1,000 kernels"
CUDA_MODULE_LOADING=EAGER timeout 150 $D/bench_cache --quick --sizes 1000 --reps 3 --threads 1,2 \
  --json "$OUT/cache-eager-env.json" > "$OUT/cache-eager-env.txt" 2>&1
echo "bench_cache (EAGER) rc=$?"
sed -n '/^preload variants/,$p' "$OUT/cache-eager-env.txt"
echo "== GPU tests"
for t in test_cache_preload test_jit_lazy; do
  timeout 120 $D/$t > "$OUT/$t.txt" 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/$t.txt" | tr '\n' ' ')"
done
