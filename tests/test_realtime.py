"""The gateway end to end: the real server on loopback, the tiny model, the official openai SDK client.
Every server event is validated against the SDK's typed models (tests/realtime_server.next_event)."""

from __future__ import annotations

import asyncio
import base64
import json

import aiohttp
import pytest

from models.registry import build_pipeline
from realtime.server import ServerConfig
from realtime.session import Limits
from tests.realtime_server import append_audio, client, next_event, pcm16_b64, running, until
from tests.speech import speech_in_silence, speech_like

LIMITS = Limits(max_text_tokens=10, max_frames=8)
MANUAL = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
AUDIO_TURN_ORDER = [
    "response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added",
]
AUDIO_TURN_END = [
    "response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
    "conversation.item.done", "response.output_item.done", "response.done", "rate_limits.updated",
]


@pytest.fixture(scope="module")
def pipeline():
    with build_pipeline("tiny") as p:
        yield p


@pytest.fixture(scope="module")
def server(pipeline):
    with running(pipeline, ServerConfig(max_sessions=10, limits=LIMITS)) as (url, srv):
        yield url, srv


async def manual_turn(conn, seconds: float = 1.0, seed: int = 0) -> list[dict]:
    await append_audio(conn, speech_like(seconds, seed=seed))
    await conn.input_audio_buffer.commit()
    await conn.response.create()
    seen: list[dict] = []
    await until(conn, "rate_limits.updated", seen)
    return seen


def check_audio_turn(events: list[dict], frames: int = LIMITS.max_frames) -> dict:
    """Order and id linkage of one spoken response; returns response.done."""
    types = [e["type"] for e in events]
    start = types.index("response.created")
    assert types[start : start + 4] == AUDIO_TURN_ORDER
    body = [t for t in types[start + 4 :] if not t.startswith("conversation.item.input_audio_transcription")]
    deltas = [t for t in body if t in ("response.output_audio.delta", "response.output_audio_transcript.delta")]
    assert body[: len(deltas)] == deltas and "response.output_audio.delta" in deltas
    assert body[len(deltas) :] == AUDIO_TURN_END
    done = events[types.index("response.done")]["response"]
    resp_id, item = done["id"], done["output"][0]
    assert resp_id.startswith("resp_") and item["id"].startswith("item_")
    for e in events[start:]:
        if "response_id" in e:
            assert e["response_id"] == resp_id
        if "item_id" in e and e["type"].startswith("response."):
            assert e["item_id"] == item["id"]
    assert len({e["event_id"] for e in events}) == len(events)
    assert all(e["event_id"].startswith("event_") for e in events)
    transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert item["content"][0]["transcript"] == transcript and item["status"] in ("completed", "incomplete")
    audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    assert len(audio) == 2 * (1920 * frames - 555)  # every frame, 24 kHz pcm16
    assert done["usage"]["output_token_details"]["audio_tokens"] == frames
    return done


def test_manual_turn_with_the_openai_sdk(server):
    url, _ = server

    async def go():
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            created = await next_event(conn)
            assert created["type"] == "session.created" and created["session"]["id"].startswith("sess_")
            await conn.session.update(session=MANUAL)
            updated = await next_event(conn)
            assert updated["type"] == "session.updated"
            assert updated["session"]["audio"]["input"]["turn_detection"] is None
            assert updated["session"]["audio"]["output"]["voice"] == "ethan"  # full effective config
            events = await manual_turn(conn)
            types = [e["type"] for e in events]
            assert types[:3] == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
            user_item = events[0]["item_id"]
            assert events[1]["item"]["id"] == user_item and events[1]["item"]["role"] == "user"
            done = check_audio_turn(events)
            assert done["status"] == "incomplete" and done["status_details"]["reason"] == "max_output_tokens"
            inputs = done["usage"]["input_token_details"]
            assert inputs["audio_tokens"] == 13  # 1 s of speech is 13 audio tokens
            assert inputs["text_tokens"] + inputs["audio_tokens"] == done["usage"]["input_tokens"]
            added = [e for e in events if e["type"] == "conversation.item.added" and e["item"]["role"] == "assistant"]
            added = added[0]
            assert added["previous_item_id"] == user_item
            # a second turn on the cached conversation
            second = await manual_turn(conn, 0.6, seed=1)
            check_audio_turn(second)
            assert second[-2]["response"]["usage"]["input_token_details"]["cached_tokens"] > 0

    asyncio.run(go())


