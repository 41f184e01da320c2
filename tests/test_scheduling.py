"""Who runs when: the thinker paced by the stream that speaks its reply (it keeps TEXT_LEAD tokens ahead, no more),
a stream near its playback deadline served before a new prefill, and new turns admitted only while the engine
keeps its streams fed. The tiny model, stepped stage by stage on the test's thread."""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import pytest
import torch

from models.common.code2wav_step import Code2WavWork
from models.common.speaking import TEXT_LEAD
from models.qwen3_omni.placement import PipelineConfig
from models.qwen3_omni.program import build_pipeline
from pipelines.admission import FED_S, Admission
from pipelines.scheduler import URGENT_S, Scheduler
from pipelines.types import GenerationOptions, TurnDone
from tests.test_pipeline import turn


def stepper():
    """A pipeline whose engine thread is not started: the test steps its stages."""
    p = build_pipeline(PipelineConfig())
    return p, {s.name: s for s in p.stages}


def started(session: str, seed: int, opts: GenerationOptions) -> tuple:
    """A stepped pipeline with one turn started: (pipeline, its stages by name, the turn's events)."""
    p, s = stepper()
    events: list = []
    with torch.inference_mode():
        p.program.start_turn(turn(session, 1.0, seed, opts), events.append)
    return p, s, events


def run_to_end(p, events: list, limit: int = 2000) -> TurnDone:
    for _ in range(limit):
        if events and isinstance(events[-1], TurnDone):
            return events[-1]
        p._iterate()
    raise AssertionError(f"no TurnDone after {limit} iterations: {events[-3:]}")


def until_first_audio(p, state, limit: int = 500) -> None:
    for _ in range(limit):
        if state.t_first_audio is not None:
            return
        p._iterate()
    raise AssertionError(f"no audio after {limit} iterations")


def test_thinker_keeps_only_text_lead_tokens_ahead_of_the_talker():
    p, s, events = started("a", 3, GenerationOptions(greedy=True, max_text_tokens=60, max_frames=60))
    state = p.program.sessions["a"].turn
    for _ in range(30):  # the talker has not taken its prompt: the thinker stops at the token it starts on
        s["audio_encoder"].step()
        s["thinker"].step()
    assert len(state.reply_ids) == 1 and not state.thinker_done
    assert not s["thinker"].step()  # its next decode would share the GPU with the talker's prefill
    assert s["talker"].step() and len(state.codes) == 1  # the prefill's frame (the next needs token 1)
    for _ in range(30):  # the talker does not read on: the thinker stops TEXT_LEAD tokens past what it read
        s["thinker"].step()
    assert len(state.reply_ids) == TEXT_LEAD + 1 and not state.thinker_done
    assert not s["thinker"].step()  # nothing to run: it waits for the talker
    for _ in range(7):  # each frame made reads a token and lets the thinker make one more, and only one
        assert s["talker"].step()
        for _ in range(3):
            s["thinker"].step()
        assert len(state.reply_ids) == TEXT_LEAD + len(state.codes)
    assert len(state.codes) >= 7
    done = run_to_end(p, events)
    assert done.status in ("completed", "length") and len(done.codes) > 7
    p.program.end_session("a")


def test_a_talker_that_has_stopped_no_longer_holds_the_thinker_back():
    p, _, events = started("b", 4, GenerationOptions(greedy=True, max_text_tokens=30, max_frames=2))
    done = run_to_end(p, events)
    assert len(done.codes) == 2 and len(done.text_ids) > TEXT_LEAD + 2  # written on after the speech ended
    p.program.end_session("b")


def test_text_only_turn_is_not_paced():
    p, s, events = started("c", 5, GenerationOptions(greedy=True, max_text_tokens=20, audio=False))
    for _ in range(25):
        s["audio_encoder"].step()
        s["thinker"].step()
    assert p.program.sessions["c"].turn is None and isinstance(events[-1], TurnDone)
    assert len(events[-1].text_ids) > TEXT_LEAD


