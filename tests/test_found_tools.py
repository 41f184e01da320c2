"""tool_choice "required" or a named function makes the reply a tool call (issue 14, item 4): on the tiny random
model, unchanged, through the real server and the openai SDK; and the call writer keeps any token stream a
valid call."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from models.common.tokenizer import Tokenizer
from models.qwen3_omni.forced_call import CallWriter
from models.qwen3_omni.tools import parse_tool_calls
from models.registry import build_pipeline
from realtime.server import ServerConfig
from realtime.session import Limits
from tests.realtime_server import client, next_event, running, until

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city.",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "lat": {"type": "number"},
               "extra": {"type": "object"}, "note": {"type": "string"}},
               "required": ["city", "days", "metric", "unit", "lat", "extra"]}}
TIME = {"type": "function", "name": "get_time", "description": "The time now.", "parameters": {"type": "object"}}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.builtin()


def write(tokenizer: Tokenizer, choice, stream) -> tuple[list[int], str]:
    writer = CallWriter.for_choice(tokenizer, [WEATHER, TIME], choice)
    im_end = tokenizer.special_ids["<|im_end|>"]
    ids: list[int] = []
    for sampled in stream:
        ids.append(writer.choose(sampled))
        if ids[-1] == im_end:
            return ids, tokenizer.decode(ids)
    raise AssertionError(f"no end after {len(ids)} tokens: {tokenizer.decode(ids)!r}")


def check_weather(args: dict) -> None:
    assert set(args) == {"city", "days", "metric", "unit", "lat", "extra"}, args  # the required ones, in order
    assert isinstance(args["city"], str) and isinstance(args["days"], int) and isinstance(args["metric"], bool)
    assert args["unit"] in ("celsius", "fahrenheit") and isinstance(args["lat"], int | float) and args["extra"] == {}


@pytest.mark.parametrize("name, stream", [
    ("quotes", lambda t: [t.encode('"')[0]] * 200),
    ("backslashes", lambda t: [t.encode("\\")[0]] * 200),
    ("digits", lambda t: [t.encode("7")[0]] * 200),
    ("im_end", lambda t: [t.special_ids["<|im_end|>"]] * 200),
    ("words", lambda t: t.encode(" Paris true fahrenheit 3.5 and more words") * 20),
    ("random", lambda t: [random.Random(0).randrange(t.vocab_size) for _ in range(200)]),
])
def test_any_token_stream_becomes_one_valid_call(tokenizer, name, stream):
    for choice in ({"type": "function", "name": "get_weather"}, "required"):
        ids, text = write(tokenizer, choice, stream(tokenizer))
        calls, invalid = parse_tool_calls(text)
        assert not invalid and len(calls) == 1, text
        assert ids[0] == tokenizer.special_ids["<tool_call>"]
        if calls[0].name == "get_weather":
            check_weather(json.loads(calls[0].arguments))
        else:
            assert choice == "required" and calls[0].arguments == "{}"


def answering(tokenizer: Tokenizer, answers: dict[str, str]):
    """A stand-in for a model that has learnt the format: where its text so far ends with a key of `answers`
    it writes that answer, then <|im_end|> until something else is forced."""

    class Model:
        ids: list[int] = []
        pending: list[int] = []
        done: set[str] = set()

        def __iter__(self):
            return self

        def __next__(self) -> int:
            text = tokenizer.decode(self.ids)
            for key, answer in answers.items():
                if key not in self.done and text.endswith(key):
                    self.done.add(key)
                    self.pending = tokenizer.encode(answer)
            return self.pending.pop(0) if self.pending else tokenizer.special_ids["<|im_end|>"]

    return Model()


def write_with(tokenizer: Tokenizer, choice, model) -> str:
    writer = CallWriter.for_choice(tokenizer, [WEATHER, TIME], choice)
    for _ in range(200):
        model.ids.append(writer.choose(next(model)))
        if model.ids[-1] == tokenizer.special_ids["<|im_end|>"]:
            return tokenizer.decode(model.ids)
    raise AssertionError(tokenizer.decode(model.ids))


def test_the_model_s_own_tokens_fill_the_values(tokenizer):
    model = answering(tokenizer, {'"city": "': 'Paris"', '"days": ': "42,", '"metric": ': "true",
                                  '"unit": ': "fahr", '"lat": ': "1.5x"})
    args = json.loads(parse_tool_calls(write_with(tokenizer, {"type": "function", "name": "get_weather"},
                                                  model))[0][0].arguments)
    assert args["city"] == "Paris" and args["days"] == 42 and args["metric"] is True
    assert args["unit"] == "fahrenheit" and args["lat"] == 1.5


def test_required_picks_the_tool_the_model_names(tokenizer):
    text = write_with(tokenizer, "required", answering(tokenizer, {'"name": "': "get_time"}))
    assert parse_tool_calls(text)[0][0].name == "get_time"
    text = write_with(tokenizer, "required", answering(tokenizer, {'"name": "': "set_alarm"}))
    assert parse_tool_calls(text)[0][0].name == "get_weather"  # no tool begins so: the first listed


def test_a_named_function_that_is_not_a_tool_is_refused(tokenizer):
    with pytest.raises(ValueError, match="not among the tools"):
        CallWriter.for_choice(tokenizer, [WEATHER], {"type": "function", "name": "get_time"})


def test_auto_and_none_are_not_forced(tokenizer):
    assert CallWriter.for_choice(tokenizer, [WEATHER], "auto") is None
    assert CallWriter.for_choice(tokenizer, [WEATHER], "none") is None
    assert CallWriter.for_choice(tokenizer, [], "required") is None


@pytest.fixture(scope="module")
def server():
    with build_pipeline("tiny", "cpu") as p, running(p, ServerConfig(limits=Limits(max_text_tokens=80,
                                                                                    max_frames=6))) as served:
        yield served


async def call_reply(conn, **create) -> tuple[dict, list[dict]]:
    await conn.response.create(**create)
    seen: list[dict] = []
    await until(conn, "response.done", seen)
    kinds = [e["type"] for e in seen]
    assert "response.output_audio.delta" not in kinds  # a call is not spoken
    done = seen[-1]["response"]
    assert done["status"] == "completed", done["status_details"]
    assert [o["type"] for o in done["output"]] == ["function_call"]
    args = next(e for e in seen if e["type"] == "response.function_call_arguments.done")
    assert args["call_id"] == done["output"][0]["call_id"]
    return args, seen


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_a_tool_round_trip_with_the_openai_sdk_on_the_tiny_model(server, choice):
    url, _ = server

    async def go():
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await next_event(conn)
            await conn.session.update(session={"type": "realtime", "instructions": "You help with the weather.",
                                               "tools": [WEATHER, TIME], "tool_choice": choice,
                                               "audio": {"input": {"turn_detection": None}}})
            await until(conn, "session.updated")
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "How warm is it in Paris?"}]})
            await until(conn, "conversation.item.done")
            args, _ = await call_reply(conn)
            assert args["name"] in ("get_weather", "get_time")
            if args["name"] == "get_weather":
                check_weather(json.loads(args["arguments"]))
            await conn.conversation.item.create(item={"type": "function_call_output", "call_id": args["call_id"],
                                                      "output": json.dumps({"temp_c": 21})})
            await until(conn, "conversation.item.done")
            # the result goes back; with tool_choice "none" for this response the model must speak (16 tokens of
            # it: the server's 80 are room for a forced call's arguments, not needed to show that it speaks)
            await conn.response.create(response={"tool_choice": "none", "max_output_tokens": 16})
            seen: list[dict] = []
            await until(conn, "response.done", seen)
            assert seen[-1]["response"]["status"] in ("completed", "incomplete")
            assert any(e["type"] == "response.output_audio.delta" for e in seen)
            # and a named function on one response only, out of band
            named, _ = await call_reply(conn, response={"conversation": "none",
                                                        "tool_choice": {"type": "function", "name": "get_time"}})
            assert named["name"] == "get_time" and json.loads(named["arguments"]) == {}

    asyncio.run(go())