def test_server_vad_turn(server):
    url, _ = server

    async def go():
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await next_event(conn)
            audio, _, onset, offset = speech_in_silence(1.0, 1.5, 1.2)
            await append_audio(conn, audio, chunk_s=0.05)
            seen: list[dict] = []
            await until(conn, "rate_limits.updated", seen)
            types = [e["type"] for e in seen]
            expected = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                        "input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
            assert types[:5] == expected
            started, stopped, committed = seen[0], seen[1], seen[2]
            assert started["item_id"] == stopped["item_id"] == committed["item_id"]
            assert abs(started["audio_start_ms"] - (onset * 1000 - 300)) < 200
            assert stopped["audio_end_ms"] >= offset * 1000
            check_audio_turn(seen)

    asyncio.run(go())


def test_health_models_metrics(server):
    url, _ = server

    async def go():
        async with aiohttp.ClientSession() as http:
            root = url.removesuffix("/v1")
            health = await (await http.get(f"{root}/health")).json()
            models = await (await http.get(f"{url}/models")).json()
            metrics = await (await http.get(f"{root}/metrics")).text()
        assert health["status"] == "ok" and models["data"][0]["id"] == "qwen3-omni"
        assert "omni_time_to_first_audio_seconds_bucket" in metrics and "omni_sessions_opened_total" in metrics

    asyncio.run(go())


async def expect_error(conn, code: str, event_id: str | None = None) -> dict:
    event = await until(conn, "error")
    assert event["error"]["code"] == code, event
    if event_id is not None:
        assert event["error"]["event_id"] == event_id
    return event


async def still_works(conn) -> None:
    await conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
    assert (await until(conn, "session.updated"))["session"]["instructions"] == "Be brief."


def test_every_error_code_leaves_the_session_working(server):
    url, _ = server

    async def go():
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await next_event(conn)
            await conn.session.update(session=MANUAL)
            await until(conn, "session.updated")
            await conn.send_raw('{"type": "session.update", "session": ')
            await expect_error(conn, "invalid_json")
            await still_works(conn)
            await conn.send_raw(b"\x00\x01binary")
            await expect_error(conn, "invalid_event")
            await conn.send_raw('{"type": "no.such.event", "event_id": "evt_1"}')
            assert (await expect_error(conn, "invalid_value", "evt_1"))["error"]["param"] == "type"
            await conn.send_raw('{"type": "session.update", "event_id": "evt_2", '
                                '"session": {"type": "realtime", "bogus": 1}}')
            assert (await expect_error(conn, "unknown_parameter", "evt_2"))["error"]["param"] == "session.bogus"
            await conn.send_raw('{"type": "conversation.item.retrieve", "event_id": "evt_3"}')
            assert (await expect_error(conn, "missing_required_parameter", "evt_3"))["error"]["param"] == "item_id"
            await conn.send_raw('{"type": "input_audio_buffer.append", "audio": "not base64 !!", "event_id": "evt_4"}')
            await expect_error(conn, "invalid_value", "evt_4")
            await conn.input_audio_buffer.append(audio=pcm16_b64(speech_like(0.05)))
            await conn.input_audio_buffer.commit(event_id="evt_5")
            await expect_error(conn, "input_audio_buffer_commit_empty", "evt_5")
            await conn.response.cancel(event_id="evt_6")
            await expect_error(conn, "response_cancel_not_active", "evt_6")
            await still_works(conn)
            # two responses at once
            await append_audio(conn, speech_like(0.8))
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            await conn.response.create(event_id="evt_7")
            seen: list[dict] = []
            error = await until(conn, "error", seen)
            assert error["error"]["code"] == "conversation_already_has_active_response"
            await until(conn, "response.done", seen)
            done = next(e for e in seen if e["type"] == "response.done")
            item = done["response"]["output"][0]
            # truncating past the audio that was sent
            await conn.conversation.item.truncate(item_id=item["id"], content_index=0, audio_end_ms=10**6,
                                                  event_id="evt_8")
            assert (await expect_error(conn, "invalid_value", "evt_8"))["error"]["param"] == "audio_end_ms"
            await conn.conversation.item.retrieve(item_id="item_missing", event_id="evt_9")
            await expect_error(conn, "item_not_found", "evt_9")
            await still_works(conn)
            events = await manual_turn(conn, 0.5)
            check_audio_turn(events)

    asyncio.run(go())


