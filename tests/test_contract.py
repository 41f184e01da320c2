"""The model contract, for every registered model's tiny preset (models.registry.presets()): what the runtime
promises whatever the model. Only the generic API (registry, Pipeline, Turn, events) and the model's own spec
are used, so a new model is covered by adding its preset to the registry."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from models import registry
from pipelines.pipeline import Pipeline
from pipelines.types import AudioChunk, GenerationOptions, TextDelta, Turn, TurnDone, TurnError
from tests.contract import live, options, outcome, steps, together, user

PRESETS = registry.presets()
TEXTS = ("Hello!", "What is the weather like in Paris today?", "Tell me a story about a fox and a crow, please.")
LONG = dict(max_text_tokens=200, max_frames=200, ignore_eos=True)  # still running when it is cut


@pytest.fixture(scope="module", params=PRESETS)
def pipeline(request):
    with registry.build_pipeline(request.param) as p:
        yield p


@pytest.fixture
def baseline(pipeline):
    """The engine's live counters before the test; every test must leave them as it found them."""
    before = live(pipeline)
    yield before
    assert live(pipeline) == before
    assert not any(pipeline.kv_check().values())


def test_preset_declares_itself(pipeline, request):
    spec = pipeline.spec
    assert spec.tiny == request.node.callspec.params["pipeline"]
    assert registry.entry(spec.tiny).model_type == spec.family
    assert spec.text_out or spec.speaks
    assert set(pipeline.capacity()) >= {"sessions"} and pipeline.capacity()["sessions"] > 0


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_batched_turns_equal_each_alone(pipeline, baseline, sampled):
    spec = pipeline.spec

    def turns() -> list[Turn]:
        return [Turn(f"b{i}", [user(spec, text, 0.5 + 0.4 * i, seed=i)], options(spec, 7 + i if sampled else None))
                for i, text in enumerate(TEXTS)]

    start = steps(pipeline)
    alone = []
    for t in turns():
        alone.append(outcome(pipeline.run(t, timeout_s=120)))
        pipeline.end_session(t.session_id)
    middle = steps(pipeline)
    batched = [outcome(events) for events in together(pipeline, turns())]
    for t in turns():
        pipeline.end_session(t.session_id)
    assert steps(pipeline) - middle < middle - start  # the turns really shared batches
    for a, b in zip(alone, batched, strict=True):
        assert a.same_tokens(b) and a.text_ids
        # an audio decoder may run its batch's streams through one convolution: float32 rounds differently per
        # batch size, and random weights amplify it (the Qwen3-Omni decoder is exact in float64)
        np.testing.assert_allclose(a.pcm, b.pcm, atol=5e-3)
    if sampled:  # really sampled: the seeded turn left the greedy path
        greedy = outcome(pipeline.run(Turn("g", turns()[0].messages, options(spec)), timeout_s=120))
        pipeline.end_session("g")
        assert (greedy.text_ids, greedy.codes) != (alone[0].text_ids, alone[0].codes)


def test_default_config_equals_graphs_off_and_no_decode_step(pipeline, baseline):
    """The default config (fixed-shape decode steps: CUDA graphs on CUDA, the same steps eagerly on CPU) gives
    what graphs off with no decode step gives: a stage's `graph_context` of 1 token sends every longer row down
    the path its fixed-shape decode cannot take (the stage's other step); counting the fixed-shape decodes
    shows which path ran."""
    spec = pipeline.spec
    overrides = {s.name: {"graph_context": 1} for s in pipeline.stages}
    runs = [(f"e{i}", user(spec, text, 0.7, seed=20 + i), options(spec, None if i == 0 else 30 + i))
            for i, text in enumerate(TEXTS[:2])]
    with registry.build_pipeline(spec.tiny, graphs=False, **overrides) as plain:
        results = {}
        for name, p in (("default", pipeline), ("plain", plain)):
            with counting_fixed_shape_decodes(p) as decodes:
                results[name] = [outcome(p.run(Turn(sid, [m], o), timeout_s=120)) for sid, m, o in runs]
                for sid, _, _ in runs:
                    p.end_session(sid)
                p.sync()
            results[name + " decodes"] = decodes
        assert not any(plain.kv_check().values())
    assert results["default decodes"] and all(results["default decodes"].values())  # every decode stage took some
    assert not any(results["plain decodes"].values())
    for a, b in zip(results["default"], results["plain"], strict=True):
        assert a.same_tokens(b) and a.text_ids
        np.testing.assert_array_equal(a.pcm, b.pcm)


@contextmanager
def counting_fixed_shape_decodes(p: Pipeline) -> Iterator[dict[str, int]]:
    """Batches each stage's fixed-shape decode (pipelines.model_runner.DecodeModel) took, while inside."""
    counts: dict[str, int] = {}
    models = [s.runner.model for s in p.stages if getattr(s.runner.model, "decode", None) is not None]
    for stage in p.stages:
        model = stage.runner.model
        if model not in models:
            continue
        counts[stage.name] = 0

        def counted(works, decode=model.decode, name=stage.name) -> bool:
            took = decode(works)
            counts[name] += bool(took)
            return took

        model.decode = counted  # the real step still runs: this only counts
    try:
        yield counts
    finally:
        p.sync()
        for model in models:
            del model.decode


