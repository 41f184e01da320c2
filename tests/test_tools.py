import json

import pytest

from models.common.chat import Turn, render
from models.common.tokenizer import Tokenizer
from models.qwen3_omni.tools import (
    FORCED_INSTRUCTION,
    REQUIRED_INSTRUCTION,
    ToolCall,
    assistant_text,
    merge_tool_results,
    parse_tool_calls,
    qwen_tool,
    render_tools_system,
    tool_call_text,
    tool_response_text,
    tools_system,
    with_tools,
)
from tests.reference_paths import strip_tool_calls, tool_responses_text

TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END, NL = 151657, 151658, 151665, 151666, 198

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME = {"type": "function", "name": "get_time", "description": "Heure à Zürich.", "parameters": {"type": "object"}}

# Written out by hand from Qwen3's chat template (tokenizer_config.json of Qwen/Qwen3-8B; Qwen3-VL's is the same).
HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
WEATHER_LINE = (
    '{"type": "function", "function": {"name": "get_weather", "description": "Get the weather.", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}'
)
TIME_LINE = (
    '{"type": "function", "function": {"name": "get_time", "description": "Heure à Zürich.", '
    '"parameters": {"type": "object"}}}'
)

# Test data: Qwen3's published chat template (Qwen/Qwen3-8B tokenizer_config.json "chat_template"), used only to
# cross-check our strings through transformers' own template renderer.
QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""  # noqa: E501


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.builtin()


def test_one_tool_exact_text() -> None:
    assert render_tools_system("Be brief.", [WEATHER]) == "Be brief.\n\n" + HEADER + WEATHER_LINE + FOOTER


def test_two_tools_exact_text_without_system_text() -> None:
    # No system message: the system turn holds the tools block alone (Qwen3 adds no default prompt).
    assert render_tools_system("", [WEATHER, TIME]) == HEADER + WEATHER_LINE + "\n" + TIME_LINE + FOOTER


def test_no_tools_leaves_system_text() -> None:
    assert render_tools_system("Be brief.", []) == "Be brief."
    assert render_tools_system("", []) == ""


def test_realtime_tool_converted_to_chat_completions_form() -> None:
    assert qwen_tool(WEATHER) == {
        "type": "function",
        "function": {"name": "get_weather", "description": "Get the weather.", "parameters": WEATHER["parameters"]},
    }
    assert list(qwen_tool(WEATHER)["function"]) == ["name", "description", "parameters"]
    assert qwen_tool({"type": "function", "name": "ping"}) == {"type": "function", "function": {"name": "ping"}}
    already = qwen_tool(WEATHER)
    assert qwen_tool(already) == already
    assert render_tools_system("x", [already]) == render_tools_system("x", [WEATHER])
    with pytest.raises(ValueError, match="function tools"):
        qwen_tool({"type": "mcp", "server_label": "x"})
    with pytest.raises(ValueError, match="name"):
        qwen_tool({"type": "function", "parameters": {}})
    for nameless in ({}, {"name": ""}, {"name": 3}):  # the Chat Completions form is checked too
        with pytest.raises(ValueError, match="name"):
            qwen_tool({"type": "function", "name": "a", "function": nameless})


def test_tool_choice() -> None:
    tools = [WEATHER, TIME]
    assert tools_system("Be brief.", tools) == render_tools_system("Be brief.", tools)
    assert tools_system("Be brief.", tools, "none") == "Be brief."
    required = tools_system("Be brief.", tools, "required")
    assert required == f"Be brief.\n\n{REQUIRED_INSTRUCTION}\n\n" + HEADER + WEATHER_LINE + "\n" + TIME_LINE + FOOTER
    assert tools_system("", tools, "required").startswith(REQUIRED_INSTRUCTION + "\n\n# Tools\n\n")
    forced = tools_system("", tools, {"type": "function", "name": "get_time"})
    assert forced == 'In this reply, you must call the function "get_time".\n\n' + HEADER + TIME_LINE + FOOTER
    assert FORCED_INSTRUCTION.format(name="get_time") in forced
    assert tools_system("", tools, {"type": "function", "function": {"name": "get_time"}}) == forced
    with pytest.raises(ValueError, match="not among the tools"):
        tools_system("", tools, {"type": "function", "name": "launch"})
    with pytest.raises(ValueError, match="at least one tool"):
        tools_system("", [], "required")
    with pytest.raises(ValueError, match="tool_choice"):
        tools_system("", tools, "sometimes")
    assert tools_system("Be brief.", [], "auto") == "Be brief."


