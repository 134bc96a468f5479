#!/usr/bin/env bash
# On the GPU machine, from the repository root, with the programs packed into .device-tcore:
#   ../shared/tools/device-pack .device-tcore <build>/bin/{kiln,bench_norms,templates_gpu_test,templates_engine_test}
# Runs the template GPU correctness tests, the engine tests, `kiln templates check` for sm_90a and the norms
# benchmark; full logs and the JSON go to $OUT, a summary to stdout.
source "$(dirname "$0")/../support/device_env.sh" .device-tcore
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
timeout 100 $D/templates_gpu_test > "$OUT/gpu_test.log" 2>&1; echo "templates_gpu_test rc=$?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|Failure|error:|Expected|Which is|rel_error|Trace|gpu_test.cpp" "$OUT/gpu_test.log" | head -60
timeout 20 $D/templates_engine_test > "$OUT/engine_test.log" 2>&1; echo "templates_engine_test rc=$?"; tail -3 "$OUT/engine_test.log"
timeout 40 $D/kiln templates check --arch sm_90a --sample 4 > "$OUT/check.log" 2>&1; echo "templates check rc=$?"; tail -6 "$OUT/check.log"
timeout 100 $D/bench_norms --json "$OUT/norms.json" > "$OUT/bench.txt" 2> "$OUT/bench.err"; echo "bench_norms rc=$?"
tail -5 "$OUT/bench.err"; cat "$OUT/bench.txt"
