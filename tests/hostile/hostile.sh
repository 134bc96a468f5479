#!/usr/bin/env bash
# The hostile-input suite: drives the kiln CLI through each class of bad input (docs/reliability.md) and
# checks that kiln answers with a non-zero exit status (never a signal), a message that names the input at
# fault, and a cache that still opens and verifies afterwards.
#
#   hostile.sh KILN CASE     runs one case (ctest runs each as its own test); exit 77 = skipped
set -uo pipefail
KILN=$1
CASE=$2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kiln-hostile.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
CACHE=$WORK/cache
export KILN_CACHE_DIR=$CACHE
export KILN_COMPILE_WORKERS=${KILN_COMPILE_WORKERS:-2}
unset KILN_COMPILE_WORKER KILN_TUNE_MODE KILN_ALLOW_OUTSIDE_INCLUDES

fail() { echo "FAIL [$CASE]: $*" >&2; exit 1; }

# run EXPECT_RC REGEX -- args...: runs kiln, checks the exit status ("nonzero" or a number), that no signal
# ended it, and that its stdout+stderr match REGEX (extended). The output is in $OUT.
run() {
  local want=$1 regex=$2
  shift 3
  OUT=$("$KILN" "$@" 2>&1)
  local rc=$?
  echo "\$ kiln $* -> $rc"
  echo "$OUT" | head -20
  ((rc >= 128)) && fail "kiln $* ended by signal $((rc - 128))"
  if [[ $want == nonzero ]]; then
    ((rc != 0)) || fail "kiln $* exited 0"
  elif ((rc != want)); then
    fail "kiln $* exited $rc, expected $want"
  fi
  [[ -z $regex ]] || grep -Eq -- "$regex" <<<"$OUT" || fail "kiln $* did not say /$regex/"
}

# The cache survives every case: it opens, and verifies where this kiln can verify.
cache_still_good() {
  [[ -d $CACHE ]] || return 0
  if "$KILN" cache verify --help >/dev/null 2>&1; then
    run 0 "" -- cache verify --cache-dir "$CACHE"
  else
    run 0 "decisions" -- cache stats --cache-dir "$CACHE"
  fi
}

has_gpu() { "$KILN" version --json 2>/dev/null | grep -q '"arch"'; }

small_workload() {
  echo '{"name": "tiny", "problems": [{"op": "rmsnorm", "rows": [1, 16], "cols": 1024}]}' >"$WORK/tiny.json"
}

case $CASE in
  bundle_wrong_types)
    # Fields of the wrong type at the top of a bundle were an uncaught nlohmann exception: SIGABRT.
    echo '{"format": 5, "version": 1}' >"$WORK/b1.json"
    run nonzero "b1.json.*not a kiln cache bundle" -- cache import "$WORK/b1.json"
    echo '{"format": "kiln-cache-bundle", "version": "1"}' >"$WORK/b2.json"
    run nonzero "b2.json.*version" -- cache import "$WORK/b2.json"
    echo '{"format": "kiln-cache-bundle", "version": 1, "decisions": {"a": 1}}' >"$WORK/b3.json"
    run nonzero "b3.json.*decisions.*not a list" -- cache import "$WORK/b3.json"
    echo '[1, 2, 3]' >"$WORK/b4.json"
    run nonzero "b4.json" -- cache import "$WORK/b4.json"
    # Entries of the wrong types and ranges are rejected one by one, each named.
    cat >"$WORK/b5.json" <<'J'
{"format": "kiln-cache-bundle", "version": 1,
 "decisions": [{"problem": 5, "choice": [], "median_us": "fast", "decided_at_ns": 1.5, "toolchain": 3, "xxh3": null},
               {"problem": "x", "choice": "y", "params": [[1, 2]], "median_us": -1, "decided_at_ns": 18446744073709551615,
                "toolchain": {"nvrtc": 12, "driver": "d", "kiln": 1}, "xxh3": "0"}, 7, null],
 "timings": [{"problem": "p", "choice": "c", "ok": "yes", "samples": -4, "error": 99999999999}],
 "binaries": [{"key": "zz", "cubin_base64": "!!!!", "nvrtc": "x"}, {"key": 5}]}
