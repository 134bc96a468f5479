#!/usr/bin/env bash
# The process pool's 16-worker efficiency with each worker pinned to one CPU (ProcessPoolOptions::pin_workers,
# KILN_POOL_PIN=1) against the scheduler's placement (bench/results/pool-pin-ab-nvidia-h200-2026-12-01-7af7bd2.md).
#   there: tar xJf .device-pool-tar/pack.txz && bash bench/pool/pin_ab.sh .device-pool
AB_PASSES=${PIN_AB_PASSES:-3} AB_PER_WORKER=${PIN_AB_PER_WORKER:-8} \
  exec bash "$(dirname "$0")/env_ab.sh" "${1:-.device-pool}" pin "unpinned|KILN_POOL_PIN=0" "pinned|KILN_POOL_PIN=1"
