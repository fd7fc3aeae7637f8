"""A web page in the user's browser cannot use the model on loopback (cross-site request forgery):
a browser sends a cross-site POST without a preflight only with a form's or text's Content-Type,
and says where it comes from in Origin and Sec-Fetch-Site. Through the real aiohttp client."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

BODY = json.dumps({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 1})


def send(api, headers: dict[str, str], method: str = "POST", path: str = "/v1/chat/completions",
         data: str | None = BODY) -> tuple[int, dict]:
    async def main():
        async with aiohttp.ClientSession() as session, session.request(
                method, api.url + path, data=data, headers=headers) as response:
            return response.status, await response.json(content_type=None)
    return asyncio.run(main())


JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize("content_type", [
    "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x", None])
def test_a_post_that_is_not_declared_json_gets_415(api, content_type):
    headers = {} if content_type is None else {"Content-Type": content_type}
    status, body = send(api, headers)
    assert status == 415, body
    assert body["error"]["code"] == "unsupported_media_type"
    assert "application/json" in body["error"]["message"]


def test_json_with_parameters_is_answered(api):
    assert send(api, {"Content-Type": "application/json; charset=utf-8"})[0] == 200
    assert send(api, JSON)[0] == 200


@pytest.mark.parametrize("origin", ["http://evil.example", "https://127.0.0.1.evil.example",
                                    "null", "http://[::2]:8000"])
def test_a_request_from_a_page_of_another_origin_gets_403(api, origin):
    status, body = send(api, {**JSON, "Origin": origin})
    assert status == 403, body
    assert body["error"]["code"] == "cross_origin"
    status, _ = send(api, {"Origin": origin}, "GET", "/v1/models", None)
    assert status == 403


@pytest.mark.parametrize("origin", ["http://localhost:3000", "http://127.0.0.1:8000",
                                    "http://[::1]:5173"])
def test_a_page_served_from_loopback_may_ask(api, origin):
    assert send(api, {**JSON, "Origin": origin})[0] == 200


def test_a_browsers_cross_site_fetch_gets_403_and_a_same_origin_one_is_answered(api):
    status, body = send(api, {**JSON, "Sec-Fetch-Site": "cross-site"})
    assert status == 403 and body["error"]["code"] == "cross_origin"
    for site in ("same-origin", "same-site", "none"):
        assert send(api, {**JSON, "Sec-Fetch-Site": site})[0] == 200
