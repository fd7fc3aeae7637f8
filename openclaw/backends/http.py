"""Requests to an OpenAI-compatible server: what to retry, and how its failures reach the agent.

A refused connection, a 5xx or a 429 is the server's state, not the request's: tried again with
backoff, then ModelUnavailable (the turn waits for the server). Any other 4xx is the request's
(ServerRefused): trying it again would only fail again."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp

from openclaw.agent.model import ModelUnavailable

log = logging.getLogger(__name__)

BACKOFF_S = 0.5  # the first retry's wait; each next one doubles it
BACKOFF_MAX_S = 8.0
RETRY_AFTER_MAX_S = 30.0  # a 429's Retry-After is honoured up to this
ERROR_BODY_CHARS = 500  # of an error answer, in a message


class ServerRefused(RuntimeError):
    """The server answered the request with an error of the request's own (a 4xx other than 429):
    a wrong model name, a refused key, a prompt over the context."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Client:
    """One aiohttp session to the server, with the API key on every request."""

    def __init__(self, url: str, api_key: str | None, *, connect_timeout: float, retries: int) -> None:
        self.url = url  # the API's base, ".../v1"
        self.root = url[:-3] if url.endswith("/v1") else url  # vLLM's /tokenize lives here
        self.retries = retries
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # No total timeout: a long answer is fine; the stream's own deadlines bound the waits.
        timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout,
                                        sock_connect=connect_timeout)
        self.session = aiohttp.ClientSession(headers=headers, timeout=timeout)

    async def close(self) -> None:
        await self.session.close()

    async def request(self, method: str, url: str, body: dict[str, Any] | None = None, *,
                      wait: float, headers: dict[str, str] | None = None,
                      retries: int | None = None) -> aiohttp.ClientResponse:
        """The server's answer (a 2xx, its body unread: the caller closes it), after retrying
        connection errors, 5xx and 429 with backoff. `wait`: seconds for its status line.
        ModelUnavailable when the retries run out or the wait does; ServerRefused for any other
        error status."""
        retries = self.retries if retries is None else retries
        for attempt in range(retries + 1):
            retry_after = None
            try:
                async with asyncio.timeout(wait):
                    answer = await self.session.request(method, url, json=body, headers=headers)
            except aiohttp.ClientError as exc:  # refused, reset, DNS, TLS, connect timeout
                why = describe(exc)
            except TimeoutError:  # connected, but silent: asking again would queue it twice
                raise ModelUnavailable(f"{self.url}: no answer in {wait:g} s") from None
            else:
                if answer.status < 400:
                    return answer
                message = await error_message(answer)
                if answer.status != 429 and answer.status < 500:
                    raise ServerRefused(answer.status, message)
                why = f"HTTP {answer.status}: {message}"
                retry_after = _seconds(answer.headers.get("Retry-After"))
            if attempt == retries:
                raise ModelUnavailable(f"{self.url}: {why}")
            delay = min(BACKOFF_S * 2 ** attempt, BACKOFF_MAX_S)
            if retry_after is not None:
                delay = max(delay, min(retry_after, RETRY_AFTER_MAX_S))
            log.debug("%s %s: %s; trying again in %.1f s", method, url, why, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def get_json(self, path: str, *, wait: float, retries: int | None = None) -> Any:
        answer = await self.request("GET", f"{self.url}{path}", wait=wait, retries=retries)
        return await read_json(answer, wait)

    async def post_json(self, url: str, body: dict[str, Any], *, wait: float) -> Any:
        answer = await self.request("POST", url, body, wait=wait)
        return await read_json(answer, wait)


async def read_json(answer: aiohttp.ClientResponse, wait: float) -> Any:
    """A whole JSON answer; ModelUnavailable when it breaks off or stalls."""
    try:
        async with asyncio.timeout(wait):
            return await answer.json(content_type=None)
    except TimeoutError:
        raise ModelUnavailable(f"{answer.url}: the answer stalled for {wait:g} s") from None
    except aiohttp.ClientError as exc:
        raise ModelUnavailable(f"{answer.url}: {describe(exc)}") from None
    except ValueError as exc:
        raise ServerRefused(answer.status, f"not JSON ({exc})") from None
    finally:
        answer.release()


async def error_message(answer: aiohttp.ClientResponse) -> str:
    """The server's word on an error status: OpenAI's {"error": {"message"}}, vLLM's older
    {"message"}, or the start of the body."""
    try:
        async with asyncio.timeout(5):
            text = (await answer.read()).decode("utf-8", "replace")
    except (TimeoutError, aiohttp.ClientError):
        text = ""
    finally:
        answer.release()
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:ERROR_BODY_CHARS] or (answer.reason or "no message")
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else (
        error if isinstance(error, str) else body.get("message") if isinstance(body, dict) else None)
    return str(message or text)[:ERROR_BODY_CHARS]


def describe(exc: BaseException) -> str:
    """A connection error in a few words ("cannot connect to 127.0.0.1:8000: refused")."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error.strerror or str(exc.os_error) if exc.os_error else str(exc)
        return f"cannot connect to {exc.host}:{exc.port}: {reason}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    return str(exc) or type(exc).__name__


def _seconds(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date: the backoff alone
        return None
