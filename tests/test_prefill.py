"""The thinker's prefill forward (`ThinkerPrefill`), one function at every shape: a prompt too long for
the fixed prefill shapes runs it at its own shape (eagerly) and gives what the fixed shapes give when
fed in pieces that fit; and a model without a talker (a thinker-only checkpoint) runs the thinker
stage's steps and makes no talker rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from models.common.prefill import Prefills
from models.qwen3_omni.forward import ThinkerDecode, ThinkerPrefill
from models.qwen3_omni.model import load_model
from models.qwen3_omni.thinker_step import ThinkerStep
from pipelines import kv_views
from pipelines.graphs import PrefillGraphs
from pipelines.kv_cache import KVLayout, PagedKVCache
from pipelines.sampling import SamplingParams, sampling_rows
from pipelines.stage import StageConfig

CACHED, NEW = 37, PrefillGraphs.TOKENS[-1] + 88  # the new tokens fit no token bucket
GREEDY = sampling_rows("s", [SamplingParams(greedy=True)])


@dataclass
class Seq:
    key: str


@pytest.fixture(scope="module")
def model():
    return load_model("tiny")


def new_cache(model) -> PagedKVCache:
    text = model.cfg.thinker.text
    return PagedKVCache(KVLayout(text.num_hidden_layers, text.num_key_value_heads, text.head_dim, 128, 16))


def feeder(steps: Prefills, x: torch.Tensor) -> Callable[[str, int, int], dict]:
    cache = steps.kv

    def feed(key: str, start: int, n: int) -> dict:
        """Prefill x[start : start + n] of sequence `key` through the call `steps` chooses."""
        cache.reserve(key, n)
        (call,) = list(steps.calls([Seq(key)], [n]))
        rows = kv_views.prefill_rows(cache, [(key, n)], call.tokens, call.blocks)
        pad = torch.zeros(call.tokens, x.shape[1])
        pad[:n] = x[start : start + n]
        with torch.inference_mode():
            out = call.runner(1, rows | {"x": pad[None], "last": [n - 1], "step": [0], "no_eos": [False], **GREEDY})
        cache.commit(key, n)
        return {"eager": call.runner.name.endswith("[eager]"), "shape": (call.tokens, call.blocks), **out}

    return feed


def prefills(model, cache: PagedKVCache, capture_layer: int | None) -> Prefills:
    prefill = ThinkerPrefill(ThinkerDecode(model, cache, model.cfg.thinker.text.vocab_size), capture_layer)
    return Prefills("thinker_prefill", prefill, lambda t, w: prefill.inputs(torch.float32, t, w), cache,
                    torch.device("cpu"), graphs=False)


def inputs(model) -> torch.Tensor:
    return torch.randn(CACHED + NEW, model.cfg.thinker.text.hidden_size, generator=torch.Generator().manual_seed(0))


def test_long_prefill_runs_the_same_forward_eagerly_and_equals_fixed_shape_pieces(model):
    cache = new_cache(model)
    feed = feeder(prefills(model, cache, model.cfg.talker.accept_hidden_layer), inputs(model))
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


def test_a_model_without_a_talker_runs_the_thinker_steps_without_talker_rows(model):
    alone = load_model("tiny")
    alone.talker = None
    cache = new_cache(alone)
    step = ThinkerStep(alone, torch.float32, alone.cfg.thinker.text.vocab_size, cache,
                       StageConfig("thinker", kv_blocks=128))
    assert not step.speaks and step.tts is None
    x = inputs(model)
    with_talker = feeder(prefills(model, new_cache(model), model.cfg.talker.accept_hidden_layer), x)
    for start, n in ((0, CACHED), (CACHED, NEW)):  # a fixed-shape prefill, then an eager one
        ours, ref = feeder(step.prefill, x)("s", start, n), with_talker("s", start, n)
        assert ours["eager"] == ref["eager"] == (n == NEW)
        assert "projected" not in ours and "captured" not in ours
        assert ours["ids"].tolist() == ref["ids"].tolist()
        torch.testing.assert_close(ours["embeds"], ref["embeds"])
    cache.reserve("s", 1)
    rows = kv_views.rows(cache, ["s"], step.width) | {"x": ref["embeds"], "step": [1], "no_eos": [False], **GREEDY}
    with torch.inference_mode():
        out = step.graph(1, rows)
    assert set(out) == {"ids", "embeds", "bad"} and not out["bad"].any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sixteen_sequences_prefill_in_one_captured_call_exactly_as_eagerly():
    """PrefillGraphs.ROWS' largest bucket (16) captured in bf16 replays what the same padded call computes eagerly,
    row for row; 12 sequences of a burst's first turns take one call."""
    dev, dt = torch.device("cuda"), torch.bfloat16
    m = load_model("tiny", dev, dt)
    text = m.cfg.thinker.text
    lengths = [86, 90, 77, 96, 66, 95, 81, 88, 72, 93, 84, 79]  # all in the 96-token bucket
    x = torch.randn(len(lengths), 96, text.hidden_size, generator=torch.Generator().manual_seed(5)).to(dev, dt)
    outs = []
    for graphs in (True, False):
        cache = PagedKVCache(KVLayout(text.num_hidden_layers, text.num_key_value_heads, text.head_dim, 256, 16,
                                      dt, dev))
        prefill = ThinkerPrefill(ThinkerDecode(m, cache, text.vocab_size), m.cfg.talker.accept_hidden_layer)
        steps = Prefills("thinker_prefill", prefill, lambda t, w, p=prefill: p.inputs(dt, t, w), cache, dev, graphs)
        steps.capture(None)
        keys = [Seq(f"s{i}") for i in range(len(lengths))]
        for s, n in zip(keys, lengths, strict=True):
            cache.reserve(s.key, n)
        (call,) = list(steps.calls(keys, lengths))
        assert len(call.group) == 12 and (16 in call.runner.graphs) is graphs
        rows = kv_views.prefill_rows(cache, [(s.key, n) for s, n in call.group], call.tokens, call.blocks)
        greedy = sampling_rows("s", [SamplingParams(greedy=True)] * 12)
        with torch.inference_mode():
            outs.append(call.runner(12, rows | {"x": x, "last": [n - 1 for n in lengths], "step": [0] * 12,
                                                "no_eos": [False] * 12, **greedy}))
    graph, eager = outs
    assert graph.keys() == eager.keys()
    for k in graph:
        assert torch.equal(graph[k], eager[k]), k


