#!/usr/bin/env bash
# On the GPU machine, from the repository root, with the programs packed into .device-tcore:
#   ../shared/tools/device-pack .device-tcore <build>/bin/{kiln,bench_norms,templates_gpu_test,templates_engine_test}
# Runs the template GPU correctness tests, the engine tests, `kiln templates check` for sm_90a, torch.compile's
# softmax over long rows (bench/norms/softmax_torch.py, when PyTorch is there) and the norms benchmark with the
# long-row softmax rows compared with it; full logs and the JSON go to $OUT, a summary to stdout.
# SKIP_TESTS=1 skips the three test steps.
source "$(dirname "$0")/../support/device_env.sh" "${PACK:-.device-tcore}"
# Files in $OUT: norms.json, softmax_torch.json and norms.log (the tests' and benches' logs).
log=$OUT/norms.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv | tee "$log"
if [[ -z ${SKIP_TESTS:-} ]]; then
  timeout 100 $D/templates_gpu_test > /tmp/gpu_test.log 2>&1; echo "templates_gpu_test rc=$?" | tee -a "$log"
  cat /tmp/gpu_test.log >> "$log"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|Failure|error:|Expected|Which is|rel_error|Trace|gpu_test.cpp" /tmp/gpu_test.log | head -60
  timeout 20 $D/templates_engine_test > /tmp/engine_test.log 2>&1; echo "templates_engine_test rc=$?" | tee -a "$log"
  tail -3 /tmp/engine_test.log | tee -a "$log"
  timeout 40 $D/kiln templates check --arch sm_90a --sample 4 > /tmp/check.log 2>&1; echo "templates check rc=$?" | tee -a "$log"
  tail -6 /tmp/check.log | tee -a "$log"
fi
torch_args=()
py=${KILN_DEVICE_PYTHON:-/opt/torch/.venv/bin/python}
if [[ -x $py ]]; then
  timeout 300 "$py" bench/norms/softmax_torch.py --json "$OUT/softmax_torch.json" > /tmp/softmax_torch.log 2>&1
  echo "softmax_torch rc=$?" | tee -a "$log"; cat /tmp/softmax_torch.log >> "$log"; tail -8 /tmp/softmax_torch.log
  [[ -s $OUT/softmax_torch.json ]] && torch_args=(--torch "$OUT/softmax_torch.json")
fi
timeout ${BENCH_TIMEOUT:-240} $D/bench_norms --json "$OUT/norms.json" "${torch_args[@]}" "$@" > /tmp/bench.txt 2> /tmp/bench.err
echo "bench_norms rc=$?" | tee -a "$log"; cat /tmp/bench.err /tmp/bench.txt >> "$log"
tail -5 /tmp/bench.err; cat /tmp/bench.txt
