"""`openclaw serve` honours the extra request field `tool_instructions` (the template of the tools'
section of the system prompt) on /v1/chat/completions and /tokenize alike, and refuses one
without its `{tools}` placeholder with a 400 naming the field."""

from __future__ import annotations

import httpx

from tests.helpers.tools import TOOLS

HELLO = [{"role": "user", "content": "Say hello."}]
MINE = "Functions:\n{tools}\nCall one only when the user asks for it."


def tokenized(api, **extra) -> dict:
    return httpx.post(api.url + "/tokenize", json={"messages": HELLO, "tools": TOOLS,
                                                   **extra}).json()


def test_the_template_shapes_the_prompt_and_its_count(api, client):
    built_in, mine = tokenized(api), tokenized(api, tool_instructions=MINE)
    assert mine["count"] != built_in["count"]
    text = httpx.post(api.url + "/detokenize", json={"tokens": mine["tokens"]}).json()["prompt"]
    assert "Functions:\n{" in text and "}\n\nCall one only when the user asks for it." in text
    reply = client.chat.completions.create(model="chat-model0", messages=HELLO, tools=TOOLS,
                                           max_tokens=2, extra_body={"tool_instructions": MINE})
    assert reply.usage.prompt_tokens == mine["count"]


def test_a_template_without_the_placeholder_is_a_400_naming_the_field(api):
    for path in ("/v1/chat/completions", "/tokenize"):
        answer = httpx.post(api.url + path, json={"messages": HELLO, "tools": TOOLS,
                                                  "tool_instructions": "Use the tools."})
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["param"] == "tool_instructions" and "{tools}" in error["message"]
