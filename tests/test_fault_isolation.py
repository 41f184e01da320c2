"""Fault isolation: one turn's bad input, bad output or failing step never fails, stalls or silences another.

Each test runs a bystander next to the victim: a normal audio turn in another session at the same time,
which must still end with audio and a TurnDone. After every test the program's counters are back to zero
(every started turn ended exactly once, no live work, no KV block in use) and the KV integrity check holds.

Faults are injected at three seams only, so that a redesign of the engine step keeps these tests (adapt the
helpers `fail_pending`, `fail_step` and `poison_rows` below, nothing else):
- `Stage.add`: the victim's Work gets a `pending` that raises as it is registered;
- `Stage.runner.run(batch)`: a stage's step raises when its batch holds the victim's work;
- `model.thinker.logits` / `model.talker.codec_logits`: the victim's row of a step's output becomes NaN.
A work is the victim's when its `key` names the victim's session or turn: both contain VICTIM.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from models.qwen3_omni.placement import PipelineConfig
from models.qwen3_omni.program import build_pipeline
from pipelines.types import AudioChunk, GenerationOptions, Message, ToolCall, Turn, TurnDone, TurnError, new_id

VICTIM, BYSTANDER, MATE = "victim", "bystander", "mate"  # MATE: a turn that runs as long as the victim's
OPTS = GenerationOptions(greedy=True, max_text_tokens=8, max_frames=8)
STAGES = ("audio_encoder", "thinker", "talker", "code2wav")


def noise(seconds: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(int(seconds * 16000), generator=g) * 0.1


def victim(messages: list[Message], opts: GenerationOptions = OPTS) -> Turn:
    return Turn(VICTIM, messages, opts, turn_id=new_id(f"{VICTIM}_turn"))


def spoken(session: str, seed: int, opts: GenerationOptions = OPTS) -> Turn:
    return Turn(session, [Message("user", "", noise(1.0, seed))], opts, turn_id=new_id(f"{session}_turn"))


def end_replies_early(p) -> None:
    """Random tiny weights never stop on their own, so no reply would end "completed". Make the bystander's
    reply end by itself: its thinker writes <|im_end|> where it would have written its third token, and its
    talker writes codec eos where it would have chosen its fourth frame's code. Each end id's output row
    becomes 1.001 x the row it replaces, so it wins exactly where that one would have (or on a near-tie)."""
    model, cfg = p.program.model, p.program.model.cfg

    def probe() -> TurnDone:
        done = p.run(spoken(BYSTANDER, 1), 120)[-1]
        p.end_session(BYSTANDER)
        assert isinstance(done, TurnDone) and done.status == "length", done
        return done

    def copy_row(weight: torch.Tensor, to: int, src: int) -> None:
        def edit() -> None:
            with torch.inference_mode():
                weight[to] = 1.001 * weight[src]

        p.request(edit).result(30)

    copy_row(model.thinker.lm_head.weight, cfg.im_end_token_id, probe().text_ids[2])
    copy_row(model.talker.codec_head.weight, cfg.talker.codec_eos_id, probe().codes[3][0])


@pytest.fixture(scope="module")
def pipeline():
    with build_pipeline(PipelineConfig()) as p:
        end_replies_early(p)
        yield p


@pytest.fixture(autouse=True)
def back_to_zero(pipeline):
    yield
    pipeline.sync()
    stats = pipeline.stats()
    assert stats["turns_started"] == stats["turns_ended"], stats  # each turn ended exactly once
    assert stats["turns_active"] == 0 and set(stats["works"].values()) == {0}, stats
    assert set(stats["stream_slots"].values()) == {0}, stats  # talker and Code2Wav stream state given back
    for s in (VICTIM, BYSTANDER, MATE):
        pipeline.end_session(s)
    stats = pipeline.stats()
    assert stats["sessions"] == 0 and set(stats["kv_blocks"].values()) == {0}, stats
    assert pipeline.request(pipeline.program.kv_check).result(30) == {"thinker": 0, "talker": 0}
    pipeline.error = None


async def _collect(p, t: Turn) -> list:
    return [e async for e in p.submit(t)]


def together(p, *turns: Turn) -> list[list]:
    async def go():
        return await asyncio.gather(*(_collect(p, t) for t in turns))

    return asyncio.run(asyncio.wait_for(go(), 120))


def with_bystander(p, turn: Turn) -> list:
    """Run `turn` next to a normal audio turn; check the bystander's turn; return the victim's events."""
    events, bystander = together(p, turn, spoken(BYSTANDER, 1))
    assert_spoke(bystander)
    return events


def assert_spoke(events: list, status: tuple[str, ...] = ("completed",)) -> None:
    done = events[-1]
    assert isinstance(done, TurnDone), done
    assert done.status in status and len(done.codes) > 0, done.status
    assert sum(e.pcm.size for e in events if isinstance(e, AudioChunk)) > 0


def assert_refused(events: list, code: str) -> TurnError:
    assert len(events) == 1 and isinstance(events[0], TurnError), events
    assert events[0].code == code, events[0]
    return events[0]


# -- the triggers found by attacking the server -------------------------------------------------------------

@pytest.mark.parametrize("messages, code", [
    ([Message("system", "Be brief \ud800."), Message("user", "hi")], "invalid_request"),  # lone surrogate
    ([Message("user", "hi \ud800")], "invalid_request"),
    ([Message("assistant", "", tool_calls=(ToolCall("f", '{"a": "\ud800"}'),)), Message("user", "hi")],
     "invalid_request"),
    ([Message("user", "x" * 15_000_000)], "context_too_long"),
    ([Message("user", "", torch.full((16000,), float("nan")))], "invalid_request"),
    ([Message("user", "", torch.full((16000,), torch.inf))], "invalid_request"),
    ([Message("user", "", torch.zeros(16000, dtype=torch.float64).index_fill_(0, torch.tensor([9]), -torch.inf))],
     "invalid_request"),
    ([Message("user", "", torch.zeros(16000, dtype=torch.bfloat16).index_fill_(0, torch.tensor([9]), torch.nan))],
     "invalid_request"),
], ids=["surrogate-in-instructions", "surrogate-in-text", "surrogate-in-tool-call", "15MB-text",
        "nan-audio", "inf-audio", "one-inf-sample-f64", "one-nan-sample-bf16"])
def test_bad_input_is_refused_at_submission(pipeline, messages, code):
    assert_refused(with_bystander(pipeline, victim(messages)), code)


@pytest.mark.parametrize("tool, choice", [
    ({"type": "function", "name": "a", "function": {}}, {"type": "function", "name": "a"}),  # KeyError once
    ({"type": "function", "name": "a\ud800"}, "auto"),
    ({"type": "function", "name": "a"}, {"type": "function", "name": "a\ud800"}),
], ids=["nameless-function", "surrogate-in-name", "surrogate-in-choice"])
def test_a_bad_tool_schema_is_refused(pipeline, tool, choice):
    opts = GenerationOptions(tools=(tool,), tool_choice=choice)
    assert_refused(with_bystander(pipeline, victim([Message("user", "hi")], opts)), "invalid_request")


def test_a_conversation_of_a_system_message_only_is_answered(pipeline):
    """A greeting-first agent: instructions and nothing else. The reply is spoken; the bystander is unharmed."""
    events = with_bystander(pipeline, victim([Message("system", "Greet the user.")]))
    assert_spoke(events, ("completed", "length"))


def test_system_only_turns_batched_together_are_answered(pipeline):
    turns = [Turn(f"{s}", [Message("system", f"Greet the user, {s}.")], OPTS, turn_id=new_id(f"{s}_turn"))
             for s in (VICTIM, MATE)]
    victim_events, mate_events, bystander = together(pipeline, *turns, spoken(BYSTANDER, 1))
    for events in (victim_events, mate_events, bystander):
        assert_spoke(events, ("completed", "length"))


def test_a_conversation_of_assistant_items_only_is_answered(pipeline):
    events = with_bystander(pipeline, victim([Message("assistant", "Hello."), Message("assistant", "Still there?")]))
    assert_spoke(events, ("completed", "length"))


def test_a_15mb_text_item_is_refused_in_under_100ms(pipeline):
    pipeline.sync()
    start = time.perf_counter()
    events = pipeline.run(victim([Message("system", "Be brief."), Message("user", "x" * 15_000_000)]), 30)
    elapsed = time.perf_counter() - start
    assert_refused(events, "context_too_long")
    assert elapsed < 0.1, f"{elapsed * 1e3:.0f} ms"


def test_a_prompt_over_the_token_bound_is_refused_before_any_work():
    cfg = PipelineConfig.on("tiny", "cpu", thinker={"kv_blocks": 2})  # a 32-token context
    with build_pipeline(cfg) as p:
        long_words = " ".join(f"w{i}" for i in range(40))  # under the byte bound, over the token bound
        assert_refused(p.run(victim([Message("user", long_words)]), 30), "context_too_long")
        stats = p.stats()
        assert stats["turns_started"] == stats["turns_ended"] == 1 and stats["sessions"] == 0


def test_text_only_replies_never_sample_outside_the_vocabulary(pipeline, monkeypatch):
    """The checkpoint's lm_head is wider than its tokenizer: make the extra ids the likeliest."""
    thinker = pipeline.program.model.thinker
    real = thinker.logits
    vocab = pipeline.program.tokenizer.vocab_size
    assert thinker.lm_head.out_features > vocab

    def favour_unknown_ids(hidden):
        out = real(hidden).clone()
        out[:, vocab:] += 1e4
        return out

    monkeypatch.setattr(thinker, "logits", favour_unknown_ids)
    opts = GenerationOptions(audio=False, max_text_tokens=20, ignore_eos=True)
    events = with_bystander(pipeline, victim([Message("user", "Tell me a story.")], opts))
    done = events[-1]
    assert isinstance(done, TurnDone) and done.status == "length" and len(done.text_ids) == 20
    assert max(done.text_ids) < vocab