def test_prefill_calls_hold_one_token_bucket_at_the_widest_context_among_them():
    """PrefillGraphs.groups: a burst's first turns (context 256) share a call with a later turn's (1024) at 1024
    rather than take two; where more calls are needed the wider contexts fill the first and the narrower are left
    together; token buckets never share a call; no shape has more new tokens than context (512 x 256 is not made)."""
    fixed = PrefillGraphs.__new__(PrefillGraphs)  # groups and shape read only the buckets
    first, later = fixed.shape(86, 86), fixed.shape(90, 400)
    assert (first, later, fixed.shape(300, 300), fixed.shape(600, 700)) == ((96, 256), (96, 1024), (512, 1024), None)
    assert fixed.groups([("a", first), ("b", later), ("c", first), ("d", fixed.shape(20, 20))]) == [
        ((96, 1024), ["b", "a", "c"]), ((32, 256), ["d"])]
    many = [(f"w{i}", later if i % 4 == 0 else first) for i in range(20)]  # 5 later turns, 15 first ones
    ordered = [f"w{i}" for i in range(0, 20, 4)] + [f"w{i}" for i in range(20) if i % 4]
    assert fixed.groups(many) == [((96, 1024), ordered[:16]), ((96, 256), ordered[16:])]
    assert max(PrefillGraphs.TOKENS) > min(PrefillGraphs.CONTEXTS)  # so the rule below is not empty
    assert fixed.shape(200, 200) == (512, 1024)  # 200 new tokens take the 512 bucket: 256 cannot hold it
    assert all(t <= c for t, c in filter(None, (fixed.shape(n, n + cached) for n in range(1, 600, 7)
                                                for cached in (0, 100, 900))))
