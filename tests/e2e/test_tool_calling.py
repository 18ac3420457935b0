"""Tool calling end to end through the official openai client: SmolLM2 served with the
Hermes-style tool template fixture (tests/fixtures/tools/hermes_tools.jinja), so the tool
definitions reach the prompt and the output is read for <tool_call> blocks. With tool_choice
"required" or a named function the arguments are constrained by the function's schema: every
sampled call must parse and validate against it (jsonschema), plain and streamed, and the
streamed deltas must join into the same calls as the complete answer."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import requests

from conftest import REPO, assert_openai_error, start_server, stop_and_check

TEMPLATE = REPO / "tests" / "fixtures" / "tools" / "hermes_tools.jinja"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 16}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]


@pytest.fixture(scope="module")
def tool_server():
    s = start_server("--chat-template", str(TEMPLATE))
    yield s
    stop_and_check(s)


@pytest.fixture(scope="module")
def client(tool_server):
    return openai.OpenAI(base_url=tool_server.url("/v1"), api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(tool_server) -> str:
    return requests.get(tool_server.url("/v1/models"), timeout=10).json()["data"][0]["id"]


def assert_valid_call(call, names=tuple(SCHEMAS)) -> dict:
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name in names
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


def test_named_function_gives_arguments_valid_against_its_schema(client, model):
    r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], n=8, temperature=1.0,
                                       seed=7, max_tokens=96,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None
        assert len(choice.message.tool_calls) == 1  # a named function is called once
        assert_valid_call(choice.message.tool_calls[0], names=("get_weather",))


def test_required_calls_some_tool_every_time(client, model):
    r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                       parallel_tool_calls=False, n=8, temperature=1.0, seed=3, max_tokens=96)
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls", choice
        assert len(choice.message.tool_calls) == 1  # parallel_tool_calls=False: one call
        assert_valid_call(choice.message.tool_calls[0])


def collect_stream(stream) -> tuple[dict[int, dict], list[str], str]:
    """Joins tool_calls deltas by index as OpenAI's own clients do; checks each delta's shape."""
    calls: dict[int, dict] = {}
    finishes: list[str] = []
    content = ""
    for chunk in stream:
        for choice in chunk.choices:
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
            content += choice.delta.content or ""
            for d in choice.delta.tool_calls or []:
                if d.index not in calls:  # the first delta of a call: id, type and name, no arguments yet
                    assert d.id and d.id.startswith("call_") and d.type == "function", d
                    assert d.function.name and d.function.arguments == "", d
                    calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
                else:  # later ones: arguments fragments only
                    assert d.id is None and d.function.name is None, d
                    calls[d.index]["arguments"] += d.function.arguments
    return calls, finishes, content


def test_streamed_deltas_join_into_the_same_call(client, model):
    kwargs = dict(model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", temperature=0.0,
                  parallel_tool_calls=False, max_tokens=96)
    whole = client.chat.completions.create(**kwargs)
    [call] = whole.choices[0].message.tool_calls
    calls, finishes, content = collect_stream(client.chat.completions.create(stream=True, **kwargs))
    assert finishes == ["tool_calls"]
    assert content == ""
    assert list(calls) == [0]
    assert calls[0]["name"] == call.function.name
    assert calls[0]["arguments"] == call.function.arguments  # greedy: the same text, split into deltas
    jsonschema.validate(json.loads(calls[0]["arguments"]), SCHEMAS[calls[0]["name"]])


def test_streamed_samples_all_validate(client, model):
    stream = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], stream=True, seed=11,
                                            tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                            temperature=1.0, max_tokens=96)
    calls, finishes, _ = collect_stream(stream)
    assert finishes == ["tool_calls"]
    assert [c["name"] for c in calls.values()] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), SCHEMAS["get_weather"])


def test_multi_turn_tool_conversation(client, model, tool_server):
    """The call goes back as an assistant message with tool_calls (arguments as OpenAI's JSON
    string), the result as a tool message; the template renders both, and the next turn is
    answered plainly and streamed."""
    first = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="required",
                                           parallel_tool_calls=False, temperature=0.0, max_tokens=96)
    [call] = first.choices[0].message.tool_calls
    arguments = assert_valid_call(call)
    messages = ASK + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"forecast": "sunny", "high_c": 24})},
    ]
    rendered = requests.post(tool_server.url("/tokenize"), timeout=30, json={
        "model": model, "messages": messages, "tools": [WEATHER], "return_token_strs": True}).json()
    text = requests.post(tool_server.url("/detokenize"), timeout=30,
                         json={"model": model, "tokens": rendered["tokens"]}).json()["prompt"]
    assert '"name": "get_weather"' in text and "<tools>" in text  # the tool definition
    assert json.dumps(arguments) in text or f'"city": {json.dumps(arguments["city"])}' in text  # the call, re-rendered
    assert "<tool_response>" in text and '"forecast": "sunny"' in text  # the result
    kwargs = dict(model=model, messages=messages, tools=[WEATHER], tool_choice="none", temperature=0.0,
                  max_tokens=16, extra_body={"ignore_eos": True})
    r = client.chat.completions.create(**kwargs)
    assert r.usage.prompt_tokens == rendered["count"]
    assert r.choices[0].message.tool_calls is None  # tool_choice "none": never read for calls
    assert r.choices[0].finish_reason == "length"
    _, finishes, content = collect_stream(client.chat.completions.create(stream=True, **kwargs))
    assert finishes == ["length"]
    assert content == r.choices[0].message.content  # greedy: the same answer


def test_auto_is_answered_as_content_or_calls(client, model):
    # "auto" leaves the text free, but a <tool_call> the model opens is held to a tool's schema
    # (an XGrammar triggered tag): every call it makes validates, and no answer that ended on
    # its own holds a broken call.
    r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], n=8, temperature=1.0,
                                       seed=5, max_tokens=96)
    calls = 0
    for choice in r.choices:
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            for call in choice.message.tool_calls:
                assert_valid_call(call)
                calls += 1
        else:
            assert isinstance(choice.message.content, str)
            if choice.finish_reason == "stop":
                assert "<tool_call>" not in choice.message.content, choice.message.content
    assert calls > 0, [c.message.content for c in r.choices]


@pytest.mark.parametrize("extra,param", [
    ({"tool_choice": {"type": "function", "function": {"name": "launch_rocket"}}}, "tool_choice.function.name"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/nowhere"}}}}}], "tool_choice": "required"},
     "tools[0].function.parameters"),
])
def test_bad_tools_are_a_400_naming_the_field(tool_server, model, extra, param):
    body = {"model": model, "messages": ASK, "tools": [WEATHER], "max_tokens": 4, **extra}
    assert_openai_error(requests.post(tool_server.url("/v1/chat/completions"), json=body, timeout=30), 400, param)
    assert tool_server.alive()


def test_template_without_tool_support_refuses_tools(openai_client, model_id):
    """SmolLM2's own template never reads `tools`: answering would silently drop them."""
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.chat.completions.create(model=model_id, messages=ASK, tools=[WEATHER], max_tokens=2)
    assert e.value.body["param"] == "tools"
    r = openai_client.chat.completions.create(model=model_id, messages=ASK, tools=[WEATHER], tool_choice="none",
                                              max_tokens=2)
    assert r.choices[0].message.tool_calls is None
