"""Constrained decoding of Hermes tool calls: a byte automaton, vocabulary bytes, token masks."""

from engine.constrained.grammar import CallGrammar, ToolSpec, tool_specs
from engine.constrained.masks import CallMasks, ToolCallMatcher, ToolConstraints, constrains
from engine.constrained.vocab import TokenVocab

__all__ = ["CallGrammar", "CallMasks", "TokenVocab", "ToolCallMatcher", "ToolConstraints",
           "ToolSpec", "constrains", "tool_specs"]
