"""With another model's voice (`serve --voice-model`), a Qwen3-Omni checkpoint loads without its talker and
Code2Wav: their weights are never read, and the thinker is the one a whole load gives."""

from __future__ import annotations

import safetensors
import torch

from models.qwen3_omni import model as omni


def test_a_voiced_load_reads_no_talker_or_code2wav_tensor(hf_tiny_a, monkeypatch):
    whole = omni.load_model(hf_tiny_a.path)
    assert whole.talker is not None and whole.code2wav is not None
    read: list[str] = []
    real_open = safetensors.safe_open

    class Noting:  # the real file, noting which tensors are read
        def __init__(self, *args, **kwargs) -> None:
            self.f = real_open(*args, **kwargs)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc) -> None:
            self.f.__exit__(*exc)

        def __getattr__(self, name: str):
            return getattr(self.f, name)

        def get_tensor(self, key: str) -> torch.Tensor:
            read.append(key)
            return self.f.get_tensor(key)

        def get_slice(self, key: str):
            read.append(key)
            return self.f.get_slice(key)

    monkeypatch.setattr("models.common.weights.safe_open", Noting)
    voiced = omni.load_model(hf_tiny_a.path, speaks=False)
    assert voiced.talker is None and voiced.code2wav is None
    assert read and any(k.startswith("thinker.") for k in read)
    assert not [k for k in read if k.startswith(omni.SPEAKING)]
    thinker = voiced.thinker.state_dict()
    assert thinker.keys() == whole.thinker.state_dict().keys()
    assert all(torch.equal(v, whole.thinker.state_dict()[k]) for k, v in thinker.items())
