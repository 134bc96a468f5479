#!/usr/bin/env bash
# Installs what is missing, builds kiln and runs the whole test suite.
# Usage: scripts/test.sh [BUILD_DIR] [extra cmake arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${1:-build}
bash scripts/build.sh "$@"
# KILN_CTEST_EXCLUDE: a regex of tests to leave out (the CI's sanitizer pass uses it; see .ci/run).
(cd "$build" && ctest --output-on-failure -j "$(nproc)" --timeout 900 ${KILN_CTEST_EXCLUDE:+-E "$KILN_CTEST_EXCLUDE"})
# The Python package and its pytest suite (scripts/test_python.sh); KILN_PYTHON_TESTS=0 skips them.
if [ "${KILN_PYTHON_TESTS:-1}" != 0 ]; then
  bash scripts/test_python.sh "$build"
fi