class Stream:
    """A work in the scheduler's eyes: pending inputs and seconds of audio left."""

    held = keep_kv = False

    def __init__(self, key: str, pending: int, urgency: float) -> None:
        self.key, self.n, self.left = key, pending, urgency

    def pending(self) -> int:
        return self.n

    def urgency(self) -> float:
        return self.left

    def fail(self, code: str, message: str) -> None:
        raise AssertionError(f"{self.key} failed: {code} {message}")


def test_a_stream_near_its_deadline_is_served_before_a_new_prefill():
    sched = Scheduler(None, max_batch=8)
    playing = Stream("playing", 1, 5.0)
    new = Stream("new", 120, -0.01)
    sched.add(playing), sched.add(new)
    batch = sched.schedule()
    assert batch.prefill and batch.works == [new]  # plenty buffered: the newcomer's first audio comes first
    playing.left = URGENT_S / 2
    batch = sched.schedule()
    assert not batch.prefill and batch.works == [playing]
    late = Stream("late", 1, URGENT_S / 4)
    sched.add(late)
    assert sched.schedule().works == [late, playing]  # decodes most urgent first


class Playing:
    """A stream in admission's eyes: playing since `started`, with `buffered` seconds left."""

    def __init__(self, buffered: float | None) -> None:
        self.t_first_audio = None if buffered is None else time.perf_counter()
        self.buffered = buffered

    def urgency(self) -> float:
        return -1.0 if self.buffered is None else self.buffered - (time.perf_counter() - self.t_first_audio)


def test_admission_starts_a_turn_at_once_only_while_the_playing_streams_are_fed():
    started: list[str] = []
    a = Admission(max_wait_s=60)
    a.offer("t1", lambda: started.append("t1"), [Playing(None), Playing(FED_S * 30), Playing(-0.5)])
    # one not playing yet and one already behind its listener have no say
    assert started == ["t1"]
    low = Playing(FED_S / 2)
    a.offer("t2", lambda: started.append("t2"), [low])
    a.offer("t3", lambda: started.append("t3"), [Playing(5.0)])  # fed, but t2 waits before it: it queues
    a.admit([low])
    assert started == ["t1"] and a.counters()["turns_waiting"] == 2
    low.buffered = FED_S * 20
    a.admit([low])
    assert started == ["t1", "t2", "t3"]  # together, oldest first
    c = a.counters()
    assert c["turns_waiting"] == 0 and c["turns_waited"] == 2 and c["admission_wait_s"] > 0


def test_admission_gives_a_stream_no_say_until_it_has_played_settle_s():
    started: list[str] = []
    a = Admission(max_wait_s=60, settle_s=0.05)
    new = Playing(FED_S / 2)  # its first frame alone: under FED_S, playing since just now
    a.offer("t1", lambda: started.append("t1"), [new])
    assert started == ["t1"]
    new.buffered += 0.06
    time.sleep(0.06)  # still as short of audio, but settled: now it holds the next turn back
    a.offer("t2", lambda: started.append("t2"), [new])
    assert started == ["t1"] and a.counters()["turns_waiting"] == 1


def test_admission_never_waits_past_its_cap():
    started: list[str] = []
    a = Admission(max_wait_s=0.05)
    starving = [Playing(FED_S * 0.99)]  # still ahead of its listener after the cap
    a.offer("t", lambda: started.append("t"), starving)
    a.admit(starving)
    assert not started
    time.sleep(0.06)
    a.admit(starving)
    assert started == ["t"]


def behind_a_dry_stream(seed: int) -> tuple:
    """Turn a is short of audio (under admission's fed_s, still ahead of its listener) when turn b starts: b waits
    at admission. (pipeline, a's events, b's
    events, the KV blocks in use before b)."""
    p, _, first = started("a", seed, GenerationOptions(greedy=True, max_text_tokens=40, max_frames=40))
    second: list = []
    a = p.program.sessions["a"].turn
    until_first_audio(p, a)
    p.program.admission.fed_s = 60.0  # a slow machine cannot outrun it: a is short of this until it ends
    a.t_first_audio -= a.urgency() - 30.0
    assert 0 < a.urgency() < p.program.admission.fed_s
    before = p.program.kv_check()
    with torch.inference_mode():
        p.program.start_turn(turn("b", 1.0, seed + 1), second.append)
    assert p.program.counters()["turns_waiting"] == 1
    return p, first, second, before


