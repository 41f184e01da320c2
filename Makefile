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

.PHONY: serve test lint venv clean qwen-tts-env

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

# The reference Qwen3-TTS (PyPI qwen-tts 0.1.1, which pins transformers 4.57.3) in an environment of its own,
# for tests/test_qwen3_tts_parity.py. torchaudio is a stand-in (no wheel for torch 2.13 CPU; only the 25 Hz
# tokenizer, which no 12 Hz checkpoint uses, would call it).
QWEN_TTS_VENV := .venv-qwen-tts
QWEN_TTS_PY := $(QWEN_TTS_VENV)/bin/python
QWEN_TTS := $(QWEN_TTS_VENV)/.installed
STANDIN := tests/reference_env/torchaudio

qwen-tts-env: $(QWEN_TTS)

$(QWEN_TTS): Makefile $(wildcard $(STANDIN)/*.py $(STANDIN)/*/*.py)
	test -x $(QWEN_TTS_PY) || $(PYTHON) -m venv $(QWEN_TTS_VENV)
	$(QWEN_TTS_PY) -c "import torch" 2>/dev/null || $(QWEN_TTS_PY) -m pip install -q $(TORCH)
	$(QWEN_TTS_PY) -m pip install -q transformers==4.57.3 accelerate==1.12.0 librosa soundfile sox onnxruntime einops
	$(QWEN_TTS_PY) -m pip install -q --no-deps qwen-tts==0.1.1
	cp -r $(STANDIN) "$$($(QWEN_TTS_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	$(QWEN_TTS_PY) -c "import qwen_tts"
	touch $(QWEN_TTS)

test: $(DEV) $(QWEN_TTS)
	$(PY) -m ruff check .
	$(PY) -m pytest -q $(ARGS)

lint: $(DEV)
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) $(QWEN_TTS_VENV) .pytest_cache .ruff_cache
