#!/usr/bin/env bash
# Installs what is missing, builds kiln and runs its main job: tune every problem of the Llama 3 8B workload
# (examples/llama3-8b.json) on the GPU and store the decisions and kernels in the cache. On a machine without
# a GPU, `kiln tune` says so and precompiles every choice's kernels into the cache instead.
# Usage: scripts/main.sh [extra kiln tune arguments, e.g. --cache-dir D --mode tune --report report.json]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build
./build/bin/kiln version
./build/bin/kiln tune --workload examples/llama3-8b.json "$@"
