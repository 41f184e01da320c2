"""Shared fixtures: tiny random transformers Qwen3-Omni models saved with save_pretrained.

The reference model is built once per variant and session, given random weights of a healthy scale
(every norm and scale weight too, so a missed weight shows), and saved where our loader reads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from models.common.weights import random_weights_
from models.qwen3_omni.tiny import tiny_config
from tests.qwen_tts_env import REFERENCE_PY, QwenTTSEnv

# Tiny matmuls on 2 shared cores: one thread each is many times faster than oversubscribed pools.
torch.set_num_threads(1)


@dataclass
class HFTiny:
    variant: str
    path: Path
    model: object  # transformers Qwen3OmniMoeForConditionalGeneration, float32, eval


def build_hf_tiny(variant: str, path: Path, seed: int = 0) -> HFTiny:
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    torch.manual_seed(seed)
    cfg = Qwen3OmniMoeConfig(**tiny_config(variant))
    model = Qwen3OmniMoeForConditionalGeneration(cfg).float().eval()
    random_weights_(model, seed)
    model.save_pretrained(path)
    return HFTiny(variant, path, model)


_BUILT: dict[str, HFTiny] = {}


def hf_tiny_once(variant: str, tmp_path_factory: pytest.TempPathFactory) -> HFTiny:
    """Each variant is built once per session (the tests only read the model and its files): hf_tiny's "a" is
    hf_tiny_a."""
    if variant not in _BUILT:
        _BUILT[variant] = build_hf_tiny(variant, tmp_path_factory.mktemp(f"hf_tiny_{variant}"))
    return _BUILT[variant]


@pytest.fixture(scope="session", params=["a", "b"])
def hf_tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> HFTiny:
    """Both tiny variants, one after the other."""
    return hf_tiny_once(request.param, tmp_path_factory)


@pytest.fixture(scope="session")
def hf_tiny_a(tmp_path_factory: pytest.TempPathFactory) -> HFTiny:
    return hf_tiny_once("a", tmp_path_factory)


_STARTED: list[QwenTTSEnv] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    """When a selected test needs the reference environment, its process starts now: its imports (7-11 s, one
    core) run beside the tests that come first."""
    needed = any("qwen_tts_env" in item.fixturenames for item in session.items)
    if needed and REFERENCE_PY.is_file() and not session.config.option.collectonly:
        _STARTED.append(QwenTTSEnv())


def pytest_sessionfinish(session: pytest.Session) -> None:
    while _STARTED:  # started at collection, never used (e.g. -x stopped the session first)
        _STARTED.pop().close()


@pytest.fixture(scope="session")
def qwen_tts_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QwenTTSEnv]:
    """The reference Qwen3-TTS environment, one process for the session."""
    env = _STARTED.pop() if _STARTED else QwenTTSEnv()
    env.logs = tmp_path_factory.mktemp("qwen_tts_env")
    try:
        yield env
    finally:
        env.close()
