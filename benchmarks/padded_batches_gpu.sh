#!/usr/bin/env bash
# On a GPU, all at once (independent runs; the float64 oracles keep CPU cores busy while the GPU idles): the whole
# property suite compiled (the gdn-padded serving family among it), and check-kernel at the serving profile (bf16
# inputs; padded batches among its examples where the convention pads) on SGLang's GDN (both modes), KDA, Mamba2
# and conv (leaky: its exact conv hangs on the 257-node chain), vLLM's GDN, and ddsim's engine_api in SGLang's
# convention (both modes); node states are held to the oracle's where the kernel keeps them. Each to its own file in
# DIR, packed into DIR.tar.gz, a summary line each in DIR.summary.txt. WORKERS 0 skips the property suite; RUNS
# ("impl:op:mode ...", impl "api" for engine_api, "api.commit" for engine_api with SGLang's commit (its scatter) after
# it, "planted.NAME" for tests/planted_node_states.py's NAME in SGLang's convention, "commit.NAME" for SGLang's
# verify with tests/planted_commits.py's NAME as its commit) picks the check-kernel runs. SGLang's own verifies that
# keep node states run its commit after them.
# Each check-kernel run is stopped after CHECK_TIMEOUT seconds (560 unless set).
#   bash benchmarks/padded_batches_gpu.sh DIR COMMIT [WORKERS] [MAX_EXAMPLES] [RUNS]
set -u
dir=$1 commit=$2 workers=${3:-8} n=${4:-20}
runs=${5:-"sglang:gdn:exact sglang:gdn:leaky sglang:kda:exact sglang:mamba2:exact sglang:conv:leaky vllm:gdn:leaky
           api:gdn:exact api:gdn:leaky"}
mkdir -p "$dir"
if [ "$workers" -gt 0 ]; then
  { python3 -m pytest properties -q -p no:cacheprovider -n "$workers" >"$dir/properties.txt" 2>&1
    echo "properties rc=$? $(tail -1 "$dir/properties.txt")" >"$dir/properties.rc"; } &
fi
api="ddsim.gpu_backend.engine_api:target_verify --convention sglang"
for r in $runs; do
  IFS=: read -r impl op mode <<<"$r"
  case $impl in
    api) args=$api ;;
    api.commit) args="$api --commit sglang.kernels.ops.mamba.mamba_state_scatter_triton:fused_mamba_state_scatter_with_mask" ;;
    planted.*) args="tests.planted_node_states:${impl#planted.} --convention sglang" ;;
    commit.*) args="sglang --commit tests.planted_commits:${impl#commit.}" ;;
    *) args=$impl ;;
  esac
  name="$impl-$op-$mode"
  { start=$(date +%s)
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=1 timeout "${CHECK_TIMEOUT:-560}" python3 -m ddsim.cli check-kernel --impl $args --op "$op" --mode "$mode" \
      --device cuda --dtype bfloat16 --max-examples "$n" --progress --out "$dir/$name.json" >"$dir/$name.txt" 2>&1
    echo "$name rc=$? $(( $(date +%s) - start )) s: $(tail -1 "$dir/$name.txt")" >"$dir/$name.rc"; } &
done
wait
{ echo "# $(date +%F) | $(python3 -c 'import torch; print(torch.cuda.get_device_name())') | commit $commit"
  cat "$dir"/*.rc; } >"$dir.summary.txt"
tar -czf "$dir.tar.gz" -C "$(dirname "$dir")" "$(basename "$dir")" && rm -r "$dir"
cat "$dir.summary.txt"
