"""The runtime on the built-in tiny model: batching, streaming, abort, memory pressure, bad input."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from models.qwen3_omni.placement import PipelineConfig
from models.qwen3_omni.program import build_pipeline
from pipelines.types import AudioChunk, GenerationOptions, Message, TextDelta, Turn, TurnDone, TurnError

OPTS = GenerationOptions(greedy=True, max_text_tokens=6, max_frames=4)


def noise(seconds: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(int(seconds * 16000), generator=g) * 0.1


def turn(session: str, seconds: float, seed: int, opts: GenerationOptions = OPTS, text: str = "") -> Turn:
    return Turn(session, [Message("user", text, noise(seconds, seed))], opts)


def summary(events: list) -> tuple:
    done = events[-1]
    assert isinstance(done, TurnDone), done
    wav = np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)])
    return done.text_ids, done.codes, wav


@pytest.fixture(scope="module")
def pipeline():
    with build_pipeline(PipelineConfig()) as p:
        yield p


@pytest.fixture(autouse=True)
def back_to_zero(request):
    """After each test on the shared pipeline: every turn ended once, and nothing is left behind."""
    yield
    if "pipeline" in request.fixturenames:
        p = request.getfixturevalue("pipeline")
        p.sync()
        stats = p.stats()
        assert stats["turns_started"] == stats["turns_ended"] and stats["turns_active"] == stats["sessions"] == 0
        assert set(stats["works"].values()) == set(stats["kv_blocks"].values()) == {0}, stats
        assert set(stats["stream_slots"].values()) == {0}, stats


def blocks_in_use(p) -> dict[str, int]:
    p.sync()
    return p.program.kv_check()


async def collect(p, t: Turn) -> list:
    return [e async for e in p.submit(t)]


async def _all(p, turns: list[Turn]) -> list[list]:
    return await asyncio.gather(*(collect(p, t) for t in turns))


def test_batched_turns_equal_each_alone(pipeline):
    turns = [turn(f"b{i}", sec, i) for i, sec in enumerate([0.6, 1.3, 2.1, 0.9, 1.7])]
    alone = [summary(pipeline.run(t, timeout_s=120)) for t in turns]
    for t in turns:
        pipeline.end_session(t.session_id)

    async def together():
        again = [Turn(t.session_id, t.messages, t.options) for t in turns]
        return await asyncio.gather(*(collect(pipeline, t) for t in again))

    batched = [summary(ev) for ev in asyncio.run(together())]
    steps = pipeline.program.by_name["talker"].runner.steps
    for (ids_a, codes_a, wav_a), (ids_b, codes_b, wav_b) in zip(alone, batched, strict=True):
        assert ids_a == ids_b and codes_a == codes_b
        # Code2Wav decodes the sessions in one batch: float32 convs round differently per batch size, and
        # random weights amplify that (the batched decoder is exact in float64: test_code2wav_batch.py)
        np.testing.assert_allclose(wav_a, wav_b, atol=5e-3)
    assert steps < 2 * 5 * (OPTS.max_frames + 1)  # the talker really batched the five turns
    for t in turns:
        pipeline.end_session(t.session_id)
    assert blocks_in_use(pipeline) == {"talker": 0, "thinker": 0}


def test_a_steps_events_reach_the_listener_in_one_wake_up(pipeline):
    """The engine hands each stage step's events to a listener's loop at once: four turns' audio chunks of one
    Code2Wav step wake the loop once (each wake-up a write to the loop's socket), and each turn's events are the
    blocking run's, in order."""
    turns = [turn(f"w{i}", 1.0, 7 + i) for i in range(4)]
    want = [pipeline.run(t, timeout_s=120) for t in turns]
    for t in turns:
        pipeline.end_session(t.session_id)

    async def listen() -> tuple[list[list], int]:
        loop = asyncio.get_running_loop()
        wakeups, call = 0, loop.call_soon_threadsafe

        def counted(*args):
            nonlocal wakeups
            wakeups += 1
            return call(*args)

        loop.call_soon_threadsafe = counted
        try:
            again = [Turn(t.session_id, t.messages, t.options) for t in turns]
            return await asyncio.gather(*(collect(pipeline, t) for t in again)), wakeups
        finally:
            del loop.call_soon_threadsafe

    got, wakeups = asyncio.run(listen())
    for t in turns:
        pipeline.end_session(t.session_id)
    for g, w in zip(got, want, strict=True):
        assert [type(e) for e in g] == [type(e) for e in w] and summary(g)[:2] == summary(w)[:2]
    events = sum(len(g) for g in got)
    assert sum(isinstance(e, AudioChunk) for g in got for e in g) == 4 * OPTS.max_frames
    assert 2 <= wakeups <= events // 2, (wakeups, events)


def test_text_streams_before_the_turn_ends_and_text_only_turns(pipeline):
    events = pipeline.run(turn("t", 1.0, 5, GenerationOptions(greedy=True, audio=False, max_text_tokens=5)))
    assert [type(e) for e in events] == [TextDelta] * 5 + [TurnDone]
    assert events[-1].codes == () and events[-1].usage.audio_frames == 0
    assert list(events[-1].text_ids) == [i for e in events[:-1] for i in e.token_ids]
    pipeline.end_session("t")


def test_abort_mid_stream_frees_kv(pipeline):
    long = GenerationOptions(greedy=True, max_text_tokens=400, max_frames=400)

    async def abort_after_first_audio():
        events = []
        async for e in pipeline.submit(turn("x", 1.0, 6, long)):
            events.append(e)
            if isinstance(e, AudioChunk):
                pipeline.abort(e.turn_id)
        return events

    events = asyncio.run(abort_after_first_audio())
    assert isinstance(events[-1], TurnDone) and events[-1].status == "cancelled"
    assert len(events[-1].codes) < 400
    used = blocks_in_use(pipeline)
    assert used["talker"] == 0 and used["thinker"] > 0  # the conversation so far stays cached
    pipeline.end_session("x")
    assert blocks_in_use(pipeline) == {"talker": 0, "thinker": 0}


def test_consumer_that_stops_reading_aborts_the_turn(pipeline):
    long = GenerationOptions(greedy=True, max_text_tokens=400, max_frames=400)

    async def walk_away():
        stream = pipeline.submit(turn("w", 1.0, 7, long))
        async for e in stream:
            if isinstance(e, AudioChunk):
                break
        await stream.aclose()

    asyncio.run(walk_away())
    assert blocks_in_use(pipeline)["talker"] == 0
    assert pipeline.program.sessions["w"].turn is None
    pipeline.end_session("w")
    assert blocks_in_use(pipeline) == {"talker": 0, "thinker": 0}


def test_bad_input_gives_errors_and_the_pipeline_keeps_working(pipeline):
    bad = [
        Turn("e1", [], OPTS),
        Turn("e2", [Message("user", "hi")], GenerationOptions(voice="nobody")),
        Turn("e3", [Message("user", "", torch.zeros(100))], OPTS),  # shorter than one STFT window
    ]
    for t in bad:
        events = pipeline.run(t, timeout_s=60)
        assert len(events) == 1 and isinstance(events[0], TurnError) and events[0].code == "invalid_request"
    ok = pipeline.run(turn("e4", 0.5, 8), timeout_s=120)
    assert isinstance(ok[-1], TurnDone)
    for s in ("e1", "e2", "e3", "e4"):
        pipeline.end_session(s)


def test_one_active_turn_per_session(pipeline):
    long = GenerationOptions(greedy=True, max_text_tokens=50, max_frames=30)

    async def two():
        first = pipeline.submit(turn("busy", 1.0, 9, long))
        second = await collect(pipeline, turn("busy", 1.0, 10))
        rest = [e async for e in first]
        return second, rest

    second, rest = asyncio.run(two())
    assert isinstance(second[0], TurnError) and second[0].code == "session_busy"
    assert isinstance(rest[-1], TurnDone)
    pipeline.end_session("busy")


def test_memory_pressure_evicts_and_recomputes_without_changing_answers():
    roomy = PipelineConfig()
    # 5 blocks of 16 tokens. Sequential: a session needs 20-45 tokens, so three cannot all stay cached
    # (idle ones are evicted). Concurrent: three 36-token turns grow past the cache while decoding, so
    # running ones are preempted and recomputed from their history.
    tight = PipelineConfig.on("tiny", "cpu", thinker={"kv_blocks": 5}, talker={"kv_blocks": 6})
    script = [("m0", 0.5, 11), ("m1", 0.7, 12), ("m2", 0.6, 13), ("m0", 0.4, 14), ("m1", 0.5, 15), ("m2", 0.3, 16)]
    together = [("c0", 1.5, 21), ("c1", 1.5, 22), ("c2", 1.5, 23)]
    results, counts = {}, {}
    for name, cfg in (("roomy", roomy), ("tight", tight)):
        with build_pipeline(cfg) as p:
            seq = [summary(p.run(turn(s, sec, seed), timeout_s=120)) for s, sec, seed in script]
            p.sync()
            evicted = p.program.by_name["thinker"].scheduler.evictions
            conc = [summary(ev) for ev in asyncio.run(_all(p, [turn(s, sec, seed) for s, sec, seed in together]))]
            p.sync()
            p.program.kv_check()
            sched = p.program.by_name["thinker"].scheduler
            results[name], counts[name] = seq + conc, (evicted, sched.preemptions)
            if name == "tight":
                too_long = p.run(turn("huge", 14.0, 17), timeout_s=120)
                after = p.run(turn("m0", 0.3, 18), timeout_s=120)
    for (ids_a, codes_a, wav_a), (ids_b, codes_b, wav_b) in zip(results["roomy"], results["tight"], strict=True):
        assert ids_a == ids_b and codes_a == codes_b
        # Code2Wav decodes the sessions in one batch: float32 convs round differently per batch size, and
        # random weights amplify that (the batched decoder is exact in float64: test_code2wav_batch.py)
        np.testing.assert_allclose(wav_a, wav_b, atol=5e-3)
    assert counts["roomy"] == (0, 0)
    assert counts["tight"][0] > 0 and counts["tight"][1] > 0
    assert isinstance(too_long[-1], TurnError) and too_long[-1].code == "context_too_long"
    assert isinstance(after[-1], TurnDone)


def test_a_failing_model_step_fails_only_its_turns(pipeline, monkeypatch):
    talker = pipeline.program.by_name["talker"].runner.model
    real_run = type(talker).run
    calls = {"n": 0}

    def flaky(self, works, lengths, prefill):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected fault")
        return real_run(self, works, lengths, prefill)

    monkeypatch.setattr(type(talker), "run", flaky)
    failed = pipeline.run(turn("f1", 0.5, 19), timeout_s=120)
    assert isinstance(failed[-1], TurnError) and failed[-1].code == "internal_error"
    assert "injected fault" in failed[-1].message
    ok = pipeline.run(turn("f2", 0.5, 20), timeout_s=120)  # the engine and the next turn carry on
    assert isinstance(ok[-1], TurnDone)
    assert blocks_in_use(pipeline)["talker"] == 0
    pipeline.error = None
    for s in ("f1", "f2"):
        pipeline.end_session(s)
    assert blocks_in_use(pipeline) == {"talker": 0, "thinker": 0}
