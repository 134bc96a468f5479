#!/usr/bin/env bash
# The fleet recipe end to end with real processes: three `kiln precompile --shard i/3` build machines publish
# into one redis-server, key for key what one unsharded precompile publishes; a GPU machine (another process)
# pulls it all; a dead Redis makes push and precompile fail honestly while the local cache keeps everything.
# Usage: remote_fleet.sh KILN REDIS_SERVER
set -euo pipefail
kiln=$1
redis_server=${2:-}
[[ -x $redis_server ]] || redis_server=$(command -v redis-server || true)
if [[ -z $redis_server ]]; then
  [[ ${KILN_ALLOW_NO_REDIS:-} == 1 ]] && { echo "SKIP: no redis-server"; exit 0; }
  echo "FAIL: no redis-server (setup.sh installs it; KILN_ALLOW_NO_REDIS=1 skips)"; exit 1
fi
tmp=$(mktemp -d /tmp/kiln-fleet-XXXXXX)
redis_pid=
cleanup() {
  [[ -n $redis_pid ]] && kill -CONT "$redis_pid" 2>/dev/null && kill -KILL "$redis_pid" 2>/dev/null
  [[ -n $redis_pid ]] && wait "$redis_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# TCP off: a unix socket in the temp dir, so no port can collide.
"$redis_server" --port 0 --unixsocket "$tmp/redis.sock" --unixsocketperm 700 --dir "$tmp" --save "" \
  --appendonly no --logfile "$tmp/redis.log" &
redis_pid=$!
for _ in $(seq 1 2000); do  # its start, polled against a 20 s deadline
  [[ -S $tmp/redis.sock ]] && break
  kill -0 "$redis_pid" 2>/dev/null || fail "redis-server exited at start: $(cat "$tmp/redis.log")"
  sleep 0.01
done
[[ -S $tmp/redis.sock ]] || fail "redis-server did not start"

openssl rand -hex 32 > "$tmp/fleet.key" && chmod 600 "$tmp/fleet.key"
export KILN_CACHE_KEY_FILE=$tmp/fleet.key
url="unix://$tmp/redis.sock"
cat > "$tmp/w.json" <<'JSON'
{"name": "tiny", "problems": [
  {"op": "rmsnorm", "name": "norm", "rows": [16], "cols": 1024, "dtype": "bf16", "residual": false, "eps": 1e-5},
  {"op": "softmax", "name": "sm", "rows": [16], "cols": 1024, "dtype": "f32"}]}
JSON

# One unsharded build into database 1 (compiles every kernel once).
"$kiln" precompile --workload "$tmp/w.json" --arch sm_90 --configs 3 --cache-dir "$tmp/all" \
  --remote "$url?db=1" > "$tmp/all.out" 2>&1 || { cat "$tmp/all.out"; fail "unsharded precompile"; }
# Three build machines into database 0. Each starts from a copy of that build's cache, so they compile
# nothing: what they publish is what their shard selects.
for i in 0 1 2; do
  cp -r "$tmp/all" "$tmp/shard$i"
  "$kiln" precompile --workload "$tmp/w.json" --arch sm_90 --configs 3 --cache-dir "$tmp/shard$i" \
    --shard "$i/3" --remote "$url" > "$tmp/shard$i.out" 2>&1 || { cat "$tmp/shard$i.out"; fail "shard $i/3"; }
done
keys() { redis-cli -s "$tmp/redis.sock" -n "$1" --scan --pattern 'kiln:f*:bin:*' | sort; }
keys 1 > "$tmp/unsharded.keys"
keys 0 > "$tmp/sharded.keys"
n=$(wc -l < "$tmp/unsharded.keys")
(( n > 0 )) || fail "the unsharded precompile published nothing"
cmp -s "$tmp/unsharded.keys" "$tmp/sharded.keys" || { diff "$tmp/unsharded.keys" "$tmp/sharded.keys"; fail "3 shards differ from unsharded"; }
total=0
for i in 0 1 2; do
  c=$(sed -n 's/^published \([0-9]*\) binaries.*/\1/p' "$tmp/shard$i.out")
  total=$((total + c))
done
(( total == n )) || fail "the shards published $total binaries, the unsharded build $n: not disjoint"
echo "ok: 3 shards published the same $n binaries as one unsharded precompile, disjointly"

# A GPU machine, another process, pulls everything and has it locally.
"$kiln" cache pull --remote "$url" --cache-dir "$tmp/gpu" > "$tmp/pull.out" 2>&1 || { cat "$tmp/pull.out"; fail "pull"; }
grep -q "pulled from .*: 0 decisions, 0 timings, $n binaries" "$tmp/pull.out" || { cat "$tmp/pull.out"; fail "pull count"; }
"$kiln" cache stats --cache-dir "$tmp/gpu" --remote "$url" --json > "$tmp/stats.json" || fail "stats"
python3 - "$tmp/stats.json" "$n" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); n = int(sys.argv[2])
assert s["binaries"] == n, s
assert s["remote"]["reachable"] and s["remote"]["binaries"] == n, s["remote"]
PY
# Without the key, the same pull refuses the binaries (and says so).
if KILN_CACHE_KEY_FILE= "$kiln" cache pull --remote "$url" --cache-dir "$tmp/nokey" > "$tmp/nokey.out" 2>&1; then
  grep -q ", 0 binaries" "$tmp/nokey.out" || { cat "$tmp/nokey.out"; fail "binaries pulled without a key"; }
fi
echo "ok: another process pulled all $n binaries; without the key none"

# Redis dies: push fails with exit 1 and a message; the local cache is untouched.
kill -KILL "$redis_pid"; wait "$redis_pid" 2>/dev/null || true; redis_pid=
if "$kiln" cache push --remote "$url" --cache-dir "$tmp/gpu" > "$tmp/dead.out" 2>&1; then fail "push to a dead redis succeeded"; fi
grep -q "cannot connect" "$tmp/dead.out" || { cat "$tmp/dead.out"; fail "push's message"; }
"$kiln" cache stats --cache-dir "$tmp/gpu" --json > "$tmp/after.json"
python3 -c "import json,sys; s=json.load(open('$tmp/after.json')); assert s['binaries']==$n, s"
# precompile with a dead remote: every kernel still in the local cache, exit 1 with the reason.
if "$kiln" precompile --workload "$tmp/w.json" --arch sm_90 --configs 3 --cache-dir "$tmp/gpu" --remote "$url" \
   > "$tmp/pre-dead.out" 2>&1; then fail "precompile with a dead remote said success"; fi
grep -q "publishing to the remote cache failed" "$tmp/pre-dead.out" || { cat "$tmp/pre-dead.out"; fail "precompile's message"; }
grep -q "0 failed" "$tmp/pre-dead.out" || { cat "$tmp/pre-dead.out"; fail "precompile lost kernels"; }
echo "ok: a dead redis fails push and precompile honestly, nothing local lost"
