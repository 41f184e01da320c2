"""A seeded fuzz of the gateway: thousands of malformed, mutated and valid client events on several sockets at
once, while a healthy session completes spoken turns. Nothing may drop a socket, leave a response unended, log
a traceback or send an event the openai SDK's types reject."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import random

import pytest
import websockets

from models.registry import build_pipeline
from realtime.server import ServerConfig
from realtime.session import Limits
from tests.realtime_server import SERVER_EVENT, client, errors_by_code, next_event, pcm16_b64, running, until
from tests.speech import speech_like

SOCKETS, EVENTS_PER_SOCKET, SEED = 4, 520, 8
LIMITS = Limits(max_text_tokens=3, max_frames=2, transcription_tokens=3)
SPEECH = pcm16_b64(speech_like(0.15))
TEXT_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
VALID = {
    "session.update": {"session": {
        "type": "realtime", "instructions": "Be brief.", "output_modalities": ["text"], "max_output_tokens": 3,
        "tool_choice": "auto", "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {}}],
        "tracing": None, "include": None, "prompt": None, "truncation": "auto",
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "transcription": None,
                            "turn_detection": {"type": "server_vad", "silence_duration_ms": 200,
                                               "create_response": False}, "noise_reduction": None},
                  "output": {"voice": "ethan", "format": {"type": "audio/pcm"}, "speed": 1.0}}}},
    "input_audio_buffer.append": {"audio": SPEECH},
    "input_audio_buffer.commit": {},
    "input_audio_buffer.clear": {},
    "conversation.item.create": {"previous_item_id": None, "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"},
                                                       {"type": "input_audio", "audio": SPEECH}]}},
    "conversation.item.retrieve": {"item_id": "item_x"},
    "conversation.item.delete": {"item_id": "item_x"},
    "conversation.item.truncate": {"item_id": "item_x", "content_index": 0, "audio_end_ms": 10},
    "response.create": {"response": {"conversation": "none", "output_modalities": ["text"], "max_output_tokens": 2,
                                     "input": [TEXT_ITEM], "metadata": {"k": "v"}, "instructions": "x"}},
    "response.cancel": {},
}
ODD = [None, True, False, 0, -1, 1, 7, 2**31, 2**63, -(2**40), 1.5, -0.0, 1e308, "", "x", "inf", "auto", "none",
       "server_vad", "semantic_vad", "audio/pcm", "audio/pcmu", "realtime", "ethan", "a" * 300, "\udc80 \x00",
       "\u202e\U0001f600", [], {}, [1, 2], {"type": "x"}, [{"type": "function"}], {"id": "x"}, [TEXT_ITEM],
       ["audio"], ["text", "audio"], {"type": "server_vad", "silence_duration_ms": -5}, "AAAA", "A"]


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


def _mutate(rng: random.Random, event: dict) -> None:
    paths = [p for p in _paths(event) if p]
    if not paths:
        event["type"] = rng.choice(list(VALID))
        return
    path = rng.choice(paths)
    parent = event
    for key in path[:-1]:
        parent = parent[key]
    op = rng.random()
    if op < 0.6:
        parent[path[-1]] = copy.deepcopy(rng.choice(ODD))
    elif op < 0.8 and isinstance(parent, dict):
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[rng.choice(["zz", "type", "event_id", "id", "rate"])] = copy.deepcopy(rng.choice(ODD))


def fuzz_frame(rng: random.Random) -> str | bytes:
    kind = rng.choice(list(VALID))
    event = {"type": kind, "event_id": f"f{rng.randrange(10**6)}", **copy.deepcopy(VALID[kind])}
    roll = rng.random()
    if roll < 0.12:
        return json.dumps(event)
    if roll < 0.22:
        text = json.dumps(event)
        return rng.choice([
            text[: rng.randrange(len(text))], "[" * rng.randrange(30, 3000), '{"type": ' + "9" * 5000 + "}",
            '{"type": "session.update", "session": {"instructions": NaN}}', "null", "[]", '"s"', "{}",
            '{"type": 5}', json.dumps({"type": "x" * 5000}), b"\x00\xffbinary", "{" * 40 + "}" * 40,
            json.dumps({**event, "event_id": "e" * 20000}),
        ])
    for _ in range(rng.randint(1, 3)):
        _mutate(rng, event)
    try:
        return json.dumps(event)
    except (TypeError, ValueError):
        return json.dumps({"type": kind})


@pytest.fixture(scope="module")
def pipeline():
    with build_pipeline("tiny") as p:
        yield p


class Tracebacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.levelno >= logging.ERROR:
            self.records.append(record)


def test_seeded_fuzz_on_several_sockets_beside_a_healthy_session(pipeline):
    caught = Tracebacks()
    logging.getLogger().addHandler(caught)
    cfg = ServerConfig(max_sessions=SOCKETS + 2, limits=LIMITS)
    try:
        with running(pipeline, cfg) as (url, srv):
            ws_url = url.replace("http", "ws") + "/realtime"
            result = asyncio.run(_fuzz(url, ws_url))
    finally:
        logging.getLogger().removeHandler(caught)
    sent, events, invalid, created, done, turns = result
    print(f"fuzz: {sent} events on {SOCKETS} sockets -> {events} server events, {len(created)} responses; "
          f"healthy session: {turns} turns; errors by code: {errors_by_code(srv)}")
    assert sent >= 2000 and turns >= 3
    assert not invalid, invalid[:3]
    assert created == done, created ^ done  # every response ended
    assert errors_by_code(srv).get("server_error", 0) == 0
    assert not caught.records, [(r.getMessage(), r.exc_text) for r in caught.records[:3]]


async def _fuzz(url: str, ws_url: str):
    stop = asyncio.Event()
    created: set[str] = set()
    done: set[str] = set()
    invalid: list = []
    counts = {"sent": 0, "events": 0}

    def seen(raw: str | bytes) -> dict:
        event = json.loads(raw)
        counts["events"] += 1
        try:
            SERVER_EVENT.validate_python(event)
        except Exception as e:  # noqa: BLE001 - collected and reported
            invalid.append((event.get("type"), str(e)[:300]))
        if event["type"] == "response.created":
            created.add(event["response"]["id"])
        elif event["type"] == "response.done":
            done.add(event["response"]["id"])
        return event

    async def fuzzer(i: int) -> None:
        rng = random.Random(SEED * 100 + i)
        async with websockets.connect(ws_url, max_size=None) as ws:
            sentinel = asyncio.Event()
            mine: set[str] = set()

            async def read() -> None:
                async for raw in ws:
                    event = seen(raw)
                    if event["type"] == "response.created":
                        mine.add(event["response"]["id"])
                    if event["type"] == "error" and event["error"]["event_id"] == "sentinel":
                        sentinel.set()

            reader = asyncio.create_task(read())
            for _ in range(EVENTS_PER_SOCKET):
                await ws.send(fuzz_frame(rng))
                counts["sent"] += 1
                await asyncio.sleep(0.002)
            deadline = asyncio.get_running_loop().time() + 60
            while asyncio.get_running_loop().time() < deadline:  # end the response in flight, if any, and
                sentinel.clear()  # see every frame answered in order
                await ws.send(json.dumps({"type": "response.cancel"}))
                await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": "none",
                                          "event_id": "sentinel"}))
                await asyncio.wait_for(sentinel.wait(), 60)
                if mine <= done:
                    break
                await asyncio.sleep(0.2)
            assert mine <= done and ws.state is websockets.State.OPEN  # all ended; the server closed no socket
            reader.cancel()

    async def healthy() -> int:
        turns = 0
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await next_event(conn)
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            await until(conn, "session.updated")
            while not stop.is_set() or turns < 3:
                await conn.input_audio_buffer.append(audio=pcm16_b64(speech_like(0.4, seed=turns)))
                await conn.input_audio_buffer.commit()
                await conn.response.create()
                response = (await until(conn, "response.done"))["response"]
                assert response["status"] == "incomplete" and response["output"][0]["content"][0]["transcript"]
                turns += 1
        return turns

    health = asyncio.create_task(healthy())
    await asyncio.gather(*(fuzzer(i) for i in range(SOCKETS)))
    stop.set()
    turns = await health
    return counts["sent"], counts["events"], invalid, created, done, turns
