#!/usr/bin/env bash
# Tuning speed on the GPU machine (issue 16). Pack here:
#   bash scripts/pack_device.sh device-ts build/bin/bench_tuning_speed build/bin/kiln-compile-worker build/bin/kiln-bench-worker
# and there, carrying .device-ts-tar (PACK=.other to use another pack), one 600-s call per step:
#   tar xJf .device-ts-tar/pack.txz && bash bench/tuning/device_run.sh headline      # 4096^3 cold, Llama-3-8B cold + warm
#   tar xJf .device-ts-tar/pack.txz && bash bench/tuning/device_run.sh suite 0/2     # then suite 1/2
# Each suite part writes $OUT/tuning-speed-part-<i>.json; bring them back and join them here:
#   build/bin/bench_tuning_speed merge --out-dir bench/results tuning-speed-part-*.json
# which writes bench/results/tuning-speed-<device>-<date>-<commit>.json with the summary.
# How two calls hold the exhaustive reference: each effort tunes the part's problems on one empty cache shared
# across the part, as a workload tune does (a GEMM kernel's sizes are run-time arguments, so each configuration
# compiles once per dtype/layout and serves every problem of the part); exhaustive_s is each problem's tune time
# in that workload. EXHAUSTIVE_CONFIGS (default 256 per template, every parameter value covered, seeds included)
# bounds the exhaustive sample as before: the whole pruned wgmma space is 3444 configurations per dtype/layout.
# `bench_tuning_speed plan --part 0/2 --exhaustive-configs 256` estimates a part's call without a GPU. --deadline
# 560 stops tuning new problems before the call's limit and reports the rest as not run, so a part that runs
# long still brings back what it measured (rerun the missing ones with --shapes). SUITE_ARGS adds options to the
# suite's command line (e.g. --l2-flush-by-writing for the flush kiln used before 29 Nov 2026, or --second-reference
# to tune the exhaustive effort twice and judge it against itself: ~245 s a part with DEADLINE=330).
source "$(dirname "$0")/../support/device_env.sh" "${PACK:-.device-ts}"
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
      echo "== Llama-3-8B workload, warm $i (new process, decisions cached, module loads deferred to first runs)"
      timeout 60 $D/bench_tuning_speed workload --cache-dir "$c/w" --json "$OUT/tuning-llama3-8b-warm-$i.json" 2>&1 | tail -10
    done
    echo "== Llama-3-8B workload, warm, KILN_EXECUTOR=arena (the executor made with the tuner)"
    KILN_EXECUTOR=arena timeout 60 $D/bench_tuning_speed workload --cache-dir "$c/w" --json "$OUT/tuning-llama3-8b-warm-arena.json" 2>&1 | tail -3
    echo "== Llama-3-8B workload, warm, module loads in tune() (--eager-loads)"
    timeout 60 $D/bench_tuning_speed workload --cache-dir "$c/w" --eager-loads --json "$OUT/tuning-llama3-8b-warm-eager.json" 2>&1 | tail -10
    rm -rf "$c"
    ;;
  suite)
    part=${2:-0/2}
    # The GPU's clocks, power and throttle reasons every 100 ms beside the run: the log's t= lines and its
    # "run start: unix" line place each problem's tune on this timeline.
    smi=""
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
        --format=csv,noheader -lms 100 > "$OUT/clocks-part-${part%%/*}.csv" 2>&1 &
      smi=$!
    fi
    timeout 590 $D/bench_tuning_speed suite --part "$part" --cache-root "$(mktemp -d)" \
      --exhaustive-configs "${EXHAUSTIVE_CONFIGS:-256}" --deadline "${DEADLINE:-560}" \
      --json "$OUT/tuning-speed-part-${part%%/*}.json" --reports "$OUT/tuning-reports-part-${part%%/*}.jsonl" ${SUITE_ARGS:-} \
      2> "$OUT/tuning-speed-part-${part%%/*}.log" | tail -140
    tail -5 "$OUT/tuning-speed-part-${part%%/*}.log"
    xz -f "$OUT/tuning-reports-part-${part%%/*}.jsonl" 2>/dev/null || true
    if [ -n "$smi" ]; then kill "$smi" 2>/dev/null || true; fi
    ;;
  *)
    echo "usage: device_run.sh headline | suite i/N" >&2
    exit 2
    ;;
esac
