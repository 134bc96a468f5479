#!/usr/bin/env bash
# Installs what is missing, builds kiln and runs the whole test suite.
# Usage: scripts/test.sh [BUILD_DIR] [extra cmake arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${1:-build}
bash scripts/build.sh "$@"
(cd "$build" && ctest --output-on-failure -j "$(nproc)" --timeout 900)
# The Python package and its pytest suite (scripts/test_python.sh); KILN_PYTHON_TESTS=0 skips them.
if [ "${KILN_PYTHON_TESTS:-1}" != 0 ]; then
  bash scripts/test_python.sh "$build"
fi
