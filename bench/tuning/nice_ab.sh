#!/usr/bin/env bash
# The default effort's tune time with the compile workers at other CPU priorities (ProcessPoolOptions::
# worker_nice through KILN_POOL_NICE), the suite's two parts each, alternating, in one call on the GPU machine:
#   tar xJf .device-ts-tar/pack.txz && bash bench/tuning/nice_ab.sh "0 10" 2
# NICES: the values to compare; PASSES: how many times each. Each run is `bench_tuning_speed suite --default-only`
# (no exhaustive reference) on empty caches; nice_row.py prints one row per run from its JSON and reports.
source "$(dirname "$0")/../support/device_env.sh" "${PACK:-.device-ts}"
nices=${1:-"0 10"}
passes=${2:-2}
for pass in $(seq 1 "$passes"); do
  for n in $nices; do
    for part in 0 1; do
      tag="pass$pass-nice$n-part$part"
      KILN_POOL_NICE=$n timeout 200 $D/bench_tuning_speed suite --default-only --part "$part/2" \
        --cache-root "$(mktemp -d)" --json "$OUT/$tag.json" --reports "$OUT/$tag.jsonl" > "$OUT/$tag.log" 2>&1
      python3 bench/tuning/nice_row.py "$OUT/$tag.json" "$OUT/$tag.jsonl" "$tag"
    done
  done
done