J
    run 1 "rejected [0-9]+ entries" -- cache import "$WORK/b5.json"
    cache_still_good
    ;;
  bundle_unbounded)
    # /dev/zero never ends: the read stops at the limit and names the file and the limit.
    KILN_MAX_BUNDLE_BYTES=1M run nonzero "/dev/zero.*larger than 1048576 bytes.*KILN_MAX_BUNDLE_BYTES" -- cache import /dev/zero
    head -c 2000000 /dev/zero | tr '\0' ' ' >"$WORK/big.json"
    KILN_MAX_BUNDLE_BYTES=1M run nonzero "big.json.*larger than" -- cache import "$WORK/big.json"
    KILN_MAX_BUNDLE_BYTES=-3 run nonzero "KILN_MAX_BUNDLE_BYTES='-3'" -- cache import "$WORK/big.json"
    run nonzero "no-such.json" -- cache import "$WORK/no-such.json"
    run nonzero "is a directory" -- cache import "$WORK"
    cache_still_good
    ;;
  workload_unbounded)
    run 2 "/dev/zero.*larger than 16777216 bytes.*KILN_MAX_WORKLOAD_BYTES" -- precompile --workload /dev/zero
    KILN_MAX_WORKLOAD_BYTES=64K run 2 "/dev/zero.*larger than 65536" -- tune --workload /dev/zero
    # A few lists that expand to a million problems are refused before anything is expanded.
    python3 -c 'import json; print(json.dumps({"problems": [{"op": "gemm", "m": list(range(1, 1001)), "n": list(range(1, 1001)), "k": 64}]}))' >"$WORK/million.json"
    run 2 "expands to 1000000 problems.*limit of 100000.*KILN_MAX_WORKLOAD_PROBLEMS.*million.json" -- precompile --workload "$WORK/million.json"
    KILN_MAX_WORKLOAD_PROBLEMS=10 run 2 "expands to 12 problems" -- precompile --workload <(echo '{"problems": [{"op": "softmax", "rows": [1,2,3], "cols": [8,16,32,64]}]}')
    cache_still_good
    ;;
  workload_wrong_types)
    # A line each: a workload's body | what its refusal says, before the file's name.
    while IFS='|' read -r -u 3 body says; do
      echo "$body" >"$WORK/w.json"
      run 2 "$says.*w.json" -- precompile --workload "$WORK/w.json"
    done 3<<'T'
{"problems": [{"op": "gemm", "m": "16", "n": 64, "k": 64}]}|entry 0.*"m"
{"problems": [{"op": "gemm", "m": 16, "n": 64, "k": 64, "epilogue": 5}]}|"epilogue" must be a string
{"problems": [{"op": "rmsnorm", "rows": 16, "cols": 64, "residual": 3}]}|"residual" must be true or false
{"problems": [{"op": "rmsnorm", "rows": 16, "cols": 64, "eps": "tiny"}]}|"eps" must be a number
{"problems": [{"op": "rmsnorm", "rows": 16, "cols": 64, "eps": -1}]}|"eps" is -1
{"problems": [{"op": "softmax", "rows": 16, "cols": 64, "scale": 1e300}]}|"scale"
{"problems": [{"op": 7}]}|"op"
{"problems": {"op": "gemm"}}|problems
{"problems": [|not JSON
T
    cache_still_good
    ;;
  huge_and_negative_numbers)
    echo '{"problems": [{"op": "gemm", "m": -5, "n": 64, "k": 64}]}' >"$WORK/neg.json"
    run 2 '"m" has -5.*neg.json' -- precompile --workload "$WORK/neg.json"
    echo '{"problems": [{"op": "gemm", "m": 99999999999999999999, "n": 64, "k": 64}]}' >"$WORK/huge.json"
    run 2 '"m".*huge.json' -- precompile --workload "$WORK/huge.json"
    echo '{"problems": [{"op": "gemm", "m": 2000000000, "n": 2000000000, "k": 64}]}' >"$WORK/big.json"
    run 2 'larger than the limit.*big.json' -- precompile --workload "$WORK/big.json"
    small_workload
    run nonzero "--configs.*-5" -- precompile --workload "$WORK/tiny.json" --configs -5
    run nonzero "--configs" -- precompile --workload "$WORK/tiny.json" --configs 99999999999999
    run nonzero "--configs" -- tune --workload "$WORK/tiny.json" --configs 0
    run nonzero "--top" -- tune --workload "$WORK/tiny.json" --top -1
    run nonzero "--device" -- tune --workload "$WORK/tiny.json" --device -1
    run nonzero "--threads" -- warmup --threads 100000
    run 2 "bm=-5 is out of range" -- templates render gemm_mma_sm80 bm=-5
    run 2 "bm=999999999999 is out of range" -- templates render gemm_mma_sm80 bm=999999999999
    run 2 "99999999999999999999999.*stages" -- templates render gemm_mma_sm80 stages=99999999999999999999999
    run nonzero "--sample" -- templates check --sample 0
    cache_still_good
    ;;
  empty_cache_dir)
    run nonzero "--cache-dir: is empty" -- cache stats --cache-dir ''
    small_workload
    run nonzero "--cache-dir: is empty" -- precompile --workload "$WORK/tiny.json" --cache-dir ''
    ;;
  typo_commands)
    run 2 "unknown command 'cahce'; did you mean 'kiln cache'" -- cahce stats
    run 2 "kiln cache: unknown command 'stast'; did you mean 'kiln cache stats'" -- cache stast
    run 2 "unknown command 'templtes'.*'kiln templates'" -- templtes list
    run 2 "unknown command 'zzzzzzzz' \(commands:" -- zzzzzzzz
    ;;
  outside_includes)
    mkdir -p "$WORK/src" "$WORK/secret"
    echo 'constexpr int kiln_secret_value = 424242;' >"$WORK/secret/secret.h"
    # refused NAME LINE REGEX: a kernel src/NAME.cu that starts with LINE (backslash escapes as printf's) does
    # not compile, and says REGEX.
    refused() {
      printf '%b\nextern "C" __global__ void k() {}\n' "$2" >"$WORK/src/$1.cu"
      run 1 "$3" -- compile "$WORK/src/$1.cu" --arch sm_80
    }
    refused abs "#include \"$WORK/secret/secret.h\"" "abs.cu|'abs'.*outside the include folders"
    grep -q 424242 <<<"$OUT" && fail "the log shows the content of a file outside the include folders"
    refused dotdot '#include "../secret/secret.h"' "outside the include folders"
    ln -s "$WORK/secret/secret.h" "$WORK/src/link.h"
    refused link '#include "link.h"' "link.h.*outside the include folders"
    refused computed '#define F "../secret/secret.h"\n#include F' "computed include"
    refused spliced '#inc\\\nlude "../secret/secret.h"' "outside the include folders"
    # Opted in, the absolute include compiles, and its content is in the key.
    run 0 "key " -- compile "$WORK/src/abs.cu" --arch sm_80 --allow-outside-includes
    key1=$(grep -E '^key ' <<<"$OUT")
    echo 'constexpr int kiln_secret_value = 7;' >"$WORK/secret/secret.h"
    run 0 "key " -- compile "$WORK/src/abs.cu" --arch sm_80 --allow-outside-includes
    key2=$(grep -E '^key ' <<<"$OUT")
    [[ $key1 != "$key2" ]] || fail "the key ignores the content of an absolute include ($key1)"
    ;;
  macro_bomb_timeout)
    # Each level expands its argument twice (the argument is expanded before it is substituted): 2^40
    # expansions whose result is one token, so the bomb burns time, not memory. The timeout ends it.
    {
      echo '#define L0(x) x'
      for i in $(seq 1 40); do echo "#define L$i(x) L$((i - 1))(L$((i - 1))(x))"; done
      echo 'extern "C" __global__ void k(int* p) { p[0] = L40(1); }'
    } >"$WORK/bomb.cu"
    KILN_COMPILE_TIMEOUT=3 run 1 "bomb.*timed out after 3 s" -- compile "$WORK/bomb.cu" --arch sm_80 --worker
    ;;
  bogus_worker)
    small_workload
    KILN_COMPILE_WORKER=$WORK/no-such-worker run 1 "no-such-worker" -- precompile --workload "$WORK/tiny.json"
    printf '#!/bin/sh\nexit 3\n' >"$WORK/exits.sh"
    chmod +x "$WORK/exits.sh"
    KILN_COMPILE_WORKER=$WORK/exits.sh run 1 "exits.sh' is not a kiln compile worker.*exited with status 3" -- precompile --workload "$WORK/tiny.json"
    printf '#!/bin/sh\nprintf "HTTP/1.1 200 OK and more bytes than a header" >&3\nsleep 600\n' >"$WORK/talks.sh"
    chmod +x "$WORK/talks.sh"
    start=$SECONDS
    KILN_COMPILE_WORKER=$WORK/talks.sh run 1 "talks.sh' is not a kiln compile worker.*malformed" -- precompile --workload "$WORK/tiny.json"
    ((SECONDS - start < 60)) || fail "a worker that talks nonsense held kiln for $((SECONDS - start)) s"
    cache_still_good
    ;;
  strict_missing_decision)
    small_workload
    run 1 "strict" -- tune --workload "$WORK/tiny.json" --mode strict
    KILN_TUNE_MODE=strict run 1 "strict" -- tune --workload "$WORK/tiny.json"
    cache_still_good
    ;;
  report_without_gpu)
    has_gpu && { echo "a GPU is here: the report measures"; exit 77; }
    small_workload
    run 0 "nothing (is )?measured" -- tune --workload "$WORK/tiny.json" --configs 1 --report "$WORK/report.json"
    grep -q '"measured": false' "$WORK/report.json" || fail "the report does not say nothing was measured"
    cache_still_good
    ;;
  honest_counts)
    small_workload
    run 0 "0 already in the cache" -- precompile --workload "$WORK/tiny.json" --configs 2
    distinct=$(grep -Eo '[0-9]+ distinct:' <<<"$OUT" | grep -Eo '[0-9]+')
    run 0 "0 compiled now, $distinct already in the cache" -- precompile --workload "$WORK/tiny.json" --configs 2
    run 0 "no decisions in .*$distinct binaries" -- cache ls
    run 0 '"kind": "binary"' -- cache ls --kind binaries --json
    run 0 "\"binaries\": $distinct" -- cache stats --json
    run 0 '"template"' -- templates list --arch sm_80 --json  # (every arch walks the ~1M wgmma grid: minutes under ASan)
    run 0 '"nvrtc"' -- version --json
    cache_still_good
    ;;
  failed_writes)
    # Cache writes that fail: no file may grow past 64 KiB (ulimit -f, with SIGXFSZ ignored, so a write past it
    # fails with EFBIG as one on a full disk fails with ENOSPC; deterministic, no mount needed). precompile and
    # tune (tune precompiles without a GPU) logged the failed writes, claimed the binaries and exited 0.
    small_workload
    (
      trap '' XFSZ
      ulimit -f 64
      run 1 "the cache '$CACHE' could not store all of this run's results.*File too large" -- \
        precompile --workload "$WORK/tiny.json" --configs 8
      grep -q "compiled now (not all stored)" <<<"$OUT" || fail "precompile's summary claims its binaries stored"
      if ! has_gpu; then
        rm -rf "$CACHE"
        run 1 "the cache '$CACHE' could not store all of this run's results.*File too large" -- \
          tune --workload "$WORK/tiny.json" --configs 8 --report "$WORK/report.json"
        grep -q '"stored": false' "$WORK/report.json" || fail "tune's report does not say its results were not stored"
      fi
    ) || exit 1
    # With room again, what was stored is intact and the rest is compiled and stored now.
    cache_still_good
    run 0 "0 failed" -- precompile --workload "$WORK/tiny.json" --configs 8
    ;;
  *)
    fail "no case '$CASE'"
    ;;
esac
echo "PASS [$CASE]"