def test_barge_in_cancels_and_the_interruption_is_answered(pipeline):
    limits = Limits(max_text_tokens=60, max_frames=60)
    with running(pipeline, ServerConfig(limits=limits)) as (url, _):

        async def go():
            async with client(url).realtime.connect(model="qwen3-omni") as conn:
                await next_event(conn)
                audio, *_ = speech_in_silence(0.8, 1.0, 1.0)
                await append_audio(conn, audio, chunk_s=0.05)
                seen: list[dict] = []
                for _ in range(4):  # some audio has reached the client
                    await until(conn, "response.output_audio.delta", seen)
                interruption, *_ = speech_in_silence(0.2, 1.0, 1.0, seed=3)
                await append_audio(conn, interruption, chunk_s=0.05)
                done = await until(conn, "response.done", seen)
                assert done["response"]["status"] == "cancelled"
                assert done["response"]["status_details"]["reason"] == "turn_detected"
                started = [e for e in seen if e["type"] == "input_audio_buffer.speech_started"]
                assert len(started) == 2 and seen.index(started[1]) < seen.index(done)
                assert done["response"]["output"][0]["status"] == "incomplete"
                # the interruption becomes the next user turn and is answered once the cancel is through
                created = await until(conn, "response.created")
                await conn.response.cancel()
                second = await until(conn, "response.done")
                assert second["response"]["id"] == created["response"]["id"]
                assert second["response"]["status_details"]["reason"] == "client_cancelled"
                return done["response"]["output"][0]

        item = asyncio.run(go())
        assert item["content"][0]["type"] == "output_audio"
        pipeline.sync()
        assert pipeline.program.kv_check()["talker"] == 0


def test_truncate_rolls_the_session_back_to_the_heard_tokens(pipeline):
    limits = Limits(max_text_tokens=12, max_frames=12)
    with running(pipeline, ServerConfig(limits=limits)) as (url, _):

        async def go():
            async with client(url).realtime.connect(model="qwen3-omni") as conn:
                await next_event(conn)
                await conn.session.update(session=MANUAL)
                await until(conn, "session.updated")
                events = await manual_turn(conn, 0.8)
                item = next(e for e in events if e["type"] == "response.done")["response"]["output"][0]
                program = pipeline.program
                pipe = await asyncio.wrap_future(pipeline.request(
                    lambda: next(s for s in program.sessions.values() if s.replies)))
                (start, reply), = pipe.replies.values()
                assert len(reply) == 12
                # 2 frames heard: 2 * 1920 - 555 samples (the decoder's hold-back) = 136.9 ms
                await conn.conversation.item.truncate(item_id=item["id"], content_index=0, audio_end_ms=136)
                await until(conn, "conversation.item.truncated")
                ids, kv = await asyncio.wrap_future(pipeline.request(lambda: (
                    list(pipe.ids), program.by_name["thinker"].kv.length(pipe.kv_key))))
                assert len(ids) == start + 2 and kv <= start + 2
                await asyncio.wrap_future(pipeline.request(program.kv_check))
                await conn.conversation.item.retrieve(item_id=item["id"])
                text = (await until(conn, "conversation.item.retrieved"))["item"]["content"][0]["transcript"]
                assert text == program.tokenizer.decode(ids[start:], skip_special=True)
                check_audio_turn(await manual_turn(conn, 0.5), frames=12)  # the conversation goes on from there
                ids = await asyncio.wrap_future(pipeline.request(lambda: list(pipe.ids)))
                assert ids[start + 2] == program.model.cfg.im_end_token_id  # the cut reply was closed

        asyncio.run(go())


