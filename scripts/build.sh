#!/usr/bin/env bash
# Configures and builds kiln. Usage: scripts/build.sh [BUILD_DIR] [extra cmake arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
cuda_root=${CUDAToolkit_ROOT:-${CUDA_HOME:-/usr/local/cuda}}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} \
  -DCUDAToolkit_ROOT="$cuda_root" "$@"
cmake --build "$build" -j "$(nproc)"
