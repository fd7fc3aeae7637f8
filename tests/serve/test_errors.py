"""Every error in OpenAI's shape, {"error": {"message", "type", "param", "code"}}: a bad field named,
an unknown model, a prompt that does not fit, the API key, and what the server refuses to do."""

from __future__ import annotations

import httpx
import openai
import pytest

from engine import AsyncLLM
from openclaw.config import ConfigError, load_config
from openclaw.config.sections import ServeConfig
from tests.helpers.serve_thread import ServerThread
from tests.serve.conftest import ENGINE_ARGS

HELLO = [{"role": "user", "content": "Say hello."}]


def post(api, body, path="/v1/chat/completions", **kw) -> httpx.Response:
    return httpx.post(api.url + path, json=body, **kw)


def error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": HELLO, "temperature": "hot"}, "temperature"),
    ({"messages": HELLO, "top_p": 1.5}, "top_p"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ({"messages": []}, "messages"),
    ({}, "messages"),
    ({"messages": HELLO, "n": 0}, "n"),
    ({"messages": HELLO, "stop": 3}, "stop"),
    ({"messages": HELLO, "tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": HELLO, "tool_choice": "required"}, "tool_choice"),  # and no tools
    ({"messages": HELLO, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": HELLO, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": HELLO, "top_logprobs": 3}, "top_logprobs"),  # and no logprobs: true
    ({"prompt": "Hi", "logprobs": 21}, "logprobs"),
    ({"messages": HELLO, "response_format": {"type": "xml"}}, "response_format.type"),
    ({"messages": HELLO, "response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {
        "schema": {"type": "object"}}}}, "response_format.json_schema.name"),
    ({"messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": "an object"}}}, "response_format.json_schema.schema"),
])
def test_a_bad_field_is_a_400_naming_it(api, body, param):
    err = error(post(api, body, "/v1/completions" if "prompt" in body else "/v1/chat/completions"),
                400)
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert err["message"].startswith(param)


def test_what_this_server_does_not_do_yet_is_a_400_saying_so(api):
    err = error(post(api, {"messages": HELLO, "logit_bias": {"42": 5}}), 400)
    assert err["param"] == "logit_bias" and "not supported yet" in err["message"]


def test_a_body_that_is_not_json_is_a_400(api):
    err = error(httpx.post(api.url + "/v1/chat/completions", content=b"{nope",
                           headers={"Content-Type": "application/json"}), 400)
    assert "JSON" in err["message"]


def test_an_unknown_model_is_a_404_naming_the_served_one(api):
    with pytest.raises(openai.NotFoundError) as found:
        api.client().chat.completions.create(model="gpt-9", messages=HELLO)
    assert found.value.body["code"] == "model_not_found" and "chat-model0" in found.value.message
    err = error(httpx.get(api.url + "/v1/nothing-here"), 404)  # no such path: the same shape
    assert err["type"] == "not_found_error"


def test_a_prompt_and_max_tokens_beyond_the_context_is_a_400_with_both_numbers(api):
    prompt_tokens = post(api, {"messages": HELLO}, "/tokenize").json()["count"]
    with pytest.raises(openai.BadRequestError) as refused:
        api.client().chat.completions.create(model="chat-model0", messages=HELLO, max_tokens=1020)
    err = refused.value.body
    assert err["code"] == "context_length_exceeded"
    assert f"{prompt_tokens} tokens" in err["message"] and "1020" in err["message"]
    assert "1024" in err["message"]
    long_prompt = {"prompt": "word " * 2000, "max_tokens": 1}
    assert "1024" in error(post(api, long_prompt, "/v1/completions"), 400)["message"]


def test_without_a_key_only_requests_addressed_to_loopback_are_answered(api):
    assert post(api, {"messages": HELLO, "max_tokens": 1}).status_code == 200
    # A page whose name was rebound to 127.0.0.1 sends its own name as the Host.
    err = error(post(api, {"messages": HELLO}, headers={"Host": "evil.example:8000"}), 421)
    assert "localhost" in err["message"]


