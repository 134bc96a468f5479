#!/usr/bin/env bash
# Tuning speed on the GPU machine (issue 16). Pack here:
#   bash scripts/pack_device.sh device-ts build/bin/bench_tuning_speed build/bin/kiln-compile-worker build/bin/kiln-bench-worker
# and there, carrying .device-ts-tar, one 600-s call per step:
#   tar xJf .device-ts-tar/pack.txz && bash bench/tuning/device_run.sh headline      # 4096^3 cold, Llama-3-8B cold + warm
#   tar xJf .device-ts-tar/pack.txz && bash bench/tuning/device_run.sh suite 0/4     # then 1/4, 2/4, 3/4
# Each suite part writes $OUT/tuning-speed-part-<i>.json; bring them back and join them here:
#   build/bin/bench_tuning_speed merge --out-dir bench/results tuning-speed-part-*.json
# which writes bench/results/tuning-speed-<device>-<date>-<commit>.json with the summary.
# EXHAUSTIVE_CONFIGS (default 256 per template, every parameter value covered, seeds included) bounds the
# exhaustive reference: the whole pruned wgmma space is 3444 configurations per dtype/layout, ~14k cold NVRTC
# compiles for the suite, which no 600-s call holds (`bench_tuning_speed plan --part 0/4` estimates either
# without a GPU). Split finer (suite 0/8 ...) if a part runs past the call's limit.
source "$(dirname "$0")/../support/device_env.sh" .device-ts
export KILN_MACHINE=${KILN_MACHINE:-nvidia-h200}
step=${1:-headline}
case "$step" in
  headline)
    c=$(mktemp -d)
    echo "== 4096^3 bf16, cold, default effort"
    timeout 120 $D/bench_tuning_speed gemm4096 --cache-dir "$c/g" --json "$OUT/tuning-gemm4096-cold.json" 2>&1 | tail -20
    echo "== Llama-3-8B workload, cold (empty cache), default effort"
    timeout 240 $D/bench_tuning_speed workload --cache-dir "$c/w" --json "$OUT/tuning-llama3-8b-cold.json" 2>&1 | tail -5
    for i in 1 2 3; do
      echo "== Llama-3-8B workload, warm $i (new process, decisions cached)"
      timeout 60 $D/bench_tuning_speed workload --cache-dir "$c/w" --json "$OUT/tuning-llama3-8b-warm-$i.json" 2>&1 | tail -4
    done
    rm -rf "$c"
    ;;
  suite)
    part=${2:-0/4}
    timeout 590 $D/bench_tuning_speed suite --part "$part" --cache-root "$(mktemp -d)" \
      --exhaustive-configs "${EXHAUSTIVE_CONFIGS:-256}" \
      --json "$OUT/tuning-speed-part-${part%%/*}.json" 2> "$OUT/tuning-speed-part-${part%%/*}.log" | tail -140
    tail -5 "$OUT/tuning-speed-part-${part%%/*}.log"
    ;;
  *)
    echo "usage: device_run.sh headline | suite i/N" >&2
    exit 2
    ;;
esac
