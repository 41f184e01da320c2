"""One prefill forward, two shapes: a prompt too long for the fixed prefill shapes runs the same
`ThinkerPrefill` at its own shape (eagerly), and gives what the fixed shapes give when it is fed to
them in pieces that fit."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from models.common.prefill import Prefills
from models.qwen3_omni.forward import ThinkerDecode, ThinkerPrefill
from models.qwen3_omni.model import load_model
from pipelines import kv_views
from pipelines.graphs import PrefillGraphs
from pipelines.kv_cache import KVLayout, PagedKVCache
from pipelines.sampling import SamplingParams
from pipelines.step_sampling import sampling_rows

CACHED, NEW = 37, PrefillGraphs.TOKENS[-1] + 88  # the new tokens fit no token bucket


@dataclass
class Seq:
    key: str


@pytest.fixture(scope="module")
def model():
    return load_model("tiny")


def test_long_prefill_runs_the_same_forward_eagerly_and_equals_fixed_shape_pieces(model):
    text = model.cfg.thinker.text
    cache = PagedKVCache(KVLayout(text.num_hidden_layers, text.num_key_value_heads, text.head_dim, 128, 16))
    prefill = ThinkerPrefill(ThinkerDecode(model, cache, text.vocab_size), model.cfg.talker.accept_hidden_layer)
    steps = Prefills("thinker_prefill", prefill, lambda t, w: prefill.inputs(torch.float32, t, w), cache,
                     torch.device("cpu"), graphs=False)
    x = torch.randn(CACHED + NEW, text.hidden_size, generator=torch.Generator().manual_seed(0))

    def feed(key: str, start: int, n: int) -> dict:
        """Prefill x[start : start + n] of sequence `key` through the call `steps` chooses."""
        cache.reserve(key, n)
        (call,) = list(steps.calls([Seq(key)], [n]))
        rows = kv_views.prefill_rows(cache, [(key, n)], call.tokens, call.blocks)
        pad = torch.zeros(call.tokens, text.hidden_size)
        pad[:n] = x[start : start + n]
        rows |= {"x": pad[None], "last": [n - 1], "step": [0], "no_eos": [False],
                 **sampling_rows("s", [SamplingParams(greedy=True)])}
        with torch.inference_mode():
            out = call.runner(1, rows)
        cache.commit(key, n)
        return {"eager": call.runner.name.endswith("[eager]"), "shape": (call.tokens, call.blocks), **out}

    pieces = [feed("fixed", 0, CACHED), feed("fixed", CACHED, 500), feed("fixed", CACHED + 500, NEW - 500)]
    assert not any(p["eager"] for p in pieces)
    feed("eager", 0, CACHED)
    whole = feed("eager", CACHED, NEW)
    assert whole["eager"] and whole["shape"] == (NEW, cache.layout.blocks_for(CACHED + NEW))
    last = pieces[-1]
    assert whole["ids"].tolist() == last["ids"].tolist()
    torch.testing.assert_close(whole["embeds"], last["embeds"])
    torch.testing.assert_close(whole["projected"], last["projected"], rtol=1e-5, atol=1e-5)
    tail = NEW - 500
    torch.testing.assert_close(whole["captured"][:, NEW - tail : NEW], last["captured"][:, :tail], rtol=1e-4,
                               atol=1e-4)
    cache.check()
