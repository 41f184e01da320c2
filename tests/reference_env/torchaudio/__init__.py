"""Stand-in for torchaudio in .venv-qwen-tts (no torchaudio wheel exists for torch 2.13 CPU).

qwen-tts 0.1.1 imports `torchaudio.compliance.kaldi` only for its 25 Hz tokenizer, which no 12 Hz
checkpoint uses; importing works, calling anything raises."""
