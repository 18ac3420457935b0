"""Structured output end to end: response_format (json_object, json_schema through the openai
client's Pydantic `parse`) and vLLM's guided_json / guided_regex / guided_choice / guided_grammar
on the real server. Sampled at temperature 1.0, every output must validate against its schema
(jsonschema) or fully match its regex (re.fullmatch); what cannot be compiled is a 400 and the
server carries on."""

from __future__ import annotations

import json
import re
from enum import Enum
from typing import Literal, Optional, Union

import jsonschema
import openai
import pytest
import requests
from pydantic import BaseModel, Field

from conftest import assert_openai_error

N = 10  # choices per request: 5 schemas x 10 = 50 sampled generations


class Color(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Person(BaseModel):
    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=120)
    favorite_color: Color
    nickname: Optional[str] = Field(default=None, max_length=12)  # optional: anyOf [string, null]


class Item(BaseModel):
    sku: str = Field(pattern=r"^[A-Z]{3}-[0-9]{3}$")
    quantity: int = Field(ge=1, le=9)


class Order(BaseModel):
    order_id: int = Field(ge=1, le=99999)
    items: list[Item] = Field(min_length=1, max_length=3)
    status: Literal["open", "shipped", "closed"]


class Circle(BaseModel):
    kind: Literal["circle"]
    radius: int = Field(ge=1, le=100)


class Square(BaseModel):
    kind: Literal["square"]
    side: int = Field(ge=1, le=100)


class Drawing(BaseModel):
    title: str = Field(max_length=20)
    shapes: list[Union[Circle, Square]] = Field(max_length=3)  # anyOf of objects
    scale: float = Field(ge=0, le=10)


class Flags(BaseModel):
    enabled: bool
    tags: list[Literal["a", "b", "c"]] = Field(max_length=4)
    ratio: Optional[int] = Field(default=None, ge=-5, le=5)


class Address(BaseModel):
    street: str = Field(max_length=24)
    city: str = Field(max_length=16)


class Company(BaseModel):
    name: str = Field(max_length=16)
    address: Address  # nested object ($ref)
    employees: int = Field(ge=1, le=1000)


SCHEMAS = [Person, Order, Drawing, Flags, Company]


def parse(client, **kwargs):
    # 50 tokens x 10 choices can take minutes on a shared 2-core machine: past the shared
    # client's 60 s timeout, which would fail the test for the machine's load, not the output.
    client = client.with_options(timeout=600)
    # openai >= 1.92 has parse() on chat.completions; older clients under beta.
    completions = client.chat.completions if hasattr(client.chat.completions, "parse") else \
        client.beta.chat.completions
    return completions.parse(**kwargs)


@pytest.mark.parametrize("model_cls", SCHEMAS, ids=lambda m: m.__name__)
def test_pydantic_parse_every_sample_validates(openai_client, model_id, model_cls):
    completion = parse(openai_client, model=model_id, response_format=model_cls, n=N, temperature=1.0,
                       max_tokens=160, seed=11,
                       messages=[{"role": "user", "content": f"Make up one example {model_cls.__name__} as JSON."}])
    schema = openai.lib._pydantic.to_strict_json_schema(model_cls)
    assert len(completion.choices) == N
    for choice in completion.choices:
        assert choice.finish_reason == "stop", choice.message.content
        parsed = choice.message.parsed
        assert isinstance(parsed, model_cls), choice.message.content
        jsonschema.validate(json.loads(choice.message.content), schema)
        # The fields come in the order the model declares them (the schema's property order),
        # not sorted: a strict schema requires them all.
        assert list(json.loads(choice.message.content)) == list(model_cls.model_fields), choice.message.content


def test_json_object_gives_an_object(openai_client, model_id):
    r = openai_client.chat.completions.create(
        model=model_id, n=4, temperature=1.0, max_tokens=96, seed=3, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Describe a cat as JSON."}])
    for choice in r.choices:
        if choice.finish_reason == "stop":  # free-form JSON has no bound on its length
            assert isinstance(json.loads(choice.message.content), dict), choice.message.content
        else:
            assert choice.message.content.startswith("{"), choice.message.content


def test_streamed_json_schema_deltas_join_into_a_valid_document(openai_client, model_id):
    schema = openai.lib._pydantic.to_strict_json_schema(Person)
    stream = openai_client.chat.completions.create(
        model=model_id, stream=True, temperature=1.0, max_tokens=120, seed=5,
        response_format={"type": "json_schema", "json_schema": {"name": "Person", "schema": schema, "strict": True}},
        messages=[{"role": "user", "content": "A person, as JSON."}])
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("pattern", [
    r"[0-9]{3}-[0-9]{4}",
    r"(yes|no)\. [A-Z][a-z]{2,12}( [a-z]{1,10}){0,4}\.",
    r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
])
def test_guided_regex_outputs_fullmatch(openai_client, model_id, pattern):
    r = openai_client.completions.create(model=model_id, prompt="Answer:", n=N, temperature=1.0, max_tokens=48,
                                         seed=1, extra_body={"guided_regex": pattern})
    for choice in r.choices:
        assert choice.finish_reason == "stop", choice.text
        assert re.fullmatch(pattern, choice.text), choice.text


def test_guided_choice_and_grammar(openai_client, model_id):
    choices = ["positive", "negative", "neutral"]
    r = openai_client.chat.completions.create(
        model=model_id, n=N, temperature=1.0, max_tokens=8, seed=2, extra_body={"guided_choice": choices},
        messages=[{"role": "user", "content": "Sentiment of 'I love it'?"}])
    assert all(c.message.content in choices for c in r.choices), [c.message.content for c in r.choices]
    grammar = 'root ::= expr\nexpr ::= term (("+" | "-") term){0,3}\nterm ::= [1-9] [0-9]{0,2}'
    r = openai_client.completions.create(model=model_id, prompt="2+2=", n=N, temperature=1.0, max_tokens=24,
                                         seed=4, extra_body={"guided_grammar": grammar})
    for c in r.choices:
        assert c.finish_reason == "stop", c.text
        assert re.fullmatch(r"[1-9][0-9]{0,2}([+-][1-9][0-9]{0,2}){0,3}", c.text), c.text


def test_guided_json_with_logprobs(openai_client, model_id):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = openai_client.completions.create(model=model_id, prompt="JSON:", temperature=1.0, max_tokens=16, logprobs=2,
                                         extra_body={"guided_json": schema})
    jsonschema.validate(json.loads(r.choices[0].text), schema)
    assert len(r.choices[0].logprobs.tokens) == r.usage.completion_tokens


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "not an object"}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_grammar": "root ::= \"a\" |"}, "guided_grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": {"type": "object"}, "guided_regex": "a"}, "guided_regex"),
])
def test_what_cannot_be_compiled_is_a_400_naming_it(server, model_id, body, param):
    r = requests.post(server.url("/v1/chat/completions"), timeout=60, json={
        "model": model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body})
    assert_openai_error(r, 400, param)
    # The server carries on.
    ok = requests.post(server.url("/v1/completions"), timeout=60,
                       json={"model": model_id, "prompt": "Hi", "max_tokens": 2, "guided_choice": ["a", "b"]})
    assert ok.status_code == 200, ok.text
    assert ok.json()["choices"][0]["text"] in ("a", "b")
