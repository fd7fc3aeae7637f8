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
import yarl

from openclaw.agent.model import ModelUnavailable

log = logging.getLogger(__name__)

BACKOFF_S = 0.5  # the first retry's wait; each next one doubles it
BACKOFF_MAX_S = 8.0
RETRY_AFTER_MAX_S = 30.0  # a 429's Retry-After is honoured up to this
ERROR_READ_BYTES = 64 * 1024  # of an error answer's body: more is never shown
ERROR_CHARS = 200  # of a server's error, in a message
# Keys under which an error echoes the request (pydantic's `input`, FastAPI's `body`): the
# user's messages, which must not reach the log or another user's chat.
ECHOED = frozenset({"input", "body", "messages", "prompt"})


class ServerRefused(RuntimeError):
    """The server answered the request with an error of the request's own (a 4xx other than 429):
    a wrong model name, a refused key, a prompt over the context. `param`: the request's field at
    fault, where the server names it so (OpenAI's error.param)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message, self.param = status, message, param


def shown_url(url: str) -> str:
    """The URL as messages and /status show it: a password or token in it (user:secret@, ?key=)
    is a credential, and messages reach logs and chats."""
    parsed = yarl.URL(url)
    userinfo = parsed.raw_user is not None or parsed.raw_password is not None
    if not userinfo and not parsed.raw_query_string:
        return url
    bare = str(parsed.with_user(None).with_query(None))
    return (bare.replace("://", "://***@", 1) if userinfo else bare) + (
        "?***" if parsed.raw_query_string else "")


class Client:
    """One aiohttp session to the server, with the API key on every request. Its messages never
    hold the key or a credential in the URL, even where the server echoes one."""

    def __init__(self, url: str, api_key: str | None, *, connect_timeout: float, retries: int,
                 stopping: asyncio.Event | None = None) -> None:
        self.url = url  # the API's base, ".../v1"
        self.root = url[:-3] if url.endswith("/v1") else url  # vLLM's /tokenize lives here
        self.shown, self.shown_root = shown_url(url), shown_url(self.root)
        self.retries = retries
        # Set when the daemon stops: no more waits between tries (the turn keeps the message).
        self.stopping = stopping
        parsed = yarl.URL(url)
        if api_key and (parsed.raw_user is not None or parsed.raw_password is not None):
            raise ValueError("url holds a user and password, and api_key is set: each would be "
                             "the Authorization header; keep one")
        self.secrets = sorted({s for s in (api_key, parsed.raw_password, parsed.password,
                                           parsed.raw_query_string) if s}, key=len, reverse=True)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # No total timeout: a long answer is fine; the stream's own deadlines bound the waits.
        timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout,
                                        sock_connect=connect_timeout)
        self.session = aiohttp.ClientSession(headers=headers, timeout=timeout)

    async def close(self) -> None:
        await self.session.close()

    def scrub(self, text: str) -> str:
        """`text` with the key and the URL's credentials masked."""
        text = text.replace(self.url, self.shown).replace(self.root, self.shown_root)
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    async def request(self, method: str, url: str, body: dict[str, Any] | None = None, *,
                      wait: float, headers: dict[str, str] | None = None,
                      retries: int | None = None) -> aiohttp.ClientResponse:
        """The server's answer (a 2xx, its body unread: the caller closes it), after retrying
        connection errors, 5xx and 429 with backoff. `wait`: seconds for its status line.
        ModelUnavailable when the retries run out, the wait does, or the daemon stops between
        tries; ServerRefused for any other error status."""
        retries = self.retries if retries is None else retries
        for attempt in range(retries + 1):
            retry_after = None
            try:
                async with asyncio.timeout(wait):
                    answer = await self.session.request(method, url, json=body, headers=headers)
            except aiohttp.ClientError as exc:  # refused, reset, DNS, TLS, connect timeout
                why = self.scrub(describe(exc))
            except TimeoutError:  # connected, but silent: asking again would queue it twice
                raise ModelUnavailable(f"{self.shown}: no answer in {wait:g} s") from None
            else:
                if answer.status < 400:
                    return answer
                message, param = await error_message(answer)
                message = one_line(self.scrub(message))  # masked whole, then cut
                if answer.status != 429 and answer.status < 500:
                    raise ServerRefused(answer.status, message, param)
                why = f"HTTP {answer.status}: {message}"
                retry_after = _seconds(answer.headers.get("Retry-After"))
            if attempt == retries:
                raise ModelUnavailable(f"{self.shown}: {why}")
            delay = min(BACKOFF_S * 2 ** attempt, BACKOFF_MAX_S)
            if retry_after is not None:
                delay = max(delay, min(retry_after, RETRY_AFTER_MAX_S))
            log.debug("%s %s: %s; trying again in %.1f s", method, self.scrub(url), why, delay)
            if await self.stopped_within(delay):
                raise ModelUnavailable(f"{self.shown}: {why} (not tried again: stopping)")
        raise AssertionError("unreachable")

    async def stopped_within(self, delay: float) -> bool:
        """Wait `delay` seconds, less if the daemon starts stopping meanwhile; whether it did."""
        if self.stopping is None:
            await asyncio.sleep(delay)
            return False
        try:
            await asyncio.wait_for(self.stopping.wait(), delay)
        except TimeoutError:
            return False
        return True

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
        raise ModelUnavailable(f"{shown_url(str(answer.url))}: the answer stalled for {wait:g} s"
                               ) from None
    except aiohttp.ClientError as exc:
        raise ModelUnavailable(f"{shown_url(str(answer.url))}: {describe(exc)}") from None
    except ValueError as exc:
        raise ServerRefused(answer.status, f"not JSON ({exc})") from None
    finally:
        answer.release()


