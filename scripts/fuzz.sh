#!/usr/bin/env bash
# Builds kiln's libFuzzer targets (fuzz/) with clang, -fsanitize=fuzzer,address,undefined, then
#  1. replays, for every target, its seed corpus (fuzz/corpus/<target>/) and every past crash
#     (fuzz/crashes/<target>/) once each, as a regression test;
#  2. fuzzes every target for KILN_FUZZ_SECONDS (default 60), up to KILN_FUZZ_JOBS targets at a time (default:
#     the number of cores), starting from its seeds and, for the binary decoders, seeds freshly encoded by
#     this build (fuzz_make_seeds).
# Exits non-zero on any crash, leak, sanitizer report or failed check; a new crash is left in
# fuzz/crashes/<target>/ to be committed with its fix.
# Usage: scripts/fuzz.sh [BUILD_DIR]   (KILN_FUZZ_SECONDS=60, KILN_FUZZ_JOBS=$(nproc),
#        KILN_FUZZ_TARGETS="workload bundle ...", KILN_FUZZ_CMAKE_ARGS="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${1:-build-fuzz}
seconds=${KILN_FUZZ_SECONDS:-60}
jobs=${KILN_FUZZ_JOBS:-$(nproc)}
all_targets="workload bundle template_params cli cache_value pool_wire isolation_wire codec"
targets=${KILN_FUZZ_TARGETS:-$all_targets}
command -v clang++ >/dev/null || { echo "scripts/fuzz.sh: clang++ is missing (apt-get install clang)" >&2; exit 1; }
cuda_root=${CUDAToolkit_ROOT:-${CUDA_HOME:-/usr/local/cuda}}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
start=$(date +%s)
cmake -S fuzz -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DCUDAToolkit_ROOT="$cuda_root" ${KILN_FUZZ_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$(nproc)" --target fuzz_make_seeds $(for t in $targets; do printf 'fuzz_%s ' "$t"; done)
echo "== fuzz targets built in $(( $(date +%s) - start )) s"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1
export LSAN_OPTIONS=suppressions=$root/.ci/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Seeds encoded by this build: the committed ones may predate a format change.
"$build/bin/fuzz_make_seeds" "$work/fresh"

# 1. Regression: every seed and every past crash, once each.
for t in $targets; do
  mapfile -t inputs < <(find "$root/fuzz/corpus/$t" "$root/fuzz/crashes/$t" -type f ! -name .keep 2>/dev/null | sort)
  echo "== fuzz_$t: replaying ${#inputs[@]} seeds and past crashes"
  if ! "$build/bin/fuzz_$t" -close_fd_mask=3 -rss_limit_mb=4096 ${inputs[@]+"${inputs[@]}"} >"$work/$t.replay" 2>&1; then
    tail -n 60 "$work/$t.replay" >&2
    echo "scripts/fuzz.sh: fuzz_$t fails on a committed seed or past crash (above)" >&2
    exit 1
  fi
done
((seconds > 0)) || { echo "== fuzz regression passed: $targets (KILN_FUZZ_SECONDS=0: no fuzzing)"; exit 0; }

# 2. Fuzzing, KILN_FUZZ_JOBS targets at a time; each one's log is printed when it ends.
fuzz_one() {
  local t=$1 corpus=$work/corpus-$1
  mkdir -p "$corpus" "$root/fuzz/crashes/$t"
  cp -r "$root/fuzz/corpus/$t/." "$corpus/"
  [[ -d $work/fresh/$t ]] && cp -r "$work/fresh/$t/." "$corpus/"
  "$build/bin/fuzz_$t" -close_fd_mask=3 -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$root/fuzz/crashes/$t/" "$corpus" >"$work/$t.log" 2>&1
}
declare -A pid_of
failed=()
finish() {  # waits for target $1 and reports it
  local t=$1 rc=0
  wait "${pid_of[$t]}" || rc=$?
  if ((rc != 0)); then
    tail -n 60 "$work/$t.log" >&2
    echo "scripts/fuzz.sh: fuzz_$t failed (exit $rc); its input is in fuzz/crashes/$t/" >&2
    failed+=("$t")
  else
    echo "== fuzz_$t: $(grep -m1 -o 'stat::number_of_executed_units: [0-9]*' "$work/$t.log" | awk '{print $2}') runs in $seconds s, no crash"
  fi
}
running=()
for t in $targets; do
  if ((${#running[@]} >= jobs)); then
    finish "${running[0]}"
    running=("${running[@]:1}")
  fi
  echo "== fuzz_$t: fuzzing for $seconds s"
  fuzz_one "$t" &
  pid_of[$t]=$!
  running+=("$t")
done
for t in "${running[@]}"; do finish "$t"; done
if ((${#failed[@]})); then
  echo "scripts/fuzz.sh: crashes in ${failed[*]}" >&2
  exit 1
fi
echo "== fuzzing passed: $targets, $seconds s each, in $(( $(date +%s) - start )) s with the build"
