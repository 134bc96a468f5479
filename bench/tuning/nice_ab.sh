#!/usr/bin/env bash
# The default effort's tune time with the compile workers at other CPU priorities (ProcessPoolOptions::
# worker_nice through KILN_POOL_NICE), the suite's two parts each, alternating, in one call on the GPU machine:
#   tar xJf .device-ts-tar/pack.txz && bash bench/tuning/nice_ab.sh "0 10" 2
# NICES: the values to compare; PASSES: how many times each (bench/tuning/env_ab.sh runs them).
configs=()
for n in ${1:-"0 10"}; do configs+=("nice$n|KILN_POOL_NICE=$n"); done
exec bash "$(dirname "$0")/env_ab.sh" "${2:-2}" "${configs[@]}"
