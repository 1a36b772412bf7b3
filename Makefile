# Two entry points for a fresh machine: `make audit` and `make test`.
# Both create .venv on first use: torch is pinned to the CPU wheel 2.13.0 when the venv has no
# torch (an unpinned torch would pull a multi-GB CUDA build), then the project is installed
# editable with its test extras.
PYTHON ?= python3
VENV   ?= .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.ddsim-installed
TORCH_PIN ?= torch==2.13.0
export HYPOTHESIS_PROFILE ?= ci

.PHONY: setup test audit bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q $(TORCH_PIN)
	$(VPY) -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

# pytest exits 5 when it collects no test: make treats any non-zero exit as failure.
test: $(STAMP)
	$(VPY) -m pytest -q

audit: $(STAMP)
	$(VENV)/bin/ddsim audit

# CUDA: the GDN kernel table against the memory floor; CPU: trees per second per verify mode
bench: $(STAMP)
	$(VENV)/bin/ddsim bench --device auto

clean:
	rm -rf $(VENV) ddsim-report .hypothesis .pytest_cache
