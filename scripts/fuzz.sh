#!/usr/bin/env bash
# Builds kiln's libFuzzer targets (fuzz/) with clang, -fsanitize=fuzzer,address,undefined, then for each target:
# replays its seed corpus (fuzz/corpus/<target>/) and every past crash (fuzz/crashes/<target>/) as a
# regression test, and fuzzes for FUZZ_SECONDS (default 60). Exits non-zero on the first crash, leak or
# sanitizer report; a new crash is left in fuzz/crashes/<target>/ to be committed with its fix.
# Usage: scripts/fuzz.sh [BUILD_DIR]   (FUZZ_SECONDS=60, FUZZ_TARGETS="workload bundle template_params cli")
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${1:-build-fuzz}
seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-"workload bundle template_params cli"}
command -v clang++ >/dev/null || { echo "scripts/fuzz.sh: clang++ is missing (apt-get install clang)" >&2; exit 1; }
cuda_root=${CUDAToolkit_ROOT:-${CUDA_HOME:-/usr/local/cuda}}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S fuzz -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DCUDAToolkit_ROOT="$cuda_root" ${FUZZ_CMAKE_ARGS:-}
cmake --build "$build" -j "$(nproc)" --target $(for t in $targets; do printf 'fuzz_%s ' "$t"; done)

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1
export LSAN_OPTIONS=suppressions=$root/.ci/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for t in $targets; do
  bin=$build/bin/fuzz_$t
  corpus=$root/fuzz/corpus/$t
  crashes=$root/fuzz/crashes/$t
  mkdir -p "$crashes"
  work=$(mktemp -d)
  cp -r "$corpus/." "$work/"
  # Every past crash and the seeds, once each, as a regression test.
  replay=("$corpus"/*)
  mapfile -t past < <(find "$crashes" -type f ! -name .keep)
  echo "== fuzz_$t: replaying ${#replay[@]} seeds and ${#past[@]} past crashes"
  "$bin" -close_fd_mask=3 "${replay[@]}" ${past[@]+"${past[@]}"}
  echo "== fuzz_$t: fuzzing for $seconds s"
  set +e
  "$bin" -close_fd_mask=3 -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -max_len=65536 \
    -artifact_prefix="$crashes/" "$work" 2>&1 | tail -n 25
  rc=${PIPESTATUS[0]}
  set -e
  rm -rf "$work"
  if ((rc != 0)); then
    echo "scripts/fuzz.sh: fuzz_$t failed (exit $rc); the input is in $crashes/" >&2
    exit 1
  fi
done
echo "== fuzzing passed: $targets, $seconds s each"
