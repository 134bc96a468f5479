#!/usr/bin/env bash
# The process pool's 16-worker efficiency under other allocators in the compile worker, A/B on the GPU machine's
# 16 cores: each configuration runs `kiln-bench pool` (1 and 16 workers, in order and longest-first, PCH on) in turn, the
# whole set MALLOC_AB_PASSES times, so a drift of the machine meets every configuration alike.
#   here:  bash scripts/pack_device.sh device-pool build/bin/kiln-bench build/bin/kiln-compile-worker
#          bash bench/pool/malloc_ab.sh --add-libs .device-pool-tar   (adds the Debian allocators to the pack)
#   there: tar xJf .device-pool-tar/pack.txz && bash bench/pool/malloc_ab.sh .device-pool
# The workers inherit the bench's environment (the pool passes it on), so LD_PRELOAD puts the allocator into
# every worker; "glibc" is the pool's own default (its GLIBC_TUNABLES, malloc on transparent huge pages).
# One JSON per run under $OUT/malloc-ab/, named PASS-CONFIG.json, and a table on stdout.
set -u
libs=(libjemalloc.so.2 libtcmalloc_minimal.so.4 libmimalloc.so.2)
if [ "${1:-}" = "--add-libs" ]; then
  set -e
  tar_dir=$2
  name=$(basename "$tar_dir" -tar)
  tmp=$(mktemp -d)
  tar xJf "$tar_dir/pack.txz" -C "$tmp"
  mkdir -p "$tmp/$name/malloc"
  for l in "${libs[@]}"; do cp -L "/usr/lib/x86_64-linux-gnu/$l" "$tmp/$name/malloc/"; done
  tar cJf "$tar_dir/pack.txz" -C "$tmp" "$name"
  rm -rf "$tmp"
  ls -la "$tar_dir/pack.txz"
  exit 0
fi
source "$(dirname "$0")/../support/device_env.sh" ${1:-.device-pool}
M=$PWD/$D/malloc
configs=(
  "glibc|"
  "jemalloc|LD_PRELOAD=$M/libjemalloc.so.2 MALLOC_CONF=thp:always,metadata_thp:auto,dirty_decay_ms:-1,muzzy_decay_ms:-1"
  "tcmalloc|LD_PRELOAD=$M/libtcmalloc_minimal.so.4 TCMALLOC_RELEASE_RATE=0"
  "mimalloc|LD_PRELOAD=$M/libmimalloc.so.2 MIMALLOC_LARGE_OS_PAGES=1 MIMALLOC_PURGE_DELAY=-1"
)
[ -n "${MALLOC_AB_ONLY:-}" ] && configs=("${configs[@]:0:$MALLOC_AB_ONLY}")
mkdir -p "$OUT/malloc-ab"
{ nproc; cat /sys/kernel/mm/transparent_hugepage/enabled; } > "$OUT/malloc-ab/machine.txt" 2>&1
# Warm the page cache and NVRTC's files first: the first run of a fresh machine would pay it alone.
$D/kiln-bench pool --executor process --workers 1 --kernels 2 --pch on --rounds 1 --overhead-samples 0 \
  --no-cpu-reference > "$OUT/malloc-ab/warm-up.txt" 2>&1
# Hardware counters of one 1-worker and one 16-worker batch (glibc), where the machine exposes them (a perf
# packed with the programs: `device-pack DIR ... /usr/bin/perf`): cycles per second of CPU time say whether the
# clock drops with 16 busy cores, instructions per cycle whether each compile waits longer on memory.
if [ -x $D/perf ]; then
  for w in 1 16; do
    $D/perf stat -x, -o "$OUT/malloc-ab/perf-$w.csv" -e task-clock,cycles,instructions,cache-references,cache-misses \
      -- $D/kiln-bench pool --executor process --workers $w --per-worker 8 --pch on --rounds 1 --overhead-samples 0 \
      --no-cpu-reference > "$OUT/malloc-ab/perf-$w.txt" 2>&1
    echo "perf, $w worker(s):"; grep -v "^#" "$OUT/malloc-ab/perf-$w.csv" | grep . | cut -d, -f1,3 | tr '\n' ' '; echo
  done
fi
first=1
for pass in $(seq 1 "${MALLOC_AB_PASSES:-2}"); do
  for c in "${configs[@]}"; do
    name=${c%%|*}
    envs=${c#*|}
    json=$OUT/malloc-ab/$pass-$name.json
    env $envs timeout 120 $D/kiln-bench pool --executor process,process-lpt --workers 1,16 --pch on --per-worker ${MALLOC_AB_PER_WORKER:-8} \
      --rounds 1 --overhead-samples 0 --json "$json" > "$OUT/malloc-ab/$pass-$name.txt" 2>&1 || echo "$name rc=$?"
    python3 "$(dirname "$0")/ab_row.py" "$json" "$pass" "$name" $( ((first)) && echo --header) 2>/dev/null \
      || echo "$pass $name: no JSON (see $pass-$name.txt)"
    first=0
  done
done