def test_input_transcription_runs_beside_the_response(server):
    url, _ = server

    async def go():
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await next_event(conn)
            await conn.session.update(session={**MANUAL, "audio": {"input": {
                "turn_detection": None, "transcription": {"model": "qwen3-omni"}}}})
            await until(conn, "session.updated")
            events = await manual_turn(conn, 0.9)
            item_id = events[0]["item_id"]
            while not any(e["type"] == "conversation.item.input_audio_transcription.completed" for e in events):
                events.append(await next_event(conn))
            kinds = [e["type"] for e in events]
            deltas = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.delta"]
            done = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
            assert deltas and all(e["item_id"] == item_id for e in deltas) and done["item_id"] == item_id
            assert done["transcript"] == "".join(e["delta"] for e in deltas)
            # the response did not wait for the transcript
            completed = kinds.index("conversation.item.input_audio_transcription.completed")
            assert kinds.index("response.created") < completed
            await conn.conversation.item.retrieve(item_id=item_id)
            item = (await until(conn, "conversation.item.retrieved"))["item"]
            assert item["content"][0]["transcript"] == done["transcript"]

    asyncio.run(go())


def test_eight_concurrent_sessions_each_complete_a_turn(server):
    url, srv = server

    async def one(i: int) -> dict:
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await next_event(conn)
            await conn.session.update(session=MANUAL)
            await until(conn, "session.updated")
            return check_audio_turn(await manual_turn(conn, 0.5 + 0.1 * i, seed=i))

    async def go():
        done = await asyncio.gather(*(one(i) for i in range(8)))
        for _ in range(100):  # the server sees each close a moment after the client sends it
            if srv.metrics.sessions == 0:
                break
            await asyncio.sleep(0.05)
        return done

    done = asyncio.run(go())
    assert len({d["id"] for d in done}) == 8
    assert srv.metrics.sessions == 0 and srv.metrics.sessions_total >= 8


def test_auth_browser_subprotocol_and_session_limit(pipeline):
    import websockets

    with running(pipeline, ServerConfig(api_key="sekret", max_sessions=1, limits=LIMITS)) as (url, srv):
        ws_url = url.replace("http", "ws") + "/realtime?model=qwen3-omni"

        async def go():
            with pytest.raises(Exception, match="401"):
                async with client(url, key="wrong").realtime.connect(model="qwen3-omni") as conn:
                    await next_event(conn)
            async with aiohttp.ClientSession() as http:
                assert (await http.get(f"{url}/models")).status == 401
                ok = await http.get(f"{url}/models", headers={"Authorization": "Bearer sekret"})
                assert ok.status == 200
            protocols = ["realtime", "openai-insecure-api-key.sekret"]
            async with websockets.connect(ws_url, subprotocols=protocols) as browser:
                assert browser.subprotocol == "realtime"
                assert json.loads(await browser.recv())["type"] == "session.created"
                # one session is the limit: the next socket is closed with 1013
                async with websockets.connect(ws_url, additional_headers={"Authorization": "Bearer sekret"}) as extra:
                    with pytest.raises(websockets.ConnectionClosed) as closed:
                        await extra.recv()
                    assert closed.value.rcvd.code == 1013
            assert srv.metrics.rejected_total == 1

        asyncio.run(go())