def test_a_long_text_only_reply_runs_to_its_token_limit(pipeline):
    opts = GenerationOptions(audio=False, max_text_tokens=300, ignore_eos=True)
    events = with_bystander(pipeline, victim([Message("user", "Tell me a long story.")], opts))
    done = events[-1]
    assert isinstance(done, TurnDone) and done.status == "length" and len(done.text_ids) == 300
    assert max(done.text_ids) < pipeline.program.tokenizer.vocab_size


# -- faults injected into the engine ----------------------------------------------------------------------

def mine(work) -> bool:
    return VICTIM in work.key


def fail_pending(monkeypatch, stage) -> None:
    real_add = stage.add

    def add(work):
        if mine(work):
            def pending():
                raise RuntimeError("injected pending fault")
            work.pending = pending
        real_add(work)

    monkeypatch.setattr(stage, "add", add)


def fail_step(monkeypatch, stage) -> list[set[str]]:
    """The stage's first step whose batch holds the victim's work raises; returns that batch's keys."""
    real_run, failed = stage.runner.run, []

    def run(batch):
        if not failed and any(mine(w) for w in batch.works):
            failed.append({w.key for w in batch.works})
            raise RuntimeError("injected step fault")
        return real_run(batch)

    monkeypatch.setattr(stage.runner, "run", run)
    return failed


