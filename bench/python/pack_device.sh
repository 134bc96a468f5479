#!/usr/bin/env bash
# Packs what bench/python/device_run.sh needs on the GPU machine into .device-py-tar/pack.txz (under the run
# tool's 64 MiB carry limit): kiln installed (stripped: libkiln.so, headers, CMake package, CLI, workers),
# the libraries the GPU image lacks, and bench_runtime for the C++ dispatch figure.
#   bash bench/python/pack_device.sh [BUILD_DIR]       (a KILN_SHARED=ON build; default build)
# then carry [".device-py-tar"] and run `bash bench/python/device_run.sh MODE` there.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
pack=${KILN_DEVICE_PACK:-../shared/tools/device-pack}
rm -rf .device-py .device-py-tar
cmake --install "$build" --prefix .device-py/prefix --strip >/dev/null
[ -f .device-py/prefix/lib/libkiln.so ] || { echo "no libkiln.so: build with -DKILN_SHARED=ON" >&2; exit 1; }
exes=(.device-py/prefix/lib/libkiln.so .device-py/prefix/bin/kiln .device-py/prefix/bin/kiln-compile-worker
      .device-py/prefix/bin/kiln-bench-worker)
[ -x "$build/bin/bench_runtime" ] && exes+=("$build/bin/bench_runtime")
"$pack" .device-py "${exes[@]}"
rm -f .device-py/libkiln.so .device-py/kiln .device-py/kiln-*-worker  # copies of what the prefix has
strip --strip-all .device-py/bench_runtime 2>/dev/null || true
strip --strip-unneeded .device-py/lib/* 2>/dev/null || true
mkdir -p .device-py-tar
tar cJf .device-py-tar/pack.txz .device-py
rm -rf .device-py
ls -la .device-py-tar/pack.txz