def test_call_and_response_text() -> None:
    # Compact OpenAI arguments are printed the way the template prints an arguments object.
    assert tool_call_text("get_weather", '{"city":"Paris","days":[1,2]}') == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>'
    )
    assert tool_call_text("f", "not json") == '<tool_call>\n{"name": "f", "arguments": not json}\n</tool_call>'
    calls = [ToolCall("get_weather", '{"city":"Zürich"}'), ToolCall("get_time", "{}")]
    both = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    assert assistant_text("", calls) == both
    assert assistant_text("Let me check.", calls) == "Let me check.\n" + both
    assert assistant_text("Hi.", []) == "Hi."
    assert tool_response_text('{"temp": 21}') == '<tool_response>\n{"temp": 21}\n</tool_response>'
    two = "<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response>"
    assert tool_responses_text(["a", "b"]) == two


def test_special_token_ids(tok: Tokenizer) -> None:
    for token, i in (("<tool_call>", 151657), ("</tool_call>", 151658), ("<tool_response>", 151665)):
        assert tok.special_ids[token] == i
    ids = tok.encode(tool_call_text("get_weather", '{"city":"Paris"}'))
    assert ids[:2] == [TOOL_CALL, NL] and ids[-1] == TOOL_CALL_END  # "}}\n" is one BPE token
    assert tok.decode(ids[2:-1]) == '{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    assert not set(ids[2:-1]) & set(tok.special_ids.values())
    ids = tok.encode(tool_response_text("21 degrees"))
    assert ids[:2] == [TOOL_RESPONSE, NL] and ids[-2:] == [NL, TOOL_RESPONSE_END]
    # The literal tags inside the tools block are special tokens too, as in the reference tokenizer.
    block = tok.encode(render_tools_system("", [WEATHER]))
    assert block.count(TOOL_CALL) == 2 and block.count(TOOL_CALL_END) == 2


def test_parse_single_call_with_text() -> None:
    out = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'
    assert parse_tool_calls(out) == ([ToolCall("get_weather", '{"city":"Zürich"}')], [])
    assert strip_tool_calls(out) == "Sure."


def test_parse_multiple_calls_and_text_around() -> None:
    out = (
        'Checking. <tool_call>{"name": "a", "arguments": {"x": 1, "y": [1, 2]}}</tool_call>\n'
        "between\n"
        '<tool_call>\n{"name": "b", "arguments": "{\\"q\\": \\"hi\\"}"}\n</tool_call> done'
    )
    assert parse_tool_calls(out) == ([ToolCall("a", '{"x":1,"y":[1,2]}'), ToolCall("b", '{"q":"hi"}')], [])
    assert strip_tool_calls(out) == "Checking. \nbetween\n done"
    assert parse_tool_calls('<tool_call>{"name": "c"}</tool_call>') == ([ToolCall("c", "{}")], [])
    assert parse_tool_calls("  just text\n") == ([], [])
    assert strip_tool_calls("  just text\n") == "just text"


def test_parse_round_trips_rendered_calls() -> None:
    calls = [ToolCall("get_weather", '{"city":"Paris"}'), ToolCall("get_time", '{"tz":"Europe/Zürich"}')]
    out = assistant_text("Let me check.", calls)
    assert parse_tool_calls(out) == (calls, [])
    assert strip_tool_calls(out) == "Let me check."


def test_parse_block_left_open_at_the_end() -> None:
    assert parse_tool_calls('Ok <tool_call>\n{"name": "a", "arguments": {}}\n') == ([ToolCall("a", "{}")], [])
    assert parse_tool_calls('<tool_call>\n{"name": "a", "argu') == ([], ['{"name": "a", "argu'])
    assert strip_tool_calls('Ok <tool_call>\n{"name": "a", "argu') == "Ok"


