#!/usr/bin/env bash
# The process pool's 16-worker efficiency with NVRTC's code moved onto transparent huge pages in each worker
# (KILN_POOL_HUGE_TEXT=1, pool/src/huge_text.h) against its code on the file's 4 KiB pages.
#   there: tar xJf .device-pool-tar/pack.txz && bash bench/pool/huge_text_ab.sh .device-pool
# First, whether a worker's code did land on huge pages here: AnonHugePages of one worker while it compiles.
source "$(dirname "$0")/../support/device_env.sh" "${1:-.device-pool}"
mkdir -p "$OUT/huge-text-ab"
KILN_POOL_HUGE_TEXT=1 $D/kiln-bench pool --kernel wgmma --arch sm_90a --executor process --workers 1 --kernels 3 \
  --pch off --rounds 1 --overhead-samples 0 --no-cpu-reference > "$OUT/huge-text-ab/check.txt" 2>&1 &
for _ in $(seq 100); do
  pid=$(pgrep -f kiln-compile-worker | head -1)
  [ -n "$pid" ] && sleep 0.5 && grep -E "^(Rss|AnonHugePages)" /proc/$pid/smaps_rollup && break
  sleep 0.05
done | tee "$OUT/huge-text-ab/worker-smaps.txt"
wait
exec bash "$(dirname "$0")/env_ab.sh" "${1:-.device-pool}" huge-text "small|KILN_POOL_HUGE_TEXT=0" \
  "huge|KILN_POOL_HUGE_TEXT=1"