def test_a_turn_waits_while_a_playing_stream_runs_low_then_starts_and_finishes():
    p, first, second, _ = behind_a_dry_stream(6)
    late = p.program.sessions["b"].turn
    assert not any(w.turn is late for stage in p.stages for w in stage.scheduler.works)  # not in any stage
    run_to_end(p, second)  # the turn starts once a has ended or the wait reached its cap
    assert isinstance(second[-1], TurnDone) and second[-1].status in ("completed", "length")
    c = p.program.counters()
    assert c["turns_waiting"] == 0 and c["turns_waited"] == 1 and c["admission_wait_s"] > 0
    run_to_end(p, first)
    for sid in ("a", "b"):
        p.program.end_session(sid)


def test_a_waiting_turn_cancelled_leaves_nothing_behind():
    p, first, second, before = behind_a_dry_stream(8)
    p.program.sessions["b"].turn.finish("cancelled")
    assert second[-1].status == "cancelled"
    c = p.program.counters()
    assert c["turns_waiting"] == 0 and c["turns_active"] == 1 and p.program.kv_check() == before
    run_to_end(p, first)
    p.program.end_session("a")
    p.program.end_session("b")
    assert p.program.kv_check() == {name: 0 for name in before}


def test_a_new_turn_is_encoded_beside_a_stream_near_dry_in_another_stage():
    """Stream a has FED_S..URGENT_S buffered: a new turn is admitted and its audio is encoded in the same engine
    round as a's next frame (the encoder's step takes none of the talker's), then both finish."""
    p, _, first = started("a", 10, GenerationOptions(greedy=True, max_text_tokens=60, max_frames=60))
    a = p.program.sessions["a"].turn
    until_first_audio(p, a)
    p._iterate()  # the overlapping thinker's next token reaches the talker a round later: now a's next frame can run
    a.t_first_audio -= a.urgency() - (FED_S + URGENT_S) / 2  # as if the listener had played it down to this
    assert FED_S < a.urgency() < URGENT_S
    second: list = []
    with torch.inference_mode():
        p.program.start_turn(turn("b", 1.0, 11), second.append)
    b = p.program.sessions["b"].turn
    assert p.program.counters()["turns_waiting"] == 0  # admitted: a is fed
    frames = len(a.codes)
    p._iterate()
    assert b.prompt_ready and len(a.codes) == frames + 1
    run_to_end(p, second)
    assert second[-1].status in ("completed", "length")
    run_to_end(p, first)
    for sid in ("a", "b"):
        p.program.end_session(sid)


def test_a_stream_near_dry_with_text_in_hand_does_not_hold_new_turns_thinker_prefills_back():
    """Stream a is near dry, but its talker has unread reply tokens, a frame each: its thinker's next token is not
    what a waits for, so a new turn's prefill takes the thinker's step (before, a's decode took it). The rule of a
    thinker that holds prefills back for near-dry streams: one whose launch does not decode them after a prefill."""
    p, s, first = started("a", 13, GenerationOptions(greedy=True, max_text_tokens=60, max_frames=60))
    s["thinker"].cfg = dataclasses.replace(s["thinker"].cfg, decode_after_prefill=False)
    s["thinker"].scheduler.urgent_s = URGENT_S
    a = p.program.sessions["a"].turn
    until_first_audio(p, a)
    thinker = next(w for stage, w in p.program.turns[a.turn_id][1] if stage is s["thinker"])
    for _ in range(2 * TEXT_LEAD):  # the thinker writes until it is TEXT_LEAD tokens ahead of the talker
        s["thinker"].step()
    assert thinker.pending() == 0
    s["talker"].step()  # the talker reads one: the thinker has one to write, TEXT_LEAD - 1 in hand
    unread = thinker.speaker.unread(len(a.reply_ids))
    assert thinker.pending() == 1 and unread >= TEXT_LEAD - 1
    a.t_first_audio -= a.urgency() - (FED_S + URGENT_S) / 2  # as if the listener had played it down to this
    assert 0 <= a.urgency() < URGENT_S
    assert thinker.urgency() == pytest.approx(a.urgency() + unread * 0.08, abs=0.01)
    second: list = []
    with torch.inference_mode():
        p.program.start_turn(turn("b", 1.0, 14), second.append)
    b = p.program.sessions["b"].turn
    s["audio_encoder"].step()
    assert b.prompt_ready and not b.reply_ids
    written = len(a.reply_ids)
    assert s["thinker"].step()
    assert len(b.reply_ids) == 1 and len(a.reply_ids) == written  # b's prefill ran, a's decode waits a step
    run_to_end(p, second)
    run_to_end(p, first)
    assert first[-1].status in ("completed", "length") and second[-1].status in ("completed", "length")
    for sid in ("a", "b"):
        p.program.end_session(sid)