@pytest.mark.parametrize(
    "block",
    [
        '{"name": "a", "arguments": {"x": 1}',  # not JSON
        '{"arguments": {}}',  # no name
        '{"name": "", "arguments": {}}',
        '["a", {}]',
        '{"name": "a", "arguments": [1, 2]}',  # arguments not an object
        '{"name": "a", "arguments": "x=1"}',  # arguments string not JSON
    ],
)
def test_parse_malformed_call_is_returned_not_raised(block: str) -> None:
    out = f'Hi <tool_call>{{"name": "ok", "arguments": {{}}}}</tool_call> <tool_call>\n{block}\n</tool_call> bye'
    assert parse_tool_calls(out) == ([ToolCall("ok", "{}")], [block])
    assert strip_tool_calls(out) == "Hi   bye"


def test_with_tools_puts_the_block_in_the_system_turn() -> None:
    user = Turn("user", "Hi", audio_tokens=3)
    assert with_tools([Turn("system", "Be brief."), user], [WEATHER]) == [
        Turn("system", render_tools_system("Be brief.", [WEATHER])),
        user,
    ]
    assert with_tools([user], [WEATHER], "required") == [Turn("system", tools_system("", [WEATHER], "required")), user]
    assert with_tools([user], [WEATHER], "none") == [user]
    assert with_tools([Turn("system", "Be brief."), user], [WEATHER], "none") == [Turn("system", "Be brief."), user]


def test_merge_tool_results() -> None:
    a, b, c = (Turn("user", tool_response_text(x)) for x in "abc")
    call = Turn("assistant", assistant_text("", [ToolCall("f", "{}")]))
    merged = merge_tool_results([Turn("user", "q"), call, a, b, c, Turn("user", "thanks"), a])
    assert merged == [
        Turn("user", "q"),
        call,
        Turn("user", tool_responses_text(["a", "b", "c"])),
        Turn("user", "thanks"),
        a,
    ]


def _text(turns: list[Turn]) -> str:
    return "".join(f"<|im_start|>{t.role}\n{t.text}<|im_end|>\n" for t in turns) + "<|im_start|>assistant\n"


@pytest.mark.parametrize("system", ["Be brief.", ""])
def test_matches_qwen3_chat_template(tok: Tokenizer, system: str) -> None:
    jinja = pytest.importorskip("transformers.utils.chat_template_utils")
    tools = [WEATHER, TIME]
    calls = [ToolCall("get_weather", '{"city":"Zürich"}'), ToolCall("get_time", "{}")]
    content = "Let me check." if system else ""
    messages = [{"role": "system", "content": system}] if system else []
    messages += [
        {"role": "user", "content": "Weather and time in Zürich?"},
        {
            "role": "assistant",
            "content": content,
            # transformers' convention (and what vLLM makes of OpenAI's string arguments): an arguments object
            "tool_calls": [{"function": {"name": c.name, "arguments": json.loads(c.arguments)}} for c in calls],
        },
        {"role": "tool", "content": "Sunny, 21 °C"},
        {"role": "tool", "content": "14:05"},
    ]
    chat_tools = [qwen_tool(t) for t in tools]  # what a Chat Completions client would send
    (expected,), _ = jinja.render_jinja_template(
        [messages], tools=chat_tools, chat_template=QWEN3_TEMPLATE, add_generation_prompt=True
    )
    turns = [
        Turn("system", render_tools_system(system, tools)),
        Turn("user", "Weather and time in Zürich?"),
        Turn("assistant", assistant_text(content, calls)),
        Turn("user", tool_responses_text(["Sunny, 21 °C", "14:05"])),
    ]
    assert _text(turns) == expected
    # The same prompt through the pipeline's path: tools added to the first turns, results merged.
    first = [Turn("system", system)] if system else []
    first += [turns[1], turns[2], *(Turn("user", tool_response_text(r)) for r in ("Sunny, 21 °C", "14:05"))]
    assert merge_tool_results(with_tools(first, tools)) == turns
    assert list(render(tok, turns).ids) == tok.encode(expected)
