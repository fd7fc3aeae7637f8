"""The agent: builds the prompt within the context budget, runs the model, executes tool calls."""

from openclaw.agent.loop import Agent, Caller, ReplySink, TurnResult
from openclaw.agent.model import ChatModel

__all__ = ["Agent", "Caller", "ChatModel", "ReplySink", "TurnResult"]
