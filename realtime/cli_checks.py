"""What the CLI checks before the model loads: every mistake is a UsageError naming its flag, with a hint."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from pipelines.spec import ModelSpec


class UsageError(Exception):
    """A mistake in what the user asked for: printed as one line, exit code 2."""


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def default_threads(device: str) -> int:
    """torch's CPU threads: 1 on CUDA, where the CPU runs small audio ops on several threads at once (a commit's audio
    work took 5-7 ms with 16 threads, 4-5 with 4, 3.5-4 with 1 on the H200 box); min(4, cores) on CPU, for the model."""
    return 1 if device.startswith("cuda") else min(4, os.cpu_count() or 1)


def check_before_loading(args: argparse.Namespace) -> ModelSpec:
    spec = check_model(args.model)
    if args.voice_model:
        check_model(args.voice_model, "--voice-model")
        spec = check_model(args.model, "--voice-model", args.voice_model)
    check_device(args.device or default_device())
    return spec


def check_positive(args: argparse.Namespace, *names: str, zero_ok: bool = False) -> None:
    for name in names:
        if getattr(args, name) < 0 or getattr(args, name) == 0 and not zero_ok:
            raise UsageError(f"--{name.replace('_', '-')} must be {'zero or more' if zero_ok else 'positive'} "
                             f"(got {getattr(args, name):g})")


def check_model(model: str, flag: str = "--model", voice_model: str = "") -> ModelSpec:
    """What the model declares (speaking with `voice_model`), read without its weights; a bad path fails at once."""
    from models.registry import describe, presets

    if model not in presets():
        path, config = Path(model), Path(model) / "config.json"
        if not path.is_dir():
            raise UsageError(f"{flag} {model}: no such directory (give a checkpoint directory, or one of "
                             f"{', '.join(presets())})")
        if not config.is_file():
            raise UsageError(f"{flag} {model}: no config.json in that directory")
        try:
            data = json.loads(config.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UsageError(f"{config}: not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise UsageError(f"{config}: not a JSON object (a checkpoint's config.json is one)")
    try:
        return describe(model, voice_model)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise UsageError(f"{flag} {voice_model or model}: {e}") from None


def check_device(device: str) -> None:
    import torch

    try:
        kind = torch.device(device)
    except RuntimeError:
        raise UsageError(f"--device {device}: not a torch device (give cpu, cuda or cuda:N)") from None
    if kind.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: this torch ({torch.__version__}) sees no CUDA GPU; use --device cpu "
                         "or install a CUDA build of torch")
    if kind.type == "cuda" and kind.index is not None and kind.index >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: there are {torch.cuda.device_count()} CUDA devices (cuda:0 first)")


def check_speaking(spec: ModelSpec, args: argparse.Namespace) -> None:
    if spec.speaks:
        try:
            spec.voice(args.voice)
        except ValueError as e:
            raise UsageError(f"--voice {args.voice}: {e}") from None
    language, reference_audio, reference_text = args.language, args.reference_audio, args.reference_text
    if language and language.lower() not in {lang.lower() for lang in spec.languages}:
        have = ", ".join(spec.languages) if spec.languages else "none: it takes no --language"
        raise UsageError(f"--language {language}: not one of this model's languages ({have})")
    if args.instructions and not spec.instructions:
        raise UsageError(f"--instructions: this model ({spec.name}) takes no instructions")
    if reference_text is not None and not reference_audio:
        raise UsageError("--reference-text: give the --reference-audio it is the text of")
    if reference_text is not None and not reference_text.strip():
        raise UsageError("--reference-text is blank: give what --reference-audio says, or leave it out to clone "
                         "from the audio alone")
    if reference_audio and not spec.clones:
        raise UsageError(f"--reference-audio: this model ({spec.name}) cannot clone a voice")


def check_out(path: str) -> None:
    out = Path(path)
    if out.is_dir():
        raise UsageError(f"--out {path}: is a folder; give a file name such as {out / 'answer.wav'}")
    if not out.parent.is_dir():
        raise UsageError(f"--out {path}: the folder {out.parent} does not exist (create it first)")
    if not os.access(out.parent, os.W_OK):
        raise UsageError(f"--out {path}: the folder {out.parent} is not writable")


def read_audio(path: str, flag: str = "--audio") -> tuple:
    from .wav import AudioFileError, read_wav

    if not Path(path).is_file():
        raise UsageError(f"{flag} {path}: no such file")
    try:
        return read_wav(path)
    except AudioFileError as e:
        raise UsageError(f"{flag} {path}: {e}") from None
