#!/usr/bin/env bash
# Installs what is missing, builds kiln and runs its main job. Until the autotuner exists, the main job
# compiles kiln's bundled sample kernel through the JIT core and prints its key, size and compile time
# (and, with a GPU, its registers and shared memory).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build
./build/bin/kiln version
./build/bin/kiln compile --sample
