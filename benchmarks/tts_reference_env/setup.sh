# The Qwen3-TTS reference (qwen-tts 0.1.1, which pins transformers 4.57.3) on the GPU machine, whose image has
# transformers 5 and no network. Two steps:
#   here (with a package index):  sh benchmarks/tts_reference_env/setup.sh download   -> .whl-ref/ (ignored by git)
#   there (carry .whl-ref):       . benchmarks/tts_reference_env/setup.sh              -> /tmp/ref, $REFPATH
# then: PYTHONPATH=$REFPATH python3 benchmarks/tts_reference_bench.py ...
# librosa, sox and torchaudio are stand-ins that raise if called: reading text aloud with a named speaker
# never calls them (they load and resample reference audio, and serve the 25 Hz tokenizer).
HERE=benchmarks/tts_reference_env
if [ "$1" = download ]; then
    mkdir -p .whl-ref && ${PY:-python3} -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux2014_x86_64 --implementation cp -d .whl-ref qwen-tts==0.1.1 transformers==4.57.3 \
        huggingface_hub==0.36.2 tokenizers==0.22.2 accelerate==1.12.0 einops==0.8.2
else
    ${PY:-python3} -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/ref .whl-ref/*.whl
    export REFPATH=/tmp/ref:/tmp/site:$PWD:$PWD/$HERE/stubs:$PWD/tests/reference_env
fi
