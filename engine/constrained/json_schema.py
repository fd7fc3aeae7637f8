"""Structured outputs: token masks that keep a request's output to JSON matching a JSON Schema,
or to any JSON object, through llguidance (docs/engine.md says why that library).

llguidance is imported by the first request that asks, so the CLI and an engine that never
serves JSON do not load it; where it is not installed, such a request fails with a ValueError
that says so, and nothing else changes. Its matcher has the interface of ToolCallMatcher
(`mask_logits(row)`, `advance(token)`), which the model runner applies to each row.

End of turn: the request's own end ids (its eos and stop_token_ids) are allowed exactly where
the JSON may end, and nowhere else; llguidance's idea of the eos token is never used. A request
without end ids (ignore_eos) stops being constrained once its JSON is complete.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from engine.constrained.masks import mask_row
from engine.sampling_params import StructuredOutputs
from engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# Whitespace between JSON tokens: room for pretty-printing (a newline and 4-space indents four
# levels deep), bounded so that a model cannot loop on spaces until max_tokens.
JSON_MAX_WS = 20
_WHITESPACE = f"[ \\t\\n\\r]{{0,{JSON_MAX_WS}}}"
_MAX_GRAMMARS = 64


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as exc:
        raise ValueError("SamplingParams.structured_outputs needs the llguidance package, which "
                         f"is not installed here ({exc}): pip install llguidance") from exc
    return llguidance


def schema_of(spec: StructuredOutputs) -> dict[str, Any]:
    """The JSON Schema a StructuredOutputs asks for, as a dict (ValueError if it is not one)."""
    if spec.json_object:
        return {"type": "object"}
    schema = spec.json
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise ValueError(f"StructuredOutputs.json is not valid JSON: {exc}") from exc
    if not isinstance(schema, dict):
        raise ValueError(f"StructuredOutputs.json must be a JSON Schema object, not "
                         f"{type(schema).__name__}")
    return schema


class JsonConstraints:
    """Makes JSON matchers for requests: llguidance's view of the vocabulary, built on first use
    (a fraction of a second for 50k tokens), and compiled grammars cached per schema."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size  # the model's: the length of a logits row
        self._lltokenizer: Any = None
        self._grammars: OrderedDict[str, str] = OrderedDict()

    @property
    def lltokenizer(self) -> Any:
        if self._lltokenizer is None:
            llg = _llguidance()
            eos = list(self.tokenizer.eos_token_ids) or None
            self._lltokenizer = llg.LLTokenizer(self.tokenizer.backend.to_str(),
                                                n_vocab=max(self.vocab_size, self.tokenizer.vocab_size),
                                                eos_token=eos)
        return self._lltokenizer

    def matcher(self, spec: StructuredOutputs, end_ids: Iterable[int]) -> JsonMatcher:
        """A fresh matcher for one request. Raises ValueError naming what is wrong with the
        schema (or that llguidance is missing)."""
        llg = _llguidance()
        key = json.dumps(schema_of(spec))  # not sorted: properties come in the schema's order
        grammar = self._grammars.get(key)
        if grammar is None:
            try:
                grammar = llg.LLMatcher.grammar_from_json_schema(
                    key, overrides={"whitespace_pattern": _WHITESPACE})
            except ValueError as exc:
                raise ValueError(f"StructuredOutputs.json: {exc}") from exc
            error = llg.LLMatcher.validate_grammar(grammar, self.lltokenizer)
            if error:
                raise ValueError(f"StructuredOutputs.json is not a JSON Schema this engine can "
                                 f"enforce: {error.splitlines()[0]}")
            self._grammars[key] = grammar
            if len(self._grammars) > _MAX_GRAMMARS:
                self._grammars.popitem(last=False)
        self._grammars.move_to_end(key)
        matcher = llg.LLMatcher(self.lltokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"StructuredOutputs.json: {matcher.get_error().splitlines()[0]}")
        return JsonMatcher(matcher, end_ids, self.vocab_size, self.lltokenizer.eos_tokens)


class JsonMatcher:
    """One request's place in its JSON grammar, advanced token by token."""

    def __init__(self, matcher: Any, end_ids: Iterable[int], vocab_size: int,
                 library_eos: Iterable[int]) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.end_ids = np.array(sorted(i for i in set(end_ids) if i < vocab_size), dtype=np.int64)
        self._end_set = frozenset(self.end_ids.tolist())
        self._library_eos = np.array([i for i in library_eos if i < vocab_size], dtype=np.int64)
        self.done = False  # no longer constrained: the JSON is complete with no end id to come

    def disallowed(self) -> np.ndarray | None:
        """Bool [vocab], True where a token may not come next; None when all may."""
        if self.done:
            return None
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[: self.vocab_size].view(np.bool_)
        disallowed = ~allowed
        if len(disallowed) < self.vocab_size:  # ids past the tokenizer's: never allowed
            disallowed = np.concatenate([disallowed, np.ones(self.vocab_size - len(disallowed),
                                                             dtype=np.bool_)])
        disallowed[self._library_eos] = True
        if self.matcher.is_accepting():
            disallowed[self.end_ids] = False
        if disallowed.all():
            # Complete JSON and no end id (ignore_eos): what follows is free text.
            self.done = True
            return None
        return disallowed

    def mask_logits(self, row: torch.Tensor) -> None:
        """Set this request's disallowed tokens to -inf in its row of logits, in place."""
        mask_row(row, self.disallowed())

    def advance(self, token: int) -> None:
        if self.done:
            return
        if token in self._end_set:  # the request ends here
            self.done = True
            return
        if not self.matcher.consume_token(token):
            # Only a token the mask did not allow gets here (a caller that skipped the mask).
            log.warning("JSON grammar: token %d does not fit (%s); the rest is unconstrained",
                        token, self.matcher.get_error().splitlines()[0])
            self.done = True
