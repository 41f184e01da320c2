"""Parity with the reference Qwen3-TTS (PyPI qwen-tts 0.1.1) on tiny random configs in the published layout.

The reference runs in its own environment (.venv-qwen-tts, built by `make qwen-tts-env`): it makes each
checkpoint with its own classes and `save_pretrained`, and generates greedily through its own entry points
(tests/qwen3_tts_reference.py), its speech tokenizer (a tiny random one in `speech_tokenizer/`) decoding the
codes. We read the checkpoint with our loader and compare, in float32: the talker's input embeddings over
the prompt, its logits over the prompt and every decode step, the code predictor's logits and codes, and end
to end the greedy codes and waveform of our streaming pipeline and of `omni-realtime generate --greedy`
(CustomVoice with a speaker, a language and an instruction; a dialect speaker; VoiceDesign; Base cloning a
voice from its x-vector, the speaker encoder's x-vector compared too; Base cloning in context, from the
reference audio and its transcript, the reference audio's codes compared too: with the transcript longer
than the reference's frames, its rest streamed, and shorter, padded).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from models import registry
from models.common.tokenizer import Tokenizer
from models.qwen3_tts.model import load_talker
from models.qwen3_tts.prompt import TextIds, build_prompt
from models.qwen3_tts.speech_tokenizer import SpeechTokenizer
from models.qwen3_tts.tiny import tiny_codec, tiny_config, tiny_generation
from pipelines.types import AudioChunk, GenerationOptions, Message, Turn, TurnDone, TurnError
from realtime.wav import read_wav
from tests.cli_run import run_cli
from tests.reference_paths import save_tokenizer

ROOT = Path(__file__).resolve().parent.parent
FRAMES = 15
# The tiny random decoder has a large gain (its output clips at +-1), so float32 rounding of our streamed
# decode and the reference's one-shot decode differs by up to ~3e-3 here; test_qwen3_tts_codec.py checks the
# decoder itself against the reference to 1e-5 of the peak.
WAVE_ATOL = 5e-3
CASES = {
    "custom_voice": dict(kind="custom_voice", text="Hello there! How are you today?", speaker="Vivian",
                         language="English", instruct="Speak slowly, in a warm voice."),
    "dialect": dict(kind="custom_voice", text="今天天气很好，我们去公园吧。", speaker="Dylan", language="Auto",
                    instruct=""),
    "voice_design": dict(kind="voice_design", text="The quick brown fox jumps over the lazy dog.", speaker="",
                         language="Auto", instruct="A deep, calm male voice, speaking slowly."),
    "base_clone": dict(kind="base", text="Please call me back when you are free.", speaker="", language="English",
                       instruct=""),
    "base_in_context": dict(kind="base", text="Please call me back when you are free.", speaker="",
                            language="English", instruct="", ref_text="I left the keys on the kitchen table."),
    "base_in_context_short": dict(kind="base", text="Yes.", speaker="", language="Auto", instruct="",
                                  ref_text="Hi there.", ref_seconds=2),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, qwen_tts_env) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qwen3_tts")
    published = root / "tokenizer"  # written once (about a second), copied into each case
    save_tokenizer(Tokenizer.builtin(), published)
    (published / "tokenizer.json").unlink()  # the published repos have vocab.json + merges.txt only
    cases, dirs = [], {}
    for i, (name, case) in enumerate(CASES.items()):
        d = dirs[name] = root / name
        shutil.copytree(published, d)
        cases.append(dict(dir=str(d), config=tiny_config(case["kind"]), seed=10 + i,
                          generation=tiny_generation() | {"max_new_tokens": FRAMES + 1}, codec=tiny_codec(),
                          **case))
    (root / "cases.json").write_text(json.dumps(cases))
    qwen_tts_env.run(ROOT / "tests" / "qwen3_tts_reference.py", str(root / "cases.json"), timeout=900)
    return dirs


def ours(d: Path, case: dict, ref: dict):
    model = load_talker(d)
    cfg = model.cfg
    speaker = None
    if "ref_wave" in ref:
        speaker = model.speaker_encoder.embed(ref["ref_wave"])
        torch.testing.assert_close(speaker, ref["xvector"], atol=2e-5, rtol=1e-4)
    elif case["speaker"]:
        speaker = model.talker.embed_codec(torch.tensor(cfg.talker.speaker_id(case["speaker"])))
    reference = None
    if "ref_code" in ref:
        reference = SpeechTokenizer.load(d / "speech_tokenizer").encode(ref["ref_wave"], 24000)
        assert torch.equal(reference, ref["ref_code"])
    ids = TextIds.of(Tokenizer.load(d), case["text"], case["instruct"] if cfg.takes_instructions else "",
                     case.get("ref_text", ""))
    language = cfg.talker.language_id(case["language"], case["speaker"])
    prompt = build_prompt(model.talker, cfg, ids, language, speaker, cfg.model_type == "base", reference)
    torch.testing.assert_close(prompt.embeds, ref["prompt"], atol=1e-6, rtol=1e-5)
    return model, prompt


def reply_wave(ref: dict, frames: int) -> np.ndarray:
    """The reference's waveform, checked to be the reply's `frames` frames. In context it decodes the reference
    audio's R frames and the reply's F, then cuts int(R / (R + F) * samples): float rounding can leave the last
    sample of the reference audio in front, which our stream (from the reply's first frame) does not have."""
    wave = ref["wave"].numpy()
    r = len(ref.get("ref_code", ()))
    assert len(wave) == (r + frames) * 1920 - int(r / (r + frames) * (r + frames) * 1920)
    return wave[len(wave) - frames * 1920:]


@pytest.mark.parametrize("name", list(CASES))
def test_talker_and_predictor_logits(reference, name):
    d, case = reference[name], CASES[name]
    ref = torch.load(d / "reference.pt")
    codes = ref["codes"]
    assert codes.shape[1] == 16 and 2 <= codes.shape[0] <= FRAMES
    with torch.inference_mode():
        model, prompt = ours(d, case, ref)
        talker = model.talker
        steps = []
        for k, frame in enumerate(codes.tolist()):
            embed = talker.embed_codec(torch.tensor(frame[0])) + sum(
                talker.code_predictor.embed(torch.tensor(c), g) for g, c in enumerate(frame[1:]))
            steps.append(embed + prompt.text_for_step(k))
        x = torch.cat((prompt.embeds, torch.stack(steps)))[None]
        hidden = talker(x, torch.arange(x.shape[1])[None], None)[0]
        logits = talker.codec_logits(hidden)
        p = prompt.embeds.shape[0]
        torch.testing.assert_close(logits[:p], ref["talker_prefill"], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(logits[p:p + len(ref["talker_steps"])], ref["talker_steps"], atol=2e-5, rtol=1e-4)
        for k, frame in enumerate(codes):
            predicted = talker.code_predictor.predict(hidden[p - 1 + k][None], talker.embed_codec(frame[:1]))
            assert predicted.codes[0].tolist() == frame[1:].tolist()
            torch.testing.assert_close(predicted.logits[0], ref["predictor"][k], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_pipeline_equals_the_reference(reference, name):
    d, case = reference[name], CASES[name]
    ref = torch.load(d / "reference.pt")
    opts = GenerationOptions(greedy=True, voice=case["speaker"], language=case["language"],
                             instructions=case["instruct"], reference_audio=ref.get("ref_wave"),
                             reference_text=case.get("ref_text", ""))
    with registry.build_pipeline(str(d)) as pipeline:
        events = pipeline.run(Turn("p", [Message("user", case["text"])], opts), timeout_s=300)
    done = events[-1]
    assert isinstance(done, TurnDone), done
    assert [list(c) for c in done.codes] == ref["codes"].tolist()
    pcm = np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)])
    assert pcm.shape == (len(done.codes) * 1920,)
    np.testing.assert_allclose(pcm, reply_wave(ref, len(done.codes)), atol=WAVE_ATOL)


