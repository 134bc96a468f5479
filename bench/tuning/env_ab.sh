#!/usr/bin/env bash
# The default effort's tune time under settings of its environment, the suite's two parts each, alternating, in
# one call on the GPU machine:
#   tar xJf .device-ts-tar/pack.txz && bash bench/tuning/env_ab.sh PASSES 'LABEL|VAR=VALUE ...' ...
# Each run is `bench_tuning_speed suite --default-only` (no exhaustive reference) on empty caches, tagged
# passP-LABEL-partN; nice_row.py prints one row per run from its JSON and reports.
source "$(dirname "$0")/../support/device_env.sh" "${PACK:-.device-ts}"
passes=$1
shift
for pass in $(seq 1 "$passes"); do
  for c in "$@"; do
    label=${c%%|*}
    envs=${c#*|}
    for part in 0 1; do
      tag="pass$pass-$label-part$part"
      env $envs timeout 200 $D/bench_tuning_speed suite --default-only --part "$part/2" \
        --cache-root "$(mktemp -d)" --json "$OUT/$tag.json" --reports "$OUT/$tag.jsonl" > "$OUT/$tag.log" 2>&1
      python3 bench/tuning/nice_row.py "$OUT/$tag.json" "$OUT/$tag.jsonl" "$tag"
    done
  done
done