def test_with_a_key_a_request_without_it_gets_401_and_with_it_200(llm):
    server = ServerThread(llm, api_key="sesame-0123456789")
    try:
        with pytest.raises(openai.AuthenticationError) as refused:
            server.client(api_key="wrong").chat.completions.create(model="chat-model0",
                                                                   messages=HELLO)
        assert refused.value.body["code"] == "invalid_api_key"
        assert error(httpx.get(server.url + "/v1/models"), 401)
        assert httpx.get(server.url + "/health").status_code == 200  # a probe needs no key
        reply = server.client().chat.completions.create(model="chat-model0", messages=HELLO,
                                                        max_tokens=2)
        assert reply.choices[0].message.content is not None
        # With a key, other names may reach it (a reverse proxy's, the machine's own).
        headers = {"Host": "models.example", "Authorization": "Bearer sesame-0123456789"}
        assert httpx.get(server.url + "/v1/models", headers=headers).status_code == 200
    finally:
        server.close()


def test_a_host_beyond_loopback_is_refused_without_a_key(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="api_key"):
        ServeConfig.model_validate({"host": "0.0.0.0"})
    path = tmp_path / "openclaw.toml"
    path.write_text('[serve]\nenabled = true\nhost = "0.0.0.0"\n')
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert refused.value.problems[0].startswith("serve.api_key")
    monkeypatch.setenv("OPENCLAW_API_KEY", "k")
    path.write_text('[serve]\nhost = "0.0.0.0"\napi_key = "env:OPENCLAW_API_KEY"\n')
    assert load_config(path).serve.api_key.get() == "k"


def test_the_context_400_names_max_completion_tokens_when_the_request_used_it(api):
    with pytest.raises(openai.BadRequestError) as refused:
        api.client().chat.completions.create(model="chat-model0", messages=HELLO,
                                             max_completion_tokens=1020)
    err = refused.value.body
    assert err["code"] == "context_length_exceeded"
    assert "max_completion_tokens asks for 1020" in err["message"]
    assert "max_tokens" not in err["message"].replace("max_completion_tokens", "")


def test_the_bearer_scheme_is_read_whatever_its_case(llm):
    server = ServerThread(llm, api_key="sesame-0123456789")
    try:
        for scheme in ("bearer", "BEARER", "Bearer"):
            headers = {"Authorization": f"{scheme} sesame-0123456789"}
            assert httpx.get(server.url + "/v1/models", headers=headers).status_code == 200
        for wrong in ("Basic sesame-0123456789", "bearer sesame", "sesame-0123456789",
                      "bearer  sesame-0123456789x"):
            assert error(httpx.get(server.url + "/v1/models",
                                   headers={"Authorization": wrong}), 401)
    finally:
        server.close()


@pytest.fixture
def own_engine(chat_model):
    """An engine of the test's own, for a test that stops or breaks it, with a server over it."""
    llm = AsyncLLM(chat_model, **ENGINE_ARGS)
    server = ServerThread(llm)
    yield llm, server
    server.close()
    llm.shutdown()


def test_health_is_503_once_the_engine_is_stopped(own_engine):
    llm, server = own_engine
    assert httpx.get(server.url + "/health").status_code == 200
    llm.shutdown()
    dead = httpx.get(server.url + "/health")
    assert dead.status_code == 503
    assert dead.json()["error"]["code"] == "engine_dead"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_health_is_503_when_the_engines_loop_has_died(own_engine):
    llm, server = own_engine
    assert httpx.get(server.url + "/health").status_code == 200

    def broken() -> bool:  # the step loop's own check fails: its thread ends
        raise RuntimeError("the engine broke")
    llm.engine.has_unfinished_requests = broken
    server.call(llm.abort("nothing"))  # a command wakes the loop, which then dies
    llm._thread.join(timeout=30)
    assert httpx.get(server.url + "/health").status_code == 503