def test_audio_chunks_follow_the_spec(pipeline, baseline):
    spec = pipeline.spec
    events = pipeline.run(Turn("a", [user(spec, TEXTS[1], 1.0, seed=3)], options(spec, max_frames=4)), 120)
    pipeline.end_session("a")
    done = events[-1]
    assert isinstance(done, TurnDone), done
    if spec.text_out:
        deltas = [e for e in events if isinstance(e, TextDelta)]
        assert [i for e in deltas for i in e.token_ids] == list(done.text_ids) and done.text_ids
        assert "".join(e.text for e in deltas) == done.text
    chunks = [e for e in events if isinstance(e, AudioChunk)]
    if not spec.speaks:
        assert not chunks and done.codes == () and done.usage.audio_frames == 0
        return
    assert chunks and all(c.rate == spec.output_rate for c in chunks)
    frames = [c.frames for c in chunks]
    assert frames == sorted(set(frames)) and frames[-1] == len(done.codes) == done.usage.audio_frames
    # each chunk holds its new frames' samples; only the first may hold fewer (a decoder's look-ahead)
    assert 0 < len(chunks[0].pcm) <= chunks[0].frames * spec.frame_samples
    for prev, c in zip(chunks, chunks[1:], strict=False):
        assert len(c.pcm) == (c.frames - prev.frames) * spec.frame_samples
    assert all(c.pcm.dtype == np.float32 and np.abs(c.pcm).max() <= 1.0 for c in chunks)


def test_requests_the_model_cannot_serve_are_refused(pipeline, baseline):
    spec = pipeline.spec
    bad = [Turn("r0", [user(spec, "hi")], GenerationOptions(audio=True, voice="no-such-voice", max_text_tokens=2)),
           Turn("r1", [], options(spec))]
    if not spec.speaks:
        bad.append(Turn("r2", [user(spec, "hi")], GenerationOptions(audio=True, max_text_tokens=2)))
    for t in bad:
        events = pipeline.run(t, timeout_s=60)
        assert len(events) == 1 and isinstance(events[0], TurnError), events
        assert events[0].code == "invalid_request" and events[0].message
    for i, voice in enumerate(spec.voices):  # every declared voice is served, named in any case
        done = pipeline.run(Turn(f"v{i}", [user(spec, "hi")], options(spec, voice=voice.upper(), max_frames=1)), 120)
        assert isinstance(done[-1], TurnDone), done[-1]
    for s in ["r0", "r1", "r2"] + [f"v{i}" for i in range(len(spec.voices))]:
        pipeline.end_session(s)


def but_the_session(counters: dict) -> dict:
    """The live counters less what a session keeps between its turns (its cached conversation)."""
    return {k: v for k, v in counters.items() if k not in ("sessions", "kv_blocks")}


def first_output(spec) -> type:
    return AudioChunk if spec.speaks else TextDelta


def test_normal_completion_frees_everything(pipeline, baseline):
    spec = pipeline.spec
    done = pipeline.run(Turn("n", [user(spec, TEXTS[0], 0.6, seed=4)], options(spec)), 120)[-1]
    assert isinstance(done, TurnDone) and done.status in ("completed", "length")
    pipeline.end_session("n")


def test_abort_mid_turn_frees_the_turn_and_the_session_goes_on(pipeline, baseline):
    spec = pipeline.spec

    async def abort_after_first_output() -> list:
        events = []
        async for e in pipeline.submit(Turn("x", [user(spec, TEXTS[2], 1.0, seed=5)], options(spec, **LONG))):
            events.append(e)
            if isinstance(e, first_output(spec)):
                pipeline.abort(e.turn_id)
        return events

    events = asyncio.run(abort_after_first_output())
    done = events[-1]
    assert isinstance(done, TurnDone) and done.status == "cancelled"
    assert len(done.text_ids) < LONG["max_text_tokens"]
    assert but_the_session(live(pipeline)) == but_the_session(baseline)
    after = pipeline.run(Turn("x", [user(spec, "And then?")], options(spec)), 120)[-1]
    assert isinstance(after, TurnDone)
    if spec.text_out:  # a model that converses kept the conversation so far cached (one that reads aloud keeps none)
        assert after.usage.cached_tokens > 0
    pipeline.end_session("x")


def test_end_session_mid_turn_frees_everything(pipeline, baseline):
    spec = pipeline.spec

    async def end_after_first_output() -> list:
        events = []
        async for e in pipeline.submit(Turn("y", [user(spec, TEXTS[2], 1.0, seed=6)], options(spec, **LONG))):
            events.append(e)
            if isinstance(e, first_output(spec)):
                pipeline.end_session("y")
        return events

    events = asyncio.run(end_after_first_output())
    assert isinstance(events[-1], TurnDone) and events[-1].status == "cancelled"
    assert len(events[-1].text_ids) < LONG["max_text_tokens"]


def test_a_reader_that_walks_away_aborts_its_turn(pipeline, baseline):
    spec = pipeline.spec

    async def walk_away() -> None:
        stream = pipeline.submit(Turn("w", [user(spec, TEXTS[2], 1.0, seed=7)], options(spec, **LONG)))
        async for e in stream:
            if isinstance(e, first_output(spec)):
                break
        await stream.aclose()

    asyncio.run(walk_away())
    assert but_the_session(live(pipeline)) == but_the_session(baseline)
    pipeline.end_session("w")
