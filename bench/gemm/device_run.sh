#!/usr/bin/env bash
# On the GPU machine, from the repository root, with the programs packed into .device-gemm:
#   /work/shared/tools/device-pack .device-gemm build-gemm/bin/{templates_gemm_gpu_test,bench_gemm}
# Runs the GEMM GPU correctness tests, the GEMM benchmark (cubins dumped and their SASS checked for
# HGMMA/HMMA and local-memory spills), full logs and JSON to $OUT, a summary to stdout.
# Usage: bench/gemm/device_run.sh [bench_gemm args...]
source "$(dirname "$0")/../support/device_env.sh" .device-gemm
mkdir -p /tmp/cubins
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
if [[ -z ${SKIP_TESTS:-} ]]; then
  timeout 150 $D/templates_gemm_gpu_test > "$OUT/gemm_gpu_test.log" 2>&1; echo "templates_gemm_gpu_test rc=$?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|configurations,|splitk" "$OUT/gemm_gpu_test.log" | head -40
  grep -E "Failure|error|relative error" "$OUT/gemm_gpu_test.log" | head -30
fi
timeout ${BENCH_TIMEOUT:-300} $D/bench_gemm --json "$OUT/gemm.json" --dump-cubins /tmp/cubins "$@" > "$OUT/bench.txt" 2> "$OUT/bench.err"
echo "bench_gemm rc=$?"
for f in /tmp/cubins/*.cubin; do
  n=$(basename "$f" .cubin)
  s=$(/usr/local/cuda/bin/cuobjdump -sass "$f" 2>/dev/null)
  printf '%s HGMMA=%s HMMA=%s LDL=%s STL=%s\n' "$n" "$(grep -c HGMMA <<<"$s")" "$(grep -c HMMA <<<"$s")" \
    "$(grep -cw LDL <<<"$s")" "$(grep -cw STL <<<"$s")"
done > "$OUT/sass.txt"
awk '{print $2, $3, $4, $5}' "$OUT/sass.txt" | sort | uniq -c | head -20
grep -E "gemm_wgmma_128x256x64_c2_s4_g8_p_bf16_rc" "$OUT/sass.txt" | head -2
tail -3 "$OUT/bench.err"
cat "$OUT/bench.txt"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,power.limit,clocks_throttle_reasons.active --format=csv > "$OUT/gpu_after.txt" 2>&1
cat "$OUT/gpu_after.txt"
