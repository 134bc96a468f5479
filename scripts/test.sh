#!/usr/bin/env bash
# Installs what is missing, builds kiln and runs the whole test suite.
# Usage: scripts/test.sh [BUILD_DIR] [extra cmake arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${1:-build}
bash scripts/build.sh "$@"
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 900