def poison_rows(monkeypatch, stage, model, method: str) -> list[int]:
    """In the stage's first decode step that batches the victim with another turn, the victim's row of
    `model.method`'s output becomes NaN; returns the batch size it happened at. (A decode step computes
    its rows' logits in one call, in batch order; prefills run one sequence per call.)"""
    real_run, real_out, rows, fired = stage.runner.run, getattr(model, method), [], []

    def run(batch):
        mixed = not batch.prefill and len(batch.works) > 1 and not fired and any(mine(w) for w in batch.works)
        rows[:] = [i for i, w in enumerate(batch.works) if mine(w)] if mixed else []
        if mixed:
            fired.append(len(batch.works))
        try:
            return real_run(batch)
        finally:
            rows.clear()

    def out(hidden):
        logits = real_out(hidden)
        if rows:
            logits = logits.clone()
            logits[rows] = float("nan")
        return logits

    monkeypatch.setattr(stage.runner, "run", run)
    monkeypatch.setattr(model, method, out)
    return fired


@pytest.mark.parametrize("stage", STAGES)
def test_a_pending_that_raises_fails_its_turn_alone(pipeline, monkeypatch, stage):
    fail_pending(monkeypatch, pipeline.program.by_name[stage])
    events = with_bystander(pipeline, spoken(VICTIM, 3))
    assert isinstance(events[-1], TurnError) and events[-1].code == "internal_error"
    assert "injected pending fault" in events[-1].message
    assert pipeline.alive


@pytest.mark.parametrize("stage", STAGES)
def test_a_step_that_raises_fails_only_its_batch(pipeline, monkeypatch, stage):
    failed = fail_step(monkeypatch, pipeline.program.by_name[stage])
    bystander = spoken(BYSTANDER, 1)
    events, others = together(pipeline, spoken(VICTIM, 3), bystander)
    assert failed, "the fault never fired"
    assert isinstance(events[-1], TurnError) and events[-1].code == "internal_error"
    assert "injected step fault" in events[-1].message
    if any(BYSTANDER in key for key in failed[0]):  # batched with the failing step: it fails too
        assert isinstance(others[-1], TurnError) and others[-1].code == "internal_error"
    else:
        assert_spoke(others)
    assert_spoke(pipeline.run(spoken(BYSTANDER, 4), 120), ("completed", "length"))  # the engine goes on
    assert pipeline.alive


@pytest.mark.parametrize("stage, model, method", [("thinker", "thinker", "logits"),
                                                  ("talker", "talker", "codec_logits")])
def test_a_nan_row_ends_that_turn_alone(pipeline, monkeypatch, stage, model, method):
    p = pipeline.program
    fired = poison_rows(monkeypatch, p.by_name[stage], getattr(p.model, model), method)
    # long enough to overlap: the victim's first audio makes its stream urgent, so the others' prefills
    # wait until it has a quarter second buffered
    long = GenerationOptions(greedy=True, max_text_tokens=30, max_frames=30, ignore_eos=True)
    events, mate, bystander = together(pipeline, spoken(VICTIM, 3, long), spoken(MATE, 4, long),
                                       spoken(BYSTANDER, 1))
    assert fired and fired[0] >= 2, "the victim never shared a batch"
    assert isinstance(events[-1], TurnError) and events[-1].code == "internal_error"
    assert "not a number" in events[-1].message
    assert_spoke(mate, ("length",))  # its batch-mate carries on to its limits
    assert_spoke(bystander)
