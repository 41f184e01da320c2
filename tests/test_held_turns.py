"""Held turns on the built-in tiny model: started before the commit, then released or discarded.

A discarded one leaves the session, KV caches, slots and counters exactly as before and emits nothing;
a released one delivers exactly what the same turn run committed delivers; held work never runs while
another session's committed work is waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from models.qwen3_omni.placement import PipelineConfig
from models.qwen3_omni.program import build_pipeline
from pipelines.types import AudioChunk, GenerationOptions, TextDelta, TurnDone, TurnError
from tests.test_pipeline import OPTS, collect, turn

LONG = GenerationOptions(greedy=True, max_text_tokens=400, max_frames=400)


@pytest.fixture(scope="module")
def pipeline():
    with build_pipeline(PipelineConfig()) as p:
        yield p


def state(p, session_id: str) -> dict:
    """Everything a turn may change, read on the engine thread."""

    def read() -> dict:
        prog = p.program
        stats = prog.counters()
        for key in ("held_released", "held_discarded"):
            stats.pop(key)
        s = prog.sessions.get(session_id)
        stats["kv_check"] = prog.kv_check()
        if s is not None:
            kv = prog.by_name["thinker"].kv
            stats["session"] = (list(s.ids), s.embeds.all().clone(), s.talker_users.n, s.talker_done_upto,
                                sorted(s.replies), kv.length(s.kv_key), list(kv.seqs[s.kv_key].blocks))
        return stats

    p.sync()
    return p.request(read).result(30)


def same(a: dict, b: dict) -> None:
    sa, sb = a.pop("session", None), b.pop("session", None)
    assert a == b
    assert (sa is None) == (sb is None)
    if sa is not None:
        assert sa[0] == sb[0] and sa[2:] == sb[2:]
        assert sa[1].shape == sb[1].shape and bool((sa[1] == sb[1]).all())


def waiting(p, turn_id: str) -> int:
    """Events a held turn has made so far (kept back)."""
    return p.request(lambda: len(p.program.held[turn_id].gate.waiting)).result(30)


async def hold_then_discard(p, t, min_events: int) -> list:
    """Start `t` held, let it make at least `min_events` events, discard it; what the stream delivered."""
    stream = p.submit(t, held=True)
    got: list = []

    async def read() -> None:
        async for e in stream:
            got.append(e)

    reader = asyncio.create_task(read())
    deadline = time.monotonic() + 120
    while waiting(p, t.turn_id) < min_events:
        assert time.monotonic() < deadline, "the held turn made no progress"
        await asyncio.sleep(0.02)
    assert await asyncio.wrap_future(p.discard(t.turn_id))
    await asyncio.sleep(0.3)  # anything it still sent would have arrived by now
    reader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reader
    await stream.aclose()
    return got


def test_discarded_turn_leaves_everything_as_before_and_emits_nothing(pipeline):
    p = pipeline
    first = asyncio.run(collect(p, turn("d", 1.0, 1, OPTS)))
    assert isinstance(first[-1], TurnDone)
    before = state(p, "d")
    held = turn("d", 1.5, 2, LONG)
    got = asyncio.run(hold_then_discard(p, held, min_events=8))  # mid-reply: text and audio were made
    assert got == []
    after = state(p, "d")
    same(before, after)
    assert p.stats()["held"] == 0 and p.stats()["held_discarded"] >= 1
    # the conversation goes on exactly as if the held turn had never been: same as a session without it
    nxt = asyncio.run(collect(p, turn("d", 1.0, 3, OPTS)))
    ref = [asyncio.run(collect(p, turn("r", s, seed, OPTS))) for s, seed in ((1.0, 1), (1.0, 3))]
    assert nxt[-1].text_ids == ref[1][-1].text_ids and nxt[-1].codes == ref[1][-1].codes
    assert nxt[-1].usage == ref[1][-1].usage
    for sid in ("d", "r"):
        p.end_session(sid)


def test_discarded_first_turn_of_a_session_leaves_no_session(pipeline):
    p = pipeline
    before = state(p, "n")
    assert "session" not in before
    got = asyncio.run(hold_then_discard(p, turn("n", 1.0, 4, LONG), min_events=3))
    assert got == []
    same(before, state(p, "n"))


def test_a_discarded_turn_that_had_finished_is_undone_too(pipeline):
    p = pipeline
    asyncio.run(collect(p, turn("f", 1.0, 5, OPTS)))
    before = state(p, "f")
    t = turn("f", 1.0, 6, OPTS)

    async def run() -> list:
        stream = p.submit(t, held=True)
        deadline = time.monotonic() + 120
        while not p.request(lambda: t.turn_id not in p.program.turns and t.turn_id in p.program.held).result(30):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        assert isinstance(p.request(lambda: p.program.held[t.turn_id].gate.waiting[-1]).result(30), TurnDone)
        assert await asyncio.wrap_future(p.discard(t.turn_id))
        await stream.aclose()
        return []

    asyncio.run(run())
    same(before, state(p, "f"))
    p.end_session("f")


def test_released_turn_delivers_what_the_committed_turn_delivers(pipeline):
    p = pipeline
    committed = asyncio.run(collect(p, turn("c", 1.0, 7, OPTS)))

    async def held_run(release_after: int) -> tuple[list, float]:
        t = turn("h", 1.0, 7, OPTS)
        stream = p.submit(t, held=True)
        deadline = time.monotonic() + 120
        while waiting(p, t.turn_id) < release_after:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        start = time.perf_counter()
        assert await asyncio.wrap_future(p.release(t.turn_id))
        events, first_audio = [], None
        async for e in stream:
            if isinstance(e, AudioChunk) and first_audio is None:
                first_audio = time.perf_counter() - start
            events.append(e)
        return events, first_audio

    events, first_audio = asyncio.run(held_run(release_after=3))
    assert isinstance(events[-1], TurnDone) and events[-1].status == committed[-1].status
    assert [type(e) for e in events] == [type(e) for e in committed]
    assert events[-1].text_ids == committed[-1].text_ids and events[-1].codes == committed[-1].codes
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "".join(e.text for e in committed if isinstance(e, TextDelta))
    assert first_audio is not None and first_audio < 0.5  # made before the release: it flows at once
    stats = p.stats()
    assert stats["held"] == 0 and stats["held_released"] >= 1
    assert stats["turns_started"] == stats["turns_ended"]
    for sid in ("c", "h"):
        p.end_session(sid)


def test_one_held_turn_per_session_and_no_committed_turn_beside_it(pipeline):
    p = pipeline

    async def run() -> tuple[list, list]:
        held = turn("b", 1.0, 8, LONG)
        stream = p.submit(held, held=True)
        second = await collect(p, turn("b", 1.0, 9, OPTS, ))
        third = [e async for e in p.submit(turn("b", 1.0, 9, OPTS), held=True)]
        assert await asyncio.wrap_future(p.discard(held.turn_id))
        await stream.aclose()
        return second, third

    second, third = asyncio.run(run())
    for events in (second, third):
        assert len(events) == 1 and isinstance(events[0], TurnError) and events[0].code == "session_busy"
    stats = p.stats()
    assert stats["held"] == 0 and stats["sessions"] == 0 and stats["turns_started"] == stats["turns_ended"]


def test_held_work_never_runs_while_committed_work_is_ready(pipeline, monkeypatch):
    """Every batch is recorded: between the committed turn's first and last batch no held work runs, and
    the committed turn takes the same batches as alone; the held turn goes on afterwards."""
    p = pipeline
    batches: list[tuple[str, tuple[str, ...], bool]] = []
    for stage in p.stages:
        run = stage.runner.run

        def recording(batch, run=run, name=stage.name):
            batches.append((name, tuple(w.key for w in batch.works), any(w.held for w in batch.works)))
            return run(batch)

        monkeypatch.setattr(stage.runner, "run", recording)

    alone = turn("a", 1.0, 10, OPTS)
    asyncio.run(collect(p, alone))
    alone_batches = [(n, len(k)) for n, k, _ in batches]
    p.end_session("a")
    batches.clear()

    async def run() -> tuple[list, list]:
        held = turn("x", 1.5, 11, GenerationOptions(greedy=True, max_text_tokens=30, max_frames=30))
        stream = p.submit(held, held=True)
        while waiting(p, held.turn_id) < 2:  # the held turn is generating
            await asyncio.sleep(0.01)
        committed = await collect(p, turn("a", 1.0, 10, OPTS))
        assert await asyncio.wrap_future(p.release(held.turn_id))
        rest = [e async for e in stream]
        return committed, rest

    committed, rest = asyncio.run(run())
    assert isinstance(committed[-1], TurnDone) and isinstance(rest[-1], TurnDone)
    mine = [i for i, (_, keys, _) in enumerate(batches) if any(k.endswith(("thinker:a", committed[-1].turn_id))
                                                             for k in keys)]
    window = batches[mine[0] : mine[-1] + 1]
    assert not [b for b in window if b[2]], "held work ran while a committed turn was under way"
    assert [(n, len(k)) for n, k, _ in window] == alone_batches
    assert any(b[2] for b in batches[: mine[0]])  # the held turn did run before the committed one came
    for sid in ("a", "x"):
        p.end_session(sid)
