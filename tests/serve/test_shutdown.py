"""Stopping the server ends the answers in flight at once: their engine requests are aborted and
their streams end with an error event, rather than the stop waiting for them to finish."""

from __future__ import annotations

import concurrent.futures
import threading

import openai
import pytest

from tests.helpers.serve_thread import ServerThread

HELLO = [{"role": "user", "content": "Say hello."}]
LONG = 900  # tokens: far more than the test waits for


def test_stop_ends_a_stream_mid_answer_and_aborts_its_engine_request(llm):
    server = ServerThread(llm)
    client = server.client()
    generated = llm.stats()["generated_tokens"]
    started = threading.Event()

    def read() -> tuple[int, str | None, Exception | None]:
        stream = client.chat.completions.create(model="chat-model0", messages=HELLO, stream=True,
                                                max_tokens=LONG, extra_body={"ignore_eos": True})
        chunks, finish = 0, None
        try:
            for chunk in stream:
                chunks += 1
                if chunks == 4:  # the role chunk, then content: mid-answer
                    started.set()
                finish = chunk.choices[0].finish_reason if chunk.choices else finish
        except openai.APIError as exc:
            return chunks, finish, exc
        return chunks, finish, None

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reading = pool.submit(read)
        assert started.wait(60)
        try:
            server.call(server.server.stop(), timeout=120)
            chunks, finish, error = reading.result(timeout=120)
            server.wait_idle(timeout=10)  # the engine request was aborted, its blocks freed
        finally:
            server.close()
    # The stream ended with the server's word, not the answer's natural end (length).
    assert finish is None and chunks < LONG
    assert error is not None and "shutting down" in str(error)
    assert llm.stats()["generated_tokens"] - generated < LONG


def test_a_request_after_stop_began_is_refused_with_503(llm):
    server = ServerThread(llm)
    try:
        server.server.state.stopping = True
        with pytest.raises(openai.InternalServerError) as refused:
            server.client().chat.completions.create(model="chat-model0", messages=HELLO,
                                                    max_tokens=2)
        assert refused.value.status_code == 503
        assert refused.value.body["code"] == "server_shutting_down"
    finally:
        server.close()
