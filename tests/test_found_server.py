"""Defects found by trying the server as a client developer would (issue 14): a voice agent that speaks first,
KV blocks left behind by response.create with `input`, a big text item against a reading client, failed
responses on /metrics. The real server on loopback, the tiny model, the openai SDK; every server event is
validated against the SDK's types."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from models.registry import build_pipeline
from realtime.item_events import MAX_ITEM_CHARS
from realtime.server import ServerConfig
from realtime.session import Limits
from tests.raw_ws import connect
from tests.realtime_server import client, next_event, running, until

LIMITS = Limits(max_text_tokens=6, max_frames=6)
GREETING = "Greet the user warmly."


def port_of(url: str) -> int:
    return int(url.split(":")[2].split("/")[0])


@pytest.fixture(scope="module")
def pipeline():
    with build_pipeline("tiny", "cpu") as p:
        yield p


@pytest.fixture(scope="module")
def server(pipeline):
    with running(pipeline, ServerConfig(limits=LIMITS)) as served:
        yield served


async def spoken_reply(conn, **create) -> list[dict]:
    """Ask for a response; return its events up to response.done, checking it spoke and did not fail."""
    await conn.response.create(**create)
    seen: list[dict] = []
    await until(conn, "response.done", seen)
    done = seen[-1]["response"]
    assert done["status"] in ("completed", "incomplete"), done["status_details"]
    assert not [e for e in seen if e["type"] == "error"], seen
    assert sum(1 for e in seen if e["type"] == "response.output_audio.delta") > 0
    assert done["output"] and done["output"][0]["role"] == "assistant"
    return seen


async def open_session(conn, **session) -> None:
    await next_event(conn)  # session.created
    await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}, **session})
    await until(conn, "session.updated")


def test_a_voice_agent_that_speaks_first_gets_a_spoken_greeting(server):
    url, _ = server

    async def go():
        async with client(url).realtime.connect(model="qwen3-omni") as conn:  # instructions in the session
            await open_session(conn, instructions=GREETING)
            first = await spoken_reply(conn)
            assert any(e["type"] == "conversation.item.added" for e in first)  # the greeting joins the conversation
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Hi!"}]})
            await until(conn, "conversation.item.done")
            await spoken_reply(conn)  # the conversation goes on after the greeting
        async with client(url).realtime.connect(model="qwen3-omni") as conn:  # instructions in response.create
            await open_session(conn)
            await spoken_reply(conn, response={"instructions": GREETING})
        async with client(url).realtime.connect(model="qwen3-omni") as conn:  # a system item only
            await open_session(conn)
            await conn.conversation.item.create(item={"type": "message", "role": "system", "content": [
                {"type": "input_text", "text": GREETING}]})
            await until(conn, "conversation.item.done")
            await spoken_reply(conn)
        async with client(url).realtime.connect(model="qwen3-omni") as conn:  # out of band, instructions only
            await open_session(conn)
            seen = await spoken_reply(conn, response={"conversation": "none", "instructions": GREETING})
            assert not any(e["type"] == "conversation.item.added" for e in seen)
            seen = await spoken_reply(conn, response={"conversation": "none", "instructions": GREETING, "input": []})

    asyncio.run(go())


def test_nothing_to_answer_is_a_request_error(server):
    url, _ = server

    async def go():
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await open_session(conn)
            await conn.response.create()  # no instructions, no items
            error = await until(conn, "error")
            assert error["error"]["type"] == "invalid_request_error"

    asyncio.run(go())


def settled(pipeline, before: dict) -> dict:
    """The engine's counters once they match `before`'s sessions and KV blocks, or after 5 s."""
    for _ in range(100):
        pipeline.sync()
        stats = pipeline.stats()
        if (stats["sessions"], stats["kv_blocks"]) == (before["sessions"], before["kv_blocks"]):
            break
        time.sleep(0.05)
    return stats


def test_response_create_with_input_leaves_the_engine_as_it_found_it(pipeline, server):
    url, _ = server
    pipeline.sync()
    before = pipeline.stats()

    seen = []

    async def go():
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await open_session(conn, instructions="Be brief.")
            for i in range(3):
                await spoken_reply(conn, response={"input": [{"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": f"Question {i}?"}]}]})
                seen.append(settled(pipeline, before))  # each response's own session ended with it

    asyncio.run(go())
    print("thinker KV blocks before, after each response.create(input):", before["kv_blocks"]["thinker"],
          [s["kv_blocks"]["thinker"] for s in seen], "pipeline sessions:", [s["sessions"] for s in seen])
    for during in seen:
        assert during["sessions"] == before["sessions"] and during["kv_blocks"] == before["kv_blocks"], during
    after = settled(pipeline, before)  # the server ends the socket's session a moment after the client has gone
    assert after["sessions"] == before["sessions"] and after["kv_blocks"] == before["kv_blocks"], (before, after)
    assert after["turns_started"] - before["turns_started"] == 3 == after["turns_ended"] - before["turns_ended"]


def test_a_huge_text_item_is_refused_and_the_session_goes_on(server):
    url, srv = server

    async def go():
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await open_session(conn)
            huge = "x" * 15_000_000
            start = time.perf_counter()
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": huge}]})
            error = await until(conn, "error")
            refused_s = time.perf_counter() - start
            assert error["error"]["type"] == "invalid_request_error" and error["error"]["code"] == "item_too_large"
            assert error["error"]["param"] == "item" and "4 MiB" in error["error"]["message"]
            # just under the limit: accepted, echoed twice, and the response ends context_too_long
            big = "y" * (MAX_ITEM_CHARS - 1000)
            start = time.perf_counter()
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": big}]})
            added = await until(conn, "conversation.item.added")
            done = await until(conn, "conversation.item.done")
            assert added["item"]["content"][0]["text"] == big == done["item"]["content"][0]["text"]
            await conn.response.create()
            failed = (await until(conn, "response.done"))["response"]
            error = failed["status_details"]["error"]
            assert failed["status"] == "failed" and error["code"] == "context_too_long", failed["status_details"]
            assert error["type"] == "invalid_request_error"
            print(f"15 MB item refused in {refused_s * 1e3:.0f} ms; a 4 MiB item echoed twice and its response "
                  f"ended context_too_long {time.perf_counter() - start:.2f} s after it was sent; socket open")
            await conn.session.update(session={"type": "realtime", "instructions": "Still here."})
            assert (await until(conn, "session.updated"))["session"]["instructions"] == "Still here."
            assert srv.metrics.sessions == 1

    asyncio.run(go())


def test_a_client_that_does_not_read_is_still_closed(pipeline):
    with running(pipeline, ServerConfig(max_sessions=1, max_queued_bytes=2 * 1024 * 1024, limits=LIMITS)) as (
            url, srv):

        async def go():
            raw = await connect(port_of(url), rcvbuf=4096)
            assert raw.status == 101
            big = "x" * 16384
            sent = time.monotonic()
            for _ in range(800):  # each session.updated echoes 16 KiB: ~13 MB that this client never reads
                try:
                    await raw.send_event({"type": "session.update", "session": {"instructions": big}})
                except ConnectionError:
                    break
            for _ in range(200):
                if srv.metrics.sessions == 0:
                    break
                await asyncio.sleep(0.05)
            raw.close()
            return srv.metrics.sessions, time.monotonic() - sent

        sessions, freed = asyncio.run(go())
        print(f"a client that does not read: closed and its slot freed {freed:.1f} s after its first frame")
        assert sessions == 0 and freed < 10, freed


def test_failed_responses_and_process_metrics_on_metrics(server):
    url, _ = server

    async def go():
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await open_session(conn)
            await spoken_reply(conn, response={"instructions": GREETING})
            await conn.response.create(response={"conversation": "none", "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "z" * 3_000_000}]}]})
            done = (await until(conn, "response.done"))["response"]
            assert done["status"] == "failed"
        async with aiohttp.ClientSession() as http:
            return await (await http.get(url.removesuffix("/v1") + "/metrics")).text()

    text = asyncio.run(go())
    failed = [line for line in text.splitlines() if line.startswith("omni_responses_total{")
              and 'status="failed"' in line and 'code="context_too_long"' in line]
    assert failed and float(failed[0].split()[-1]) >= 1, text
    assert 'omni_responses_total{code="none",status="incomplete"}' in text or \
        'omni_responses_total{code="none",status="completed"}' in text
    for family in ("process_resident_memory_bytes", "process_cpu_seconds_total", "python_gc_objects_collected_total",
                   "python_info"):
        assert f"\n{family}" in text, family
