#!/usr/bin/env bash
# Installs what kiln needs to build and test on Debian 12 / Ubuntu 22.04+, if it is missing.
# The CUDA toolkit (12.8 or newer) must already be installed; no GPU or driver is needed to build.
set -euo pipefail

packages=(build-essential cmake pkg-config libtbb-dev librocksdb-dev libxxhash-dev libgtest-dev libgmock-dev
          libbenchmark-dev libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev libssl-dev python3
          libhiredis-dev redis-server  # the fleet tier's client, and the Redis its tests start
          clang  # clang (14 on Debian 12) with libFuzzer: scripts/fuzz.sh, run by CI
          xz-utils)  # reads the recorded tuning reports (bench_calibration_replay's test)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

cuda_root=${CUDAToolkit_ROOT:-${CUDA_HOME:-/usr/local/cuda}}
if [[ ! -f $cuda_root/include/nvrtc.h ]]; then
  cat >&2 <<MSG
setup: no CUDA toolkit at $cuda_root (nvrtc.h not found).
kiln needs the CUDA toolkit 12.8 or newer (NVRTC, cuBLAS, NCCL headers and libraries); no GPU or driver is
needed to build. Install it from https://developer.nvidia.com/cuda-downloads (the 'cuda-toolkit' package),
or set CUDA_HOME to where it is installed, and run this again.
MSG
  exit 1
fi
