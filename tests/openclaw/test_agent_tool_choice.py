"""The agent asks the engine for constrained tool calls ("auto") whenever it offers tools."""

from __future__ import annotations

from tests.helpers.daemon import say, started
from tests.helpers.scripted_model import ScriptedModel


class RecordingModel(ScriptedModel):
    """A scripted model that also records the sampling params and tools of every request."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[tuple] = []

    def generate(self, prompt, params=None, request_id=None, *, tools=None, priority=0,
                 cache_salt=None):
        self.requests.append((params, tools))
        return super().generate(prompt, params, request_id, tools=tools, priority=priority,
                                cache_salt=cache_salt)


async def test_agent_offers_tools_with_tool_choice_auto(tmp_path):
    model = RecordingModel(lambda m: "It is late.")
    daemon, conn = await started(tmp_path, model)
    assert await say(daemon, conn, "what time is it?") == "It is late."
    params, tools = model.requests[-1]
    assert tools and params.tool_choice == "auto"
    await daemon.stop()
