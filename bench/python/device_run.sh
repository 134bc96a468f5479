#!/usr/bin/env bash
# On the GPU machine: builds kiln's Python extension there (its Python 3.12 differs from the development
# machine's) against the carried kiln, then runs one mode. Results go to $OUT (or ./.device-py/out).
#
# Prepare on the development machine: `bash bench/python/pack_device.sh` (a KILN_SHARED=ON build) and carry
# [".device-py-tar"]. Then, on the GPU machine:
#   bash bench/python/device_run.sh tests|host|mlp|startup|distributed|allreduce|all [ARGS...]
# ARGS go to the bench program (host: --parts; startup: --background --threads N; allreduce: --max-bytes B ...)
# or to pytest (tests, distributed: -k ...). distributed and allreduce need 2+ GPUs (kind nvidia-h100-x2 or
# nvidia-h200-x2): distributed runs kiln.distributed's tests (python/tests/test_distributed.py), allreduce the
# eager all-reduce benchmark (bench/python/allreduce_torch.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
dev=$root/.device-py
mode=${1:-all}
extra=("${@:2}")
if [ ! -d "$dev" ] && [ -f .device-py-tar/pack.txz ]; then tar xJf .device-py-tar/pack.txz; fi
[ -d "$dev/prefix" ] || { echo "no $dev/prefix: run bench/python/pack_device.sh and carry .device-py-tar" >&2; exit 2; }
out=${OUT:-$dev/out}
mkdir -p "$out"
py=${KILN_DEVICE_PYTHON:-/opt/torch/.venv/bin/python}
export LD_LIBRARY_PATH=$dev/lib:$dev/prefix/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=$dev/prefix/bin:$PATH
export KILN_CLI=$dev/prefix/bin/kiln KILN_SOURCE_DIR=$root
export KILN_COMPILE_WORKER=${KILN_COMPILE_WORKER:-$dev/prefix/bin/kiln-compile-worker}
# The GPU machine has no redis-server: its remote-cache tests skip there (CI runs them against a real one).
export KILN_ALLOW_NO_REDIS=${KILN_ALLOW_NO_REDIS:-1}

echo "== building kiln._C with $($py --version) against $dev/prefix"
nanobind_dir=$($py -m nanobind --cmake_dir)
cmake -S python -B "$dev/build-ext" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$py" \
  -Dnanobind_DIR="$nanobind_dir" -DCMAKE_PREFIX_PATH="$dev/prefix" >/dev/null
cmake --build "$dev/build-ext" -j "$(nproc)"
rm -rf "$dev/site" && mkdir -p "$dev/site"
cp -r python/kiln "$dev/site/" && cp "$dev"/build-ext/_C*.so "$dev/site/kiln/"
export PYTHONPATH=$dev/site
$py -c "import kiln; print('kiln', kiln.__version__, 'devices', kiln._C.device_count())"

run_tests() { (cd python/tests && $py -m pytest -q -rs -p no:cacheprovider . "${extra[@]}" 2>&1 | tee "$out/pytest.txt"); }
run_host() { (cd bench/python && $py host_overhead.py --json "$out/python_host_overhead.json" \
  --bench-runtime "$dev/bench_runtime" "${extra[@]}" 2>&1 | tee "$out/host_overhead.txt"); }
run_mlp() { (cd bench/python && $py llama_mlp.py --json "$out/python_llama_mlp.json" 2>&1 | tee "$out/llama_mlp.txt"); }
run_distributed() { (cd python/tests && $py -m pytest -q -rs -p no:cacheprovider test_distributed.py "${extra[@]}" 2>&1 \
  | tee "$out/pytest_distributed.txt"); }
run_allreduce() { (cd bench/python && KILN_COMMIT=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || true) \
  $py allreduce_torch.py --json "$out/python_allreduce.json" "${extra[@]}" 2>&1 | tee "$out/allreduce_torch.txt"); }
run_startup() { (cd bench/python && $py startup.py --json "$out/python_startup.json" "${extra[@]}" 2>&1 | tee "$out/startup.txt"); }
case $mode in
  tests) run_tests ;;
  host) run_host ;;
  mlp) run_mlp ;;
  startup) run_startup ;;
  distributed) run_distributed ;;
  allreduce) run_allreduce ;;
  all) run_tests; run_host; run_startup; run_mlp ;;
  *) echo "usage: $0 tests|host|mlp|startup|distributed|allreduce|all" >&2; exit 2 ;;
esac
