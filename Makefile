# The two commands: `make serve` and `make test`. Both create .venv and install into it.
# `make serve` installs the runtime dependencies only; `make test` (and `make venv`) add the test extras.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUNTIME := $(VENV)/.installed-runtime
DEV := $(VENV)/.installed
# A CUDA machine may set TORCH to the build it wants, e.g. TORCH='torch==2.13.0 --index-url ...'.
TORCH ?= torch==2.13.0
MODEL ?= tiny
ARGS ?=

.PHONY: serve test lint venv clean

venv: $(DEV)

$(RUNTIME): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e .
	$(PY) -m realtime.turn_model fetch  # Smart Turn v3.2 for semantic_vad, from the pipecat-ai wheel (SHA-256 pinned)
	touch $(RUNTIME)

$(DEV): $(RUNTIME)
	$(PY) -m pip install -q -e '.[test]'
	touch $(DEV)

# Not echoed: ARGS may hold a key. Prefer OMNI_REALTIME_API_KEY=... make serve (never on the command line).
serve: $(RUNTIME)
	@$(VENV)/bin/omni-realtime serve --model $(MODEL) $(ARGS)

test: $(DEV)
	$(PY) -m ruff check .
	$(PY) -m pytest -q $(ARGS)

lint: $(DEV)
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