def test_oversized_append_and_session_expiry(pipeline):
    import websockets

    with running(pipeline, ServerConfig(max_session_s=1.5, limits=LIMITS)) as (url, _):
        ws_url = url.replace("http", "ws") + "/realtime"

        async def go():
            async with websockets.connect(ws_url, max_size=None) as ws:
                assert json.loads(await ws.recv())["type"] == "session.created"
                huge = base64.b64encode(b"\x00" * (16 * 1024 * 1024)).decode()
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": huge}))
                error = json.loads(await ws.recv())
                assert error["type"] == "error" and error["error"]["param"] == "audio"
                expired = json.loads(await asyncio.wait_for(ws.recv(), 10))
                assert expired["error"]["code"] == "session_expired"
                with pytest.raises(websockets.ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 10)

        asyncio.run(go())


def test_g711_in_and_out(server):
    import torch

    from realtime.audio import AudioFormat
    from realtime.pcm import float_to_g711, resample

    url, _ = server

    async def go():
        async with client(url).realtime.connect(model="qwen3-omni") as conn:
            await next_event(conn)
            fmt = {"type": "audio/pcmu"}
            await conn.session.update(session={"type": "realtime", "audio": {
                "input": {"format": fmt, "turn_detection": None}, "output": {"format": {"type": "audio/pcma"}}}})
            updated = await until(conn, "session.updated")
            assert updated["session"]["audio"]["output"]["format"] == {"type": "audio/pcma"}
            ulaw = float_to_g711(resample(torch.from_numpy(speech_like(0.8)), 24000, 8000), "ulaw")
            await conn.input_audio_buffer.append(audio=base64.b64encode(ulaw).decode())
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            seen: list[dict] = []
            done = await until(conn, "response.done", seen)
            audio = b"".join(base64.b64decode(e["delta"]) for e in seen if e["type"] == "response.output_audio.delta")
            samples_24k = 1920 * LIMITS.max_frames - 555
            assert abs(len(audio) - samples_24k / 3) <= 1  # one byte per 8 kHz sample
            assert done["response"]["audio"]["output"]["format"] == AudioFormat("audio/pcma", 8000).to_config()

    asyncio.run(go())


def test_client_that_disconnects_mid_response_frees_everything(pipeline):
    with running(pipeline, ServerConfig(limits=Limits(max_text_tokens=200, max_frames=200))) as (url, srv):

        async def go():
            async with client(url).realtime.connect(model="qwen3-omni") as conn:
                await next_event(conn)
                await conn.session.update(session=MANUAL)
                await until(conn, "session.updated")
                await append_audio(conn, speech_like(0.7))
                await conn.input_audio_buffer.commit()
                await conn.response.create()
                await until(conn, "response.output_audio.delta")
            for _ in range(100):  # the server notices the close, cancels the turn and ends the session
                await asyncio.sleep(0.05)
                if srv.metrics.sessions == 0 and not pipeline.program.sessions:
                    break

        asyncio.run(go())
        pipeline.sync()
        assert pipeline.program.kv_check() == {"thinker": 0, "talker": 0}
        assert not pipeline.program.turns and not pipeline.program.sessions


def test_server_shutdown_closes_open_sockets(pipeline):
    import websockets

    async def go(url):
        ws = await websockets.connect(url.replace("http", "ws") + "/realtime")
        assert json.loads(await ws.recv())["type"] == "session.created"
        return ws

    loop = asyncio.new_event_loop()
    with running(pipeline, ServerConfig(limits=LIMITS)) as (url, srv):
        ws = loop.run_until_complete(go(url))
    # leaving `running` shut the server down; the open socket was closed with 1001 (going away)
    with pytest.raises(websockets.ConnectionClosed) as closed:
        loop.run_until_complete(asyncio.wait_for(ws.recv(), 10))
    assert closed.value.rcvd.code == 1001 and srv.metrics.sessions == 0
    loop.close()