@pytest.mark.parametrize("name", ["custom_voice", "base_in_context"])
def test_generate_cli_greedy_equals_the_reference(reference, tmp_path, name):
    d, case = reference[name], CASES[name]
    ref = torch.load(d / "reference.pt")
    out = tmp_path / "speech.wav"
    clone = []
    if "ref_wave" in ref:  # float WAV: the reference audio exactly
        soundfile.write(str(tmp_path / "ref.wav"), ref["ref_wave"].numpy(), 24000, subtype="FLOAT")
        clone = ["--reference-audio", str(tmp_path / "ref.wav"), "--reference-text", case["ref_text"]]
    # the CLI's own main, in this process (tests/test_qwen3_tts_cli.py runs the entry point in a fresh one)
    run = run_cli("generate", "--model", str(d), "--text", case["text"], "--voice", case["speaker"], "--language",
                  case["language"], "--instructions", case["instruct"], *clone, "--greedy", "--device", "cpu",
                  "--out", str(out), "--json", timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["codes"] == ref["codes"].tolist() and result["text"] == case["text"]
    wave, rate = read_wav(str(out))
    assert rate == 24000 and wave.shape == (len(result["codes"]) * 1920,)
    np.testing.assert_allclose(wave, reply_wave(ref, len(result["codes"])), atol=WAVE_ATOL + 1 / 32768)  # 16-bit


def test_bad_clone_requests_get_a_clear_error(reference):
    ref = torch.load(reference["base_in_context"] / "reference.pt")
    bad = {"blank": dict(reference_audio=ref["ref_wave"], reference_text=" \n\t"),
           "the reference audio too": dict(reference_text="I left the keys on the kitchen table.")}
    with registry.build_pipeline(str(reference["base_in_context"])) as pipeline:
        for i, (words, kwargs) in enumerate(bad.items()):
            [event] = pipeline.run(Turn(f"bad{i}", [Message("user", "Hello.")], GenerationOptions(**kwargs)))
            assert isinstance(event, TurnError) and event.code == "invalid_request", event
            assert "reference_text" in event.message and words in event.message, event.message
