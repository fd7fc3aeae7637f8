"""response_format through the official `openai` client on a random-weight model: json_schema
output parses and validates against its schema, whole and streamed, and through the client's own
`parse`; json_object output is a JSON object; a schema the engine cannot enforce, or a JSON
output asked together with tools the model may call, is a 400 naming response_format."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import httpx
import pytest
from pydantic import BaseModel, Field

from tests.helpers.json_schema_check import schema_errors
from tests.helpers.tools import TOOLS

HELLO = [{"role": "user", "content": "Describe a city."}]
MODEL = "chat-model0"
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000},
        "kind": {"enum": ["town", "city"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["city", "population", "kind", "tags"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA,
                                                      "strict": True}}


class City(BaseModel):
    city: Annotated[str, Field(max_length=12)]
    population: Annotated[int, Field(ge=0, le=100000)]
    kind: Literal["town", "city"]


def post(api, body) -> httpx.Response:
    return httpx.post(api.url + "/v1/chat/completions", json={"messages": HELLO, **body})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_schema_output_parses_and_validates(client, seed):
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=300, seed=seed,
                                           response_format=JSON_SCHEMA)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert schema_errors(json.loads(choice.message.content), SCHEMA) == []


def test_streamed_json_schema_output_parses_and_validates(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=300,
                                                 seed=5, stream=True, response_format=JSON_SCHEMA))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert schema_errors(json.loads(text), SCHEMA) == []


def test_the_clients_parse_gets_an_instance_of_its_model(client):
    reply = client.chat.completions.parse(model=MODEL, messages=HELLO, max_tokens=300, seed=3,
                                          response_format=City)
    city = reply.choices[0].message.parsed
    assert isinstance(city, City) and 0 <= city.population <= 100000 and len(city.city) <= 12


@pytest.mark.parametrize("stream", [False, True])
def test_json_object_output_is_a_json_object(client, stream):
    def answer(content: str, max_tokens: int) -> tuple[str, str]:
        ask = dict(model=MODEL, messages=[{"role": "user", "content": content}],
                   max_tokens=max_tokens, seed=1, response_format={"type": "json_object"})
        if not stream:
            choice = client.chat.completions.create(**ask).choices[0]
            return choice.message.content, choice.finish_reason
        chunks = [c for c in client.chat.completions.create(**ask, stream=True) if c.choices]
        return "".join(c.choices[0].delta.content or "" for c in chunks), \
            chunks[-1].choices[0].finish_reason

    text, finish = answer("hi", 400)  # this model closes its object at once here
    assert finish == "stop" and isinstance(json.loads(text), dict)
    # Here it writes a string without end (random weights): cut, but an object all the same.
    text, finish = answer("Describe a city.", 30)
    assert finish == "length" and text.startswith("{")


@pytest.mark.parametrize(("schema", "said"), [
    ({"type": "wibble"}, "wibble"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),  # not enforced: refused, not ignored
])
def test_a_schema_the_engine_cannot_enforce_is_a_400_naming_response_format(api, schema, said):
    response = post(api, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "bad", "schema": schema}}})
    assert response.status_code == 400
    err = response.json()["error"]
    assert err["param"] == "response_format" and said in err["message"]
    assert err["message"].startswith("response_format: the schema")


def test_a_streamed_request_with_a_bad_schema_gets_the_400_before_any_event(api):
    response = post(api, {"stream": True, "response_format": {"type": "json_schema", "json_schema": {
        "name": "bad", "schema": {"type": "wibble"}}}})
    assert response.status_code == 400 and response.json()["error"]["param"] == "response_format"


def test_json_output_with_tools_the_model_may_call_is_a_400(api, client):
    for choice in ("auto", "required", {"type": "function", "function": {"name": "set_volume"}}):
        response = post(api, {"tools": TOOLS, "tool_choice": choice, "response_format": JSON_SCHEMA})
        assert response.status_code == 400, choice
        err = response.json()["error"]
        assert err["param"] == "response_format" and "tool_choice" in err["message"]
    # Tools the model may not call (tool_choice "none") constrain nothing: JSON it is.
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=300, seed=0,
                                           tools=TOOLS, tool_choice="none",
                                           response_format=JSON_SCHEMA)
    assert schema_errors(json.loads(reply.choices[0].message.content), SCHEMA) == []


def test_a_text_response_format_changes_nothing(client):
    ask = dict(model=MODEL, messages=HELLO, max_tokens=6, temperature=0)
    plain = client.chat.completions.create(**ask).choices[0].message.content
    text = client.chat.completions.create(**ask, response_format={"type": "text"})
    assert text.choices[0].message.content == plain
