# The common start of bench/*/device_run.sh on a GPU machine; source it with the folder the programs were
# packed into (../shared/tools/device-pack DIR ...): `source "$(dirname "$0")/../support/device_env.sh" DIR`.
# Moves to the repository root, sets D=DIR, puts DIR/lib and CUDA on the library path, and makes $OUT
# (default /tmp/out), where the scripts leave their logs and JSON.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
D=$1
export LD_LIBRARY_PATH=$PWD/$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
