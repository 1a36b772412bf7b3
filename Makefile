# Two entry points for a fresh machine: `make audit` and `make test`.
# Both create .venv on first use: torch is pinned to the CPU wheel 2.13.0 when the venv has no
# torch (an unpinned torch would pull a multi-GB CUDA build), then the project (distribution
# ddsim-spec, import package and command ddsim) is installed editable with its test extras.
PYTHON ?= python3
VENV   ?= .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.ddsim-installed
TORCH_PIN ?= torch==2.13.0
ENGINES := .engines
export HYPOTHESIS_PROFILE ?= ci

.PHONY: setup test test-slow lint audit bench mutation browser py310 clean

# Packages go in with uv where it can be had (tests/venv_setup.py: it reads pip's configuration and picks the
# versions pip would, unpacks in parallel and leaves bytecode to the first import: setup 29 s on the 2-core
# machine, about 100 s with pip), else pip.
INSTALL := $(VPY) tests/venv_setup.py $(VPY)

$(STAMP): pyproject.toml tests/engine_setup.py
	$(PYTHON) -m venv $(VENV)
	$(VPY) -c "import torch" 2>/dev/null || $(INSTALL) $(TORCH_PIN)
	@# an older install of this project under the distribution name "ddsim" (or PyPI's unrelated
	@# project of that name) would shadow the import package: remove it first
	$(VPY) -m pip uninstall -y -q ddsim 2>/dev/null || true
	@# The fastcall extension (gpu_backend/fastcall.cpp, about 20 s of one core) compiles in the background
	@# while the rest is installed on the other core, from fastcall.py alone (torch and ninja, not ddsim); the
	@# tests load the cached build. Where it cannot be built nothing fails here: the tests say why.
	$(INSTALL) 'ninja>=1.11'
	$(VPY) -c "import importlib.util as u; s = u.spec_from_file_location('fastcall', 'gpu_backend/fastcall.py'); \
	  m = u.module_from_spec(s); s.loader.exec_module(m); m.compile_extension()" >/dev/null 2>&1 & build=$$!; \
	$(INSTALL) -e '.[test]' && \
	$(INSTALL) --no-deps --upgrade --target $(ENGINES) fla-core==0.6.0 einops==0.8.1 && \
	$(VPY) tests/engine_setup.py $(ENGINES); rc=$$?; wait $$build; exit $$rc
	@# (between them, the engine kernels `ddsim check-kernel` is tested against, kept out of the venv: transformers
	@# would pick fla up as its own GDN backend: flash-linear-attention's fla-core, pinned, no dependencies, and
	@# SGLang's GDN kernel module, 0.5.23, from its wheel, with the test fixture's shims)
	touch $(STAMP)

setup: $(STAMP)

# The report.html screenshot test needs a headless browser: Debian's chromium, installed here when
# missing and make runs as root (as CI does), never from inside a test. A user who is not root installs it
# once (apt-get install chromium) or sets DDSIM_BROWSER=/path/to/chrome; without a browser that one test
# fails with a line naming the requirement (it does not skip), and every other test runs.
# Without its recommended packages (19 packages on Debian 12 against 107: printing, sound, samba, perl): the
# headless screenshots need none of them.
browser:
	@[ -n "$$DDSIM_BROWSER" ] || command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  if [ "$$(id -u)" = 0 ]; then \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	  else echo "make: no chromium and not root: the report.html screenshot test will fail (apt-get install chromium, or DDSIM_BROWSER=/path/to/chrome)"; fi

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# pytest exits 5 when it collects no test: make treats any non-zero exit as failure. Two workers
# (pytest-xdist) on the 2-core CI machine, an idle worker taking tests queued for the busy one (worksteal: the
# slow engine-kernel tests do not leave one worker finishing alone); one torch thread each (small ops). The
# suite's interpreters write their bytecode caches (gitignored __pycache__) even where PYTHONDONTWRITEBYTECODE is
# set: without them every worker and every command-line process compiles ddsim and rewrites the tests' asserts
# anew, a minute of the suite's 4.6 on the 2-core machine.
# `make test` runs every test but those marked `slow` (pyproject.toml: Triton kernels in the interpreter, i.e.
# check-kernel on the engines' and ddsim's kernels, ddsim's recurrent kernels against the oracle and the model passes
# on them; every kernel compiled for three GPU targets; the two-process audit: over half the suite's time, and three
# minutes more of compiling on a cold Triton cache); `make test-slow` runs those. CI (.ci/run) runs both.
PYTEST := env -u PYTHONDONTWRITEBYTECODE OMP_NUM_THREADS=1 $(VPY) -m pytest -q -n 2 --dist worksteal
# The venv, the browser (apt) and the Python 3.10 check are made side by side (the browser mostly waits on the
# network and dpkg; their output interleaves), then lint. Plain -j2: GNU make 3.81 (macOS's) has no --output-sync.
test:
	@$(MAKE) --no-print-directory -j2 $(STAMP) browser py310
	@$(MAKE) --no-print-directory lint
	$(PYTEST) -m "not slow"

test-slow: $(STAMP)
	$(PYTEST) -m slow

# The oldest supported Python (3.10) byte-compiles every module and runs the command line's torch-free
# paths (--version, the gate on a committed report without a recheck) in a small venv of its own (kept in
# ~/.cache/ddsim, made once), where the
# machine has a python3.10; where it has none this says so and passes.
PY310 ?= $(shell for p in python3.10 $$(pyenv root 2>/dev/null)/versions/3.10*/bin/python3.10; do \
  $$p -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null && { echo $$p; break; }; done)
py310:
	@if [ -z "$(PY310)" ]; then echo "make: no python3.10 here: the Python 3.10 check did not run"; else \
	  $(PY310) tests/py310_check.py $(HOME)/.cache/ddsim/venv310; fi

# The default audit: the trained hybrid shipped in ddsim/models (Qwen3.5 architecture, trained on the
# Python standard library's sources, benchmarks/train_stdlib_hybrid.py) with its trained drafter
# running in the loop, on three code prompts. `ddsim audit` alone audits the random `tiny` preset.
audit: $(STAMP)
	$(VENV)/bin/ddsim audit --model stdlib --drafter-model stdlib --prompts stdlib

# CUDA: the GDN kernel table against the memory floor; CPU: trees per second per verify mode
bench: $(STAMP)
	$(VENV)/bin/ddsim bench --device auto

# Mutation testing of the chain that decides the gate's verdict (metrics -> aggregation -> report
# model -> gate, and the recheck's comparison) against tests/test_gate_chain.py and tests/test_noise_margin.py (configured in
# pyproject.toml); the score and the surviving mutants are recorded in tests/MUTATION.md. One
# OpenMP thread: mutmut forks after torch has run, and a forked OpenMP pool deadlocks.
mutation: $(STAMP)
	$(VPY) -m pip install -q -e '.[test,mutation]'
	rm -rf mutants
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(VENV)/bin/mutmut run --max-children 2; \
	  $(VENV)/bin/mutmut results | grep -v ': killed' ; true

clean:
	rm -rf $(VENV) .venv310 $(ENGINES) ddsim-report .hypothesis .pytest_cache mutants
