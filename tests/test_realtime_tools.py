"""Tools end to end. Random weights never write a tool call, so this test gives the tiny model weights
that do: every decoder layer's attention output and MLP output are zeroed, which leaves the thinker a
next-token table over its input embeddings, and the table is set to write one fixed tool call after
"assistant\\n". Everything else (server, protocol, pipeline, model code, tokenizer, template) is real."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from models.common.tokenizer import Tokenizer
from models.qwen3_omni.model import load_model
from models.qwen3_omni.placement import PipelineConfig
from models.qwen3_omni.program import build_pipeline
from realtime.server import ServerConfig
from realtime.session import Limits
from tests.realtime_server import client, next_event, running, until

CALL = '{"name":"get_weather","arguments":{"zip":75}}'
TOOL = {"type": "function", "name": "get_weather", "description": "Weather by zip code.",
        "parameters": {"type": "object", "properties": {"zip": {"type": "integer"}}, "required": ["zip"]}}


def scripted_model(tokenizer: Tokenizer):
    model = load_model("tiny")
    special = tokenizer.special_ids
    chain = [198, special["<tool_call>"], *tokenizer.encode(CALL), special["</tool_call>"], special["<|im_end|>"]]
    assert len(set(chain[:-1])) == len(chain) - 1, "a next-token table needs distinct tokens"
    text = model.thinker.model
    with torch.no_grad():
        for layer in text.layers:
            layer.self_attn.o_proj.weight.zero_()
            mlp = layer.mlp
            (mlp.experts.w2 if hasattr(mlp, "experts") else mlp.down_proj.weight).zero_()
        text.norm.weight.fill_(1.0)
        h = text.embed_tokens.weight.shape[1]
        basis = torch.linalg.qr(torch.randn(h, h, generator=torch.Generator().manual_seed(0)))[0]
        for i, (token, following) in enumerate(zip(chain, chain[1:], strict=False)):
            text.embed_tokens.weight[token] = basis[i]
            model.thinker.lm_head.weight[following] = 50 * basis[i]
    return model


@pytest.fixture(scope="module")
def tool_pipeline():
    tokenizer = Tokenizer.builtin()
    with build_pipeline(PipelineConfig(), model=scripted_model(tokenizer)) as p:
        yield p


def test_tool_call_round_trip(tool_pipeline):
    with running(tool_pipeline, ServerConfig(limits=Limits(max_text_tokens=40, max_frames=8))) as (url, _):

        async def go():
            async with client(url).realtime.connect(model="qwen3-omni") as conn:
                await next_event(conn)
                await conn.session.update(session={"type": "realtime", "instructions": "You help with weather.",
                                                   "tools": [TOOL], "audio": {"input": {"turn_detection": None}}})
                await until(conn, "session.updated")
                await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "Weather in 75?"}]})
                await until(conn, "conversation.item.done")
                await conn.response.create()
                seen: list[dict] = []
                await until(conn, "response.done", seen)
                kinds = [e["type"] for e in seen]
                assert "response.output_audio.delta" not in kinds  # a tool call is not spoken
                added = next(e for e in seen if e["type"] == "response.output_item.added")["item"]
                args = next(e for e in seen if e["type"] == "response.function_call_arguments.done")
                assert added["type"] == "function_call" and args["name"] == "get_weather"
                assert json.loads(args["arguments"]) == {"zip": 75} and args["call_id"] == added["call_id"]
                assert kinds.index("response.function_call_arguments.delta") < kinds.index(
                    "response.function_call_arguments.done") < kinds.index("response.output_item.done")
                done = seen[-1]["response"]
                assert done["status"] == "completed" and done["output"][0]["type"] == "function_call"
                # the client runs the function and hands the result back
                await conn.conversation.item.create(item={"type": "function_call_output", "call_id": added["call_id"],
                                                          "output": '{"temp_c": 21}'})
                await until(conn, "conversation.item.done")
                await conn.response.create()
                second = await until(conn, "response.done")
                assert second["response"]["status"] == "completed"
                program = tool_pipeline.program
                session = await asyncio.wrap_future(tool_pipeline.request(
                    lambda: next(iter(program.sessions.values()))))
                return program.tokenizer.decode(session.ids)

        prompt = asyncio.run(go())
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt and "You help with weather." in prompt
    assert '<tool_response>\n{"temp_c": 21}\n</tool_response>' in prompt
    assert prompt.count("<|im_start|>assistant\n<tool_call>" + CALL + "</tool_call>") == 2  # both replies
