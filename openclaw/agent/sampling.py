"""The sampling of each kind of model call the agent makes, from `[agent.sampling]`'s presets."""

from __future__ import annotations

from engine import SamplingParams
from openclaw.config import AgentConfig
from openclaw.config.sections import SamplingPreset


def preset_params(preset: SamplingPreset, **fields) -> SamplingParams:
    return SamplingParams(temperature=preset.temperature, top_p=preset.top_p,
                          repetition_penalty=preset.repetition_penalty,
                          frequency_penalty=preset.frequency_penalty, **fields)


def reply_params(settings: AgentConfig, tools: list[dict] | None) -> SamplingParams:
    """A step of a turn: the chat preset, the tool_arguments preset inside the calls the engine
    constrains, and the first token's choice between a call and an answer."""
    presets = settings.sampling
    if not tools:
        return preset_params(presets.chat, max_tokens=settings.reply_max_tokens, tool_choice="none")
    return preset_params(presets.chat, max_tokens=settings.reply_max_tokens, tool_choice="auto",
                         tool_call_threshold=settings.tool_call_threshold or None,
                         call_params=preset_params(presets.tool_arguments))


def summary_params(settings: AgentConfig, max_tokens: int) -> SamplingParams:
    return preset_params(settings.sampling.summary, max_tokens=max_tokens)