def talker_prefill_pending(p, s, session: str, seed: int) -> object:
    """Start a turn in `session` and step the encoder and thinker until its talker has its prompt to prefill."""
    with torch.inference_mode():
        p.program.start_turn(turn(session, 1.0, seed), [].append)
    state = p.program.sessions[session].turn
    talker = next(w for stage, w in p.program.turns[state.turn_id][1] if stage is s["talker"])
    for _ in range(10):
        if talker.pending() > 1:
            return state
        s["audio_encoder"].step()
        s["thinker"].step()
    raise AssertionError("the new turn's talker never had its prompt")


def test_decode_after_prefill_keeps_the_playing_streams_round():
    """A talker launch that prefills a new turn: the playing stream a decodes in it only with decode_after_prefill
    (without, a's frame waits for the next round)."""
    p, s, first = started("a", 15, GenerationOptions(greedy=True, max_text_tokens=60, max_frames=60))
    a = p.program.sessions["a"].turn
    until_first_audio(p, a)
    a.t_first_audio += 5.0  # far from dry: new prefills go first
    for _ in range(2 * TEXT_LEAD):  # a's thinker writes its lead: a's talker has text for every round below
        s["thinker"].step()
    talker = s["talker"]
    for session, seed, after in (("b", 16, False), ("c", 17, True)):
        new = talker_prefill_pending(p, s, session, seed)
        talker.cfg = dataclasses.replace(talker.cfg, decode_after_prefill=after)
        frames = len(a.codes)
        assert talker.step()
        assert len(new.codes) >= 1 and len(a.codes) == frames + after
    assert run_to_end(p, first).status in ("completed", "length")
    for sid in ("a", "b", "c"):  # b's and c's turns are cancelled with their sessions
        p.program.end_session(sid)
    assert p.program.kv_check() == {"thinker": 0, "talker": 0}


def test_code2wav_decodes_a_stream_frames_behind_in_the_same_batch_as_the_others():
    """A talker launch can make a stream two frames (its prefill, then its decode): Code2Wav still takes it in
    its one batch of the round, a frame a row, instead of a batch of its own that waits behind urgent streams."""
    frame = torch.zeros(16, dtype=torch.long)
    turns = [SimpleNamespace(turn_id=k, frames_out=[frame] * n, finished=False, audio_done=False, talker_done=False,
                             held=False, urgency=lambda u=u: u) for k, n, u in (("behind", 2, 0.3), ("near", 1, 0.05))]
    sched = Scheduler(None, max_batch=8)
    works = [Code2WavWork(t) for t in turns]
    for w in works:
        sched.add(w)
    batch = sched.schedule()
    assert not batch.prefill and batch.works == works[::-1] and batch.lengths == [1, 1]


def test_with_play_ahead_s_a_stream_far_ahead_of_its_playback_waits():
    p, _, events = started("d", 12, GenerationOptions(greedy=True, max_text_tokens=80, max_frames=80))
    p.play_ahead_s = 0.3
    d = p.program.sessions["d"].turn
    until_first_audio(p, d)
    d.t_first_audio -= d.urgency() - 1.0  # as if the listener had 1 s buffered
    frames = len(d.codes)
    for _ in range(3):
        p._iterate()
    assert len(d.codes) == frames  # its talker waits while its playback catches up
    d.t_first_audio -= d.urgency() - 0.1
    p._iterate()
    assert len(d.codes) == frames + 1
    p.play_ahead_s = 0.0
    assert run_to_end(p, events).status in ("completed", "length")
    p.program.end_session("d")
