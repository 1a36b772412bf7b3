#!/usr/bin/env bash
# On a GPU machine, under its CUDA torch: the CPU suite (tests/, its slow part too) as `make test` and
# `make test-slow` run it, to see what it does where Triton compiles. Tests that launch Triton kernels on CPU tensors
# skip themselves there, saying why (the `interpreter` mark, properties/interpreter_mark.py); the screenshot tests
# need a browser and are left out. The engine packages (.engines) stay off the import path, as in `make test`.
# The whole output to DIR/suite.txt; DIR/summary.txt: the header, the result line, every failure and error, and the
# skips counted by reason. The checkpoint tests need transformers>=5.23 (pyproject's test extra): where the machine's
# is older, install one first (its wheel and its dependencies' with --no-deps, ahead on PYTHONPATH).
# MARK picks a part by pytest's -m (unset: both, "slow or not slow"; MARK=slow: what `make test-slow` runs).
#   [LIMIT=seconds] [MARK=expr] bash benchmarks/cpu_suite_on_gpu.sh DIR COMMIT [WORKERS]
set -u
dir=$1 commit=$2 workers=${3:-12}
# the suite imports ddsim's other folders through the installed namespace (ddsim.properties, ddsim.oracle, ...): a
# checkout that is not installed fails every test at collection, so say so first (python3 -m pip install --no-deps
# --no-build-isolation -e .; a bare `pip` there may belong to another Python)
python3 -c "import ddsim.properties, ddsim.oracle" 2>/dev/null ||
  { echo "cpu_suite_on_gpu.sh: ddsim is not installed for $(command -v python3) (ddsim.properties does not import)"; exit 2; }
mkdir -p "$dir"
start=$(date +%s)
# no package registry there: pip, uv and the Hub fail at once instead of retrying. On the time limit pytest gets
# SIGINT and still prints what ran; a test that runs past 200 s has its stack dumped (faulthandler).
PIP_NO_INDEX=1 UV_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 timeout -s INT -k 20 ${LIMIT:-500} \
  python3 -m pytest tests -q -p no:cacheprovider -p no:benchmark -m "${MARK:-slow or not slow}" -n "$workers" -rfEs \
  --durations=20 -o faulthandler_timeout=200 --deselect tests/test_html_screenshot.py >"$dir/suite.txt" 2>&1
rc=$?
{ echo "# $(date +%F) | $(python3 -c 'import torch; print(torch.cuda.get_device_name())') | torch" \
       "$(python3 -c 'import torch; print(torch.__version__)') | triton $(python3 -c 'import triton; print(triton.__version__)')" \
       "| transformers $(python3 -c 'import transformers; print(transformers.__version__)') | commit $commit" \
       "| -m ${MARK:-slow or not slow}"
  echo "tests rc=$rc $(( $(date +%s) - start )) s: $(tail -1 "$dir/suite.txt")"
  grep -E "^(FAILED|ERROR) " "$dir/suite.txt"
  sed -n '/slowest [0-9]* durations/,/^$/p' "$dir/suite.txt"
  grep -E "^SKIPPED \[" "$dir/suite.txt" | sed -E 's/^SKIPPED \[([0-9]+)\] [^:]+:[0-9]+: /\1 /' |
    awk '{n = $1; $1 = ""; count[$0] += n} END {for (r in count) print "skipped", count[r], "x" r}' | sort -k2 -nr
} >"$dir/summary.txt"
cat "$dir/summary.txt"
