#!/usr/bin/env bash
# Builds kiln's Python package (python/) against kiln installed from BUILD_DIR and runs its pytest suite.
# Usage: scripts/test_python.sh [BUILD_DIR]      (a built kiln build folder; default build)
#
# The virtual environment is cached in BUILD_DIR/python-venv, or $KILN_PYTHON_VENV (nanobind, scikit-build-core, pytest, numpy and
# torch from PyPI; KILN_PYTHON_TORCH=0 leaves torch out and its tests skip). kiln is installed into
# BUILD_DIR/python-prefix, the package is built from it with pip and the tests run against what pip installed.
# GPU tests skip without a GPU, saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
start=$(date +%s)
venv=${KILN_PYTHON_VENV:-$PWD/$build/python-venv}
prefix=$PWD/$build/python-prefix
python=${KILN_PYTHON:-python3}

packages=(nanobind scikit-build-core pytest numpy)
[ "${KILN_PYTHON_TORCH:-1}" != 0 ] && packages+=(torch)
if [ ! -x "$venv/bin/python" ]; then
  echo "== python: creating $venv (torch from PyPI is ~2.8 GB the first time)"
  "$python" -m venv "$venv"
fi
# Already satisfied requirements cost no download; a fresh venv with a warm pip cache installs in ~1-2 min.
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${packages[@]}"

echo "== python: installing kiln into $prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null

echo "== python: building the package (pip install ./python)"
CMAKE_PREFIX_PATH=$prefix "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation \
  --no-deps --force-reinstall --config-settings=build-dir="$PWD/$build/python-build" ./python

echo "== python: pytest"
cd python/tests
KILN_CLI=$prefix/bin/kiln KILN_SOURCE_DIR=$OLDPWD "$venv/bin/python" -m pytest -q -rs . "${@:2}"
echo "== python: done in $(( $(date +%s) - start )) s"
