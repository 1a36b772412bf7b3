#!/usr/bin/env bash
# Every (engine, op, mode) of benchmarks/check_kernels.py as its own process, all at once (the runs are
# independent; their float64 oracles keep a CPU core each busy while the GPU idles), each to its own file
# in DIR, then concatenated in a fixed order into DIR/all.txt.
#   bash benchmarks/check_kernels_parallel.sh DIR COMMIT MAX_EXAMPLES "engine:op:mode ..."
set -u
dir=$1 commit=$2 n=$3 runs=$4
mkdir -p "$dir"
for r in $runs; do
  IFS=: read -r impl op mode <<<"$r"
  OMP_NUM_THREADS=2 python3 benchmarks/check_kernels.py --device cuda --max-examples "$n" --only "$impl" --op "$op" \
    --mode "$mode" --commit "$commit" >"$dir/$impl-$op-$mode.txt" 2>"$dir/$impl-$op-$mode.err" &
done
wait
for r in $runs; do IFS=: read -r impl op mode <<<"$r"; cat "$dir/$impl-$op-$mode.txt"; done >"$dir/all.txt"
