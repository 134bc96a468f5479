#!/usr/bin/env bash
# bench_text_pages on the GPU machine: NVRTC's code on small pages, on huge pages per process, and on huge pages
# shared through fork, each at 1 and 16 processes, TEXT_AB_PASSES times (default 2) in turn.
#   here:  bash scripts/pack_device.sh device-ts build/bin/bench_text_pages ...
#   there: tar xJf .device-ts-tar/pack.txz && bash bench/pool/text_pages_ab.sh .device-ts
# One JSON per run under $OUT/text-pages/PASS-MODE-PROCS.json; a table of kernels/s and efficiency on stdout.
set -u
source "$(dirname "$0")/../support/device_env.sh" "${1:-.device-ts}"
dir=$OUT/text-pages
mkdir -p "$dir"
$D/bench_text_pages --mode small --procs 1 --per-proc 2 > "$dir/warm-up.txt" 2>&1
for pass in $(seq 1 "${TEXT_AB_PASSES:-2}"); do
  for mode in small private shared; do
    for procs in 1 16; do
      timeout 60 $D/bench_text_pages --mode $mode --procs $procs --per-proc ${TEXT_AB_PER_PROC:-6} \
        --json "$dir/$pass-$mode-$procs.json" > "$dir/$pass-$mode-$procs.txt" 2>&1 || echo "$pass $mode $procs: rc=$?"
    done
  done
done
python3 - "$dir" <<'PY'
import json, sys, glob, os
d = sys.argv[1]
runs = {}
for f in glob.glob(os.path.join(d, "*-*-*.json")):
    p, mode, procs = os.path.basename(f)[:-5].split("-")
    runs[(int(p), mode, int(procs))] = json.load(open(f))
print(f"{'pass':<5} {'mode':<8} {'1p job s':>9} {'1p k/s':>7} {'16p job s':>10} {'16p k/s':>8} {'eff':>7}")
for (p, mode, procs), r in sorted(runs.items()):
    if procs != 16 or (p, mode, 1) not in runs:
        continue
    one = runs[(p, mode, 1)]
    eff = r["kernels_per_second"] / (16 * one["kernels_per_second"])
    print(f"{p:<5} {mode:<8} {one['job_seconds']['median']:9.3f} {one['kernels_per_second']:7.2f} "
          f"{r['job_seconds']['median']:10.3f} {r['kernels_per_second']:8.2f} {eff:7.1%}")
PY
