#!/usr/bin/env bash
# Runs kiln's test programs on the GPU machine. Here: build, then pack them (scripts/pack_device.sh), e.g.
#   bash scripts/pack_device.sh device build/bin/test_* build/bin/templates_*_test build/bin/kiln \
#       build/bin/kiln-compile-worker build/bin/kiln-bench-worker build/bin/kiln_cache_worker ...
# and there, carrying .device-tar: `tar xJf .device-tar/pack.txz && bash scripts/device_tests.sh .device [filter]`.
# Each program's log goes to $OUT/tests/<program>.log; the summary lists every failed or crashed program.
source "$(dirname "$0")/../bench/support/device_env.sh" "${1:-.device}"
filter=${2:-*}
mkdir -p "$OUT/tests"
# Some tests run kiln's programs, or read fixtures, by the paths they were configured with here
# (/work/main/build/bin, /work/main/tests/...): give them those paths.
root=${KILN_BUILT_ROOT:-/work/main}
if [[ ! -e $root ]] && mkdir -p "$(dirname "$root")" 2>/dev/null; then ln -s "$PWD" "$root"; fi
if [[ ! -e $root/build/bin ]]; then mkdir -p "$root/build" && ln -s "$PWD/$D" "$root/build/bin"; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/tests/device.txt" 2>&1
cat "$OUT/tests/device.txt"
failed=()
for t in "$D"/test_* "$D"/templates_*_test; do
  [[ -x $t ]] || continue
  name=$(basename "$t")
  env=()
  case $name in
    test_isolation_fake_worker|test_isolation_worker) continue ;;  # workers the isolation tests start
    test_jit_no_driver) env=(KILN_CUDA_DRIVER=/nonexistent/libcuda.so.1) ;;  # as its ctest entry sets it
  esac
  start=$(date +%s%N)
  env "${env[@]}" timeout "${KILN_TEST_TIMEOUT:-150}" "$t" --gtest_filter="$filter" > "$OUT/tests/$name.log" 2>&1
  rc=$?
  # A program that ran out of time: name the test it was in.
  ((rc == 124)) && echo "  timed out in: $(grep -E '^\[ RUN      \]' "$OUT/tests/$name.log" | tail -1)"
  printf '%-34s rc=%-3s %6d ms  %s\n' "$name" "$rc" $(( ($(date +%s%N) - start) / 1000000 )) \
    "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/tests/$name.log" | tr '\n' ' ')"
  ((rc == 0)) || failed+=("$name")
done
tar czf "$OUT/test-logs.tgz" -C "$OUT" tests && rm -rf "$OUT/tests"/*.log
if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}"
  for f in "${failed[@]}"; do echo "== $f"; tar xzf "$OUT/test-logs.tgz" -O "tests/$f.log" | grep -E -A3 "FAILED|Failure" | head -30; done
  exit 1
fi
echo "all test programs passed"
