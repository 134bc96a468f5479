#!/usr/bin/env bash
# The public GEMM suite and the GEMM/softmax GPU tests on the GPU machine, from the repository root.
# Pack on the development machine (one file within the carry limit):
#   bash scripts/pack_device.sh device-kernels build/bin/{bench_gemm_suite,kiln-compile-worker,templates_gemm_gpu_test,templates_gpu_test,bench_norms}
# then run with carry [".device-kernels-tar"]:
#   tar xJf .device-kernels-tar/pack.txz && bash bench/gemm/suite_device_run.sh [bench_gemm_suite args...]
# Writes $OUT/gemm-suite.{json,meta.json,md,svg} and one log, $OUT/gemm.log (5 files: the device tool returns 8;
# bench/norms/device_run.sh adds 3); prints a summary.
# SKIP_TESTS=1 skips the GPU tests; SUITE_SECONDS (default 360) bounds the suite.
source "$(dirname "$0")/../support/device_env.sh" "${PACK:-.device-kernels}"
log=$OUT/gemm.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$log"
if [[ -z ${SKIP_TESTS:-} ]]; then
  timeout 150 $D/templates_gemm_gpu_test --gtest_filter='GemmGpu.SwapAb*:GemmGpu.ClusterSplitK*:GemmGpu.WgmmaSm90Sweep:GemmGpu.WgmmaStagedEpilogue:GemmGpu.WgmmaMulticast' \
    > /tmp/gemm_gpu_test.log 2>&1
  echo "templates_gemm_gpu_test rc=$?" | tee -a "$log"; cat /tmp/gemm_gpu_test.log >> "$log"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|configurations,|Failure|relative error|swab" /tmp/gemm_gpu_test.log | head -40
  timeout 45 $D/templates_gpu_test --gtest_filter='GpuTemplates.Softmax*' > /tmp/softmax_gpu_test.log 2>&1
  echo "templates_gpu_test (softmax) rc=$?" | tee -a "$log"; cat /tmp/softmax_gpu_test.log >> "$log"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|Failure|Expected|Which is|Trace" /tmp/softmax_gpu_test.log | head -20
fi
timeout $(( ${SUITE_SECONDS:-360} + 45 )) $D/bench_gemm_suite --out "$OUT/gemm-suite" --max-seconds "${SUITE_SECONDS:-360}" "$@" \
  > /tmp/suite.txt 2> /tmp/suite.log
echo "bench_gemm_suite rc=$?" | tee -a "$log"; cat /tmp/suite.log /tmp/suite.txt >> "$log"
[[ -s $OUT/gemm-suite.json ]] && rm -f "$OUT/gemm-suite.jsonl"  # gemm-suite.json holds every record
grep -E "stopped|lost|WRONG" /tmp/suite.log | head -20
tail -25 /tmp/suite.log | cut -c1-200
cat /tmp/suite.txt
