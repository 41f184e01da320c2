import pytest

from models.common.chat import Prompt, Turn, render, render_continuation
from models.common.tokenizer import Tokenizer
from tests.reference_paths import reply_ids

IM_START, IM_END, NL = 151644, 151645, 198
SYSTEM, USER, ASSISTANT = 8948, 872, 77091
AUDIO_START, AUDIO_END, AUDIO_PAD = 151669, 151670, 151675


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.builtin()


def template_text(turns: list[Turn], add_generation_prompt: bool = True) -> str:
    parts = []
    for t in turns:
        audio = "<|audio_start|>" + "<|audio_pad|>" * t.audio_tokens + "<|audio_end|>" if t.audio_tokens else ""
        parts.append(f"<|im_start|>{t.role}\n{audio}{t.text}<|im_end|>\n")
    return "".join(parts) + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def test_small_conversation_token_by_token(tok: Tokenizer) -> None:
    turns = [
        Turn("system", "You are a helpful assistant."),
        Turn("user", "What is this?", audio_tokens=3),
        Turn("assistant", "A dog barking."),
        Turn("user", "Hi!"),
    ]
    expected = [
        IM_START, SYSTEM, NL, 2610, 525, 264, 10950, 17847, 13, IM_END, NL,
        IM_START, USER, NL, AUDIO_START, AUDIO_PAD, AUDIO_PAD, AUDIO_PAD, AUDIO_END, 3838, 374, 419, 30, IM_END, NL,
        IM_START, ASSISTANT, NL, 32, 5562, 293, 33452, 13, IM_END, NL,
        IM_START, USER, NL, 13048, 0, IM_END, NL,
        IM_START, ASSISTANT, NL,
    ]  # fmt: skip
    prompt = render(tok, turns)
    assert list(prompt.ids) == expected
    assert prompt.audio_spans == ((15, 3),)
    assert prompt.audio_positions == [15, 16, 17]
    assert list(render(tok, turns, add_generation_prompt=False).ids) == expected[:-3]


def test_audio_only_user_turn(tok: Tokenizer) -> None:
    prompt = render(tok, [Turn("user", audio_tokens=13)])
    assert list(prompt.ids) == [IM_START, USER, NL, AUDIO_START, *[AUDIO_PAD] * 13, AUDIO_END, IM_END, NL,
                                IM_START, ASSISTANT, NL]  # fmt: skip
    assert [prompt.ids[p] for p in prompt.audio_positions] == [AUDIO_PAD] * 13


def test_render_equals_tokenizing_template_text(tok: Tokenizer) -> None:
    turns = [
        Turn("system", "  你是一个语音助手。\n"),
        Turn("user", " with leading space 🎉", audio_tokens=48),
        Turn("assistant", "好的！Sure, 12345."),
        Turn("user", "", audio_tokens=26),
        Turn("assistant", "Done.\n\n"),
        Turn("user", "text only\r\n"),
    ]
    for gen in (True, False):
        prompt = render(tok, turns, add_generation_prompt=gen)
        assert list(prompt.ids) == tok.encode(template_text(turns, gen))
        pads = [i for i, t in enumerate(prompt.ids) if t == AUDIO_PAD]
        assert prompt.audio_positions == pads and len(pads) == 48 + 26


def test_incremental_render_equals_whole(tok: Tokenizer) -> None:
    history = [Turn("system", "You are Qwen."), Turn("user", "first question", audio_tokens=13)]
    rounds = [
        ("First answer, 第一个回答。", [Turn("user", audio_tokens=26)]),
        ("Second answer 🙂", [Turn("user", "typed follow-up", audio_tokens=7)]),
        ("Third.", [Turn("system", "Be brief."), Turn("user", "last")]),
    ]
    cached = render(tok, history)
    conversation = list(history)
    for reply, new_turns in rounds:
        cached = cached + Prompt(tuple(reply_ids(tok, reply))) + render_continuation(tok, new_turns)
        conversation += [Turn("assistant", reply), *new_turns]
        whole = render(tok, conversation)
        assert cached == whole
        assert [whole.ids[p] for p in whole.audio_positions] == [AUDIO_PAD] * len(whole.audio_positions)
    assert [n for _, n in cached.audio_spans] == [13, 26, 7]


def test_continuation_layout(tok: Tokenizer) -> None:
    prompt = render_continuation(tok, [Turn("user", audio_tokens=2)])
    assert list(prompt.ids) == [NL, IM_START, USER, NL, AUDIO_START, AUDIO_PAD, AUDIO_PAD, AUDIO_END, IM_END, NL,
                                IM_START, ASSISTANT, NL]  # fmt: skip
    assert prompt.audio_spans == ((5, 2),)
    assert reply_ids(tok, "Hello") == [9707, IM_END]


def test_prompt_concatenation_shifts_spans() -> None:
    a = Prompt((1, 2, 3), ((1, 1),))
    b = Prompt((4, 5, 6, 7), ((2, 2),))
    assert a + b == Prompt((1, 2, 3, 4, 5, 6, 7), ((1, 1), (5, 2)))
    assert len(a + b) == 7 and (a + b).audio_positions == [1, 5, 6]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"role": "tool", "text": "x"}, "role must be one of"),
        ({"role": "user", "audio_tokens": -1}, ">= 0"),
        ({"role": "assistant", "audio_tokens": 3}, "only user turns carry audio"),
        ({"role": "system", "audio_tokens": 1}, "only user turns carry audio"),
    ],
)
def test_turn_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Turn(**kwargs)