async def error_message(answer: aiohttp.ClientResponse) -> tuple[str, str | None]:
    """The server's word on an error status, on one line but not yet cut (see one_line), and the
    request's field it names as at fault: OpenAI's {"error": {"message", "param"}}, vLLM's older
    {"message"}, FastAPI's 422 {"detail": [{"loc", "msg"}]}, or the body's text. Whatever it
    echoes of the request is left out."""
    try:
        async with asyncio.timeout(5):
            data = b""  # the body's start: an error page may be large, and only it is shown
            while len(data) < ERROR_READ_BYTES and (
                    more := await answer.content.read(ERROR_READ_BYTES - len(data))):
                data += more
            text = data.decode("utf-8", "replace")
    except (TimeoutError, aiohttp.ClientError):
        text = ""
    finally:
        answer.release()
    try:
        body = without_echo(json.loads(text))
    except ValueError:
        return " ".join(text.split()) or (answer.reason or "no message"), None
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else (
        error if isinstance(error, str) else body.get("message") if isinstance(body, dict) else None)
    if message is None and isinstance(body, dict) and body.get("detail"):
        message = validation_errors(body["detail"])
    param = error.get("param") if isinstance(error, dict) else None
    if not isinstance(message, str):
        message = json.dumps(message if message else body, ensure_ascii=False)
    return " ".join(message.split()), param if isinstance(param, str) else None


def without_echo(value: Any) -> Any:
    """A JSON value without the keys under which servers echo the request (ECHOED)."""
    if isinstance(value, dict):
        return {k: without_echo(v) for k, v in value.items() if k not in ECHOED}
    if isinstance(value, list):
        return [without_echo(v) for v in value]
    return value


def validation_errors(detail: Any) -> Any:
    """FastAPI's 422 `detail` in words: "'field': what is wrong" for each (the field quoted, as
    optional_fields reads it); anything else as it is."""
    if not isinstance(detail, list):
        return detail
    said = []
    for item in detail:
        if not (isinstance(item, dict) and isinstance(item.get("msg"), str)):
            return detail
        loc = [str(part) for part in item.get("loc") or []]
        field = ".".join(loc[1:] if loc[:1] == ["body"] else loc)
        said.append(f"'{field}': {item['msg']}" if field else item["msg"])
    return "; ".join(said)


def one_line(text: str, limit: int = ERROR_CHARS) -> str:
    """A server's words as a message holds them: one line, at most `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def describe(exc: BaseException) -> str:
    """A connection error in a few words ("cannot connect to 127.0.0.1:8000: refused")."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error.strerror or str(exc.os_error) if exc.os_error else str(exc)
        return f"cannot connect to {exc.host}:{exc.port}: {reason}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    if isinstance(exc, aiohttp.ClientPayloadError):  # aiohttp's words name the HTTP framing
        return "the server closed the connection before the answer's end"
    return str(exc) or type(exc).__name__


def _seconds(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date: the backoff alone
        return None
