"""Every tool message the agent sends a server answers a call by its id, malformed and refused
calls included: a strict server (OpenAI's API; vLLM with some chat templates) refuses a request
holding a tool message that answers no call, which would break the conversation for good."""

from __future__ import annotations

from tests.fakes.openai_api import Reply, replies
from tests.helpers.daemon import say, started
from tests.helpers.replies import answer

from .test_daemon_on_a_server import on


def tool_exchange(body: dict) -> tuple[dict, list[dict]]:
    """The latest assistant message with calls, and the tool messages after it."""
    messages = body["messages"]
    at = max(i for i, m in enumerate(messages) if m["role"] == "assistant" and m.get("tool_calls"))
    return messages[at], [m for m in messages[at + 1:] if m["role"] == "tool"]


async def test_a_malformed_call_is_answered_by_id_and_the_talk_goes_on(tmp_path, fake):
    fake.strict_tool_ids = True
    fake.reply = replies(Reply("Checking.", tool_calls=[("clock", '{"timezone": UTC}')]),
                         "Sorry, it is noon.", "Still noon.")
    daemon, conn = await started(tmp_path, None, on(fake))
    assert await say(daemon, conn, "what time is it?") == "Sorry, it is noon."
    assert await say(daemon, conn, "and now?") == "Still noon."  # the history stays acceptable
    assert fake.refused == []
    call, [result] = tool_exchange(fake.chats[1])
    assert call["content"] == "Checking."
    assert [c["id"] for c in call["tool_calls"]] == [result["tool_call_id"]]
    assert result["content"].startswith("error: ")  # what was wrong goes back to the model
    await daemon.stop()


async def test_a_malformed_call_in_content_is_answered_by_id(tmp_path, fake):
    fake.strict_tool_ids = True
    fake.reply = replies("<tool_call>{'name': 'clock'}</tool_call>", "Noon.")
    daemon, conn = await started(tmp_path, None, on(fake))
    assert await say(daemon, conn, "time?") == "Noon."
    assert fake.refused == []
    call, [result] = tool_exchange(fake.chats[1])
    assert [c["id"] for c in call["tool_calls"]] == [result["tool_call_id"]]
    await daemon.stop()


async def test_refused_and_malformed_calls_beside_a_good_one_each_get_their_answer(tmp_path, fake):
    fake.strict_tool_ids = True
    fake.reply = replies(Reply(tool_calls=[("clock", {"timezone": "UTC"}), ("format_disk", {}),
                                           ("clock", "not an object")]), "Done.")
    daemon, conn = await started(tmp_path, None, on(fake))
    assert answer(await say(daemon, conn, "do it all")) == "Done."
    assert fake.refused == []
    call, results = tool_exchange(fake.chats[1])
    assert sorted(c["id"] for c in call["tool_calls"]) == sorted(r["tool_call_id"] for r in results)
    by_id = {r["tool_call_id"]: r["content"] for r in results}
    names = {c["id"]: c["function"]["name"] for c in call["tool_calls"]}
    ran = [by_id[i] for i, name in names.items() if name == "clock"]
    refused = [by_id[i] for i, name in names.items() if name == "format_disk"]
    assert len(results) == 3 and refused and all(r.startswith("error") for r in refused)
    assert any("UTC" in r and not r.startswith("error") for r in ran)
    await daemon.stop()


async def test_the_strict_fake_refuses_a_tool_message_that_answers_no_call(fake):
    import aiohttp

    fake.strict_tool_ids = True
    body = {"model": fake.model, "stream": True, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": ""},
        {"role": "tool", "content": "error: malformed"}]}
    async with aiohttp.ClientSession() as session, \
            session.post(f"{fake.url}/chat/completions", json=body) as answer:
        assert answer.status == 400 and "tool_call_id" in (await answer.json())["error"]["message"]
