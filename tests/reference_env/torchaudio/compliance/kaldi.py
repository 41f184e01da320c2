"""Raises on any use: the 12 Hz models never call it."""


def __getattr__(name: str):
    raise NotImplementedError(f"torchaudio.compliance.kaldi.{name} is a stand-in in .venv-qwen-tts")
