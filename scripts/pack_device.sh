#!/usr/bin/env bash
# Packs programs for the GPU machine into one compressed file that fits a run's carry limit (64 MiB):
#   bash scripts/pack_device.sh NAME PROGRAM...     ->  .NAME-tar/pack.txz (carry ".NAME-tar")
# and there: `tar xJf .NAME-tar/pack.txz` gives .NAME/ (programs + the libraries the GPU image lacks).
# Uses ../shared/tools/device-pack, then strips (the build's debug info is most of the size).
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1; shift
pack=${KILN_DEVICE_PACK:-../shared/tools/device-pack}
rm -rf ".$name" ".$name-tar"
"$pack" ".$name" "$@"
strip --strip-all ".$name"/* 2>/dev/null || true
strip --strip-unneeded ".$name"/lib/* 2>/dev/null || true
mkdir -p ".$name-tar"
tar cJf ".$name-tar/pack.txz" ".$name"
rm -rf ".$name"
ls -la ".$name-tar/pack.txz"
