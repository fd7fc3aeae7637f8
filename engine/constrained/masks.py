"""Token masks for tool-call grammars: which token ids may come next in a state, cached per state.

A mask is found by walking the vocabulary's byte trie with the grammar automaton, pruning at the
first byte the grammar refuses, so a structural position visits a few hundred trie nodes, not the
whole vocabulary. Two states would visit nearly every token and get shortcuts instead:
- inside a JSON string: the precomputed class of tokens without quote, backslash or control bytes
  is allowed as a whole, and only the other tokens are walked, from their first such byte;
- free text ("auto"), and the start of an "auto" Llama output: every token is allowed except
  those the grammar refuses, found by walking the trie only until the state is free text again
  (a token that opens a Llama call at the start is walked through the call); from free text
  only tokens that complete `<tool_call>` can be refused, and those are few and known per tag
  prefix.
Special tokens (no bytes) are allowed where the turn may end, in free text, and, for
`<|python_tag|>`, where the grammar's `special` lets it open a Llama call.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from engine.constrained.choice import opener_ids, opening_probability
from engine.constrained.grammar import (
    HERMES,
    OPEN_TAG,
    STRING,
    CallGrammar,
    State,
    tool_dialect,
    tool_specs,
)
from engine.constrained.vocab import ByteTrie, TokenVocab
from engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)

_ALLOW, _ALLOW_WITH_STRING_PLAIN, _DENY = range(3)
_MAX_CACHED_STATES = 50_000  # id lists, mostly short: a few MB at most
_MAX_GRAMMARS = 16


class CallMasks:
    """The masks of one grammar over one vocabulary. `end_ids`: the request's end-of-turn ids."""

    def __init__(self, grammar: CallGrammar, vocab: TokenVocab, end_ids: Iterable[int]) -> None:
        self.grammar = grammar
        self.vocab = vocab
        self.end_ids = sorted(i for i in end_ids if i < vocab.size)
        self._cache: dict[State, tuple[int, np.ndarray]] = {}

    def disallowed(self, state: State) -> np.ndarray | None:
        """Bool [vocab] array, True where a token may not come next; None when all may.

        numpy, not torch: single-threaded, so the few array operations of a step never wait on
        torch's thread pool (which, on a busy CPU, costs milliseconds per operation)."""
        entry = self._cache.get(state)
        if entry is None:
            if len(self._cache) >= _MAX_CACHED_STATES:
                self._cache.clear()
            entry = self._cache[state] = self._build(state)
        kind, ids = entry
        if kind == _DENY:
            if not len(ids):
                return None
            mask = np.zeros(self.vocab.size, dtype=np.bool_)
            mask[ids] = True
            return mask
        if kind == _ALLOW_WITH_STRING_PLAIN:
            mask = ~self.vocab.string_plain
        else:
            mask = np.ones(self.vocab.size, dtype=np.bool_)
        mask[ids] = False
        return mask

    def _build(self, state: State) -> tuple[int, np.ndarray]:
        g = self.grammar
        tag = self.vocab.python_tag
        tag_fits = tag is not None and g.special(state, python_tag=True) is not None
        if g.in_free_text(state) or g.at_start(state):
            ids = set(self._denied(state)) | (set() if tag_fits or tag is None else {tag})
            return _DENY, np.array(sorted(ids), dtype=np.int64)
        ids: list[int] = []
        in_string = state[-1][0] == STRING
        self._walk(self.vocab.string_rest if in_string else self.vocab.trie, state, ids)
        if g.may_end(state):
            ids += self.end_ids
        if tag_fits:
            ids.append(tag)
        if not ids and not in_string:  # cannot happen with a byte-level vocabulary
            log.warning("tool-call grammar: no token fits state %r; leaving the row unmasked", state)
            return _DENY, np.array([], dtype=np.int64)
        kind = _ALLOW_WITH_STRING_PLAIN if in_string else _ALLOW
        return kind, np.array(ids, dtype=np.int64)

    def _walk(self, trie: ByteTrie, state: State, out: list[int]) -> None:
        """Append to `out` every token of `trie` whose bytes the grammar accepts from `state`."""
        step, children, ends = self.grammar.step, trie.children, trie.ends
        stack = [(0, state)]
        while stack:
            node, st = stack.pop()
            for b, child in children[node].items():
                nxt = step(st, b)
                if nxt is None:
                    continue
                if ends[child]:
                    out += ends[child]
                if children[child]:
                    stack.append((child, nxt))

    def _denied(self, state: State) -> list[int]:
        """The tokens the grammar refuses from a state where most are allowed (free text, the
        start of a Llama output). The trie is walked until the state is free text; below that,
        only tokens holding the whole `<tool_call>`, or going on with the rest of a tag begun,
        can be refused, and only those are walked."""
        g, trie = self.grammar, self.vocab.trie
        denied: list[int] = []
        candidates = set(self.vocab.holding_open_tag)
        stack = [(0, state)]
        while stack:
            node, st = stack.pop()
            if g.in_free_text(st):
                k = st[0][1]
                rest = trie.node_of(OPEN_TAG[k:], node) if k else None
                if rest is not None:
                    candidates.update(trie.tokens_under(rest))
                continue
            for b, child in trie.children[node].items():
                nxt = g.step(st, b)
                if nxt is None:
                    denied += trie.tokens_under(child)
                else:
                    stack.append((child, nxt))
        walk, data = g.walk, self.vocab.bytes
        return denied + [i for i in candidates if walk(state, data[i]) is None]


class ToolCallMatcher:
    """One request's place in its grammar, advanced token by token; a function of its output."""

    def __init__(self, masks: CallMasks) -> None:
        self.masks = masks
        self.state: State | None = masks.grammar.initial

    def disallowed(self) -> np.ndarray | None:
        return None if self.state is None else self.masks.disallowed(self.state)

    def mask_logits(self, row: torch.Tensor) -> None:
        """Set this request's disallowed tokens to -inf in its row of logits, in place."""
        mask_row(row, self.disallowed())

    @property
    def in_call(self) -> bool:
        """Inside a call the grammar constrains (SamplingParams.call_params apply there)."""
        g = self.masks.grammar
        return self.state is not None and not (g.in_free_text(self.state) or g.at_start(self.state))

    def advance(self, token: int) -> None:
        if self.state is None:
            return
        g = self.masks.grammar
        vocab = self.masks.vocab
        data = vocab.bytes[token] if token < vocab.size else None
        if data is None:  # a special token: an end of turn where the turn may end, else the
            # grammar says (free text takes any; <|python_tag|> may open a Llama call)
            if g.may_end(self.state) and token in self.masks.end_ids:
                nxt = self.state
            else:
                nxt = g.special(self.state, python_tag=token == vocab.python_tag)
        else:
            nxt = g.walk(self.state, data)
        if nxt is None:
            # Only a token the mask did not allow gets here (a caller that skipped the mask).
            log.warning("tool-call grammar: token %d does not fit; the rest is unconstrained", token)
        self.state = nxt


class ChoosingMatcher(ToolCallMatcher):
    """An "auto" matcher whose first masked step chooses between a forced call (`forced`, the
    same tools' "required" masks) and an answer in text."""

    def __init__(self, masks: CallMasks, forced: CallMasks, threshold: float,
                 openers: np.ndarray) -> None:
        super().__init__(masks)
        self.forced, self.threshold, self.openers = forced, threshold, openers
        self.choosing = True
        self.chose_call: bool | None = None  # None until the first token is chosen

    def mask_logits(self, row: torch.Tensor) -> None:
        if not self.choosing:
            super().mask_logits(row)
            return
        self.choosing = False
        self.chose_call = opening_probability(row, self.openers) >= self.threshold
        if self.chose_call:
            self.masks, self.state = self.forced, self.forced.grammar.initial
            super().mask_logits(row)
            return
        disallowed = self.disallowed()
        disallowed = (np.zeros(self.masks.vocab.size, dtype=np.bool_) if disallowed is None
                      else disallowed.copy())
        disallowed[self.openers] = True
        mask_row(row, disallowed)


def mask_row(row: torch.Tensor, disallowed: np.ndarray | None) -> None:
    """Set the tokens marked in `disallowed` (bool [vocab] or None: nothing) to -inf in one row
    of logits, in place, on whatever device the row lives."""
    if disallowed is None:
        return
    if row.device.type == "cpu" and row.dtype == torch.float32:
        row.numpy()[disallowed] = -np.inf
        return
    host = torch.from_numpy(disallowed)
    if row.is_cuda:  # up through pinned memory, without waiting for the GPU
        host = host.pin_memory().to(row.device, non_blocking=True)
    row.masked_fill_(host, float("-inf"))


def constrains(tools: Sequence[Any] | None, tool_choice: str | dict) -> bool:
    """Whether a request with these tools and this tool_choice has its calls constrained."""
    return tool_choice != "none" and (bool(tools) or tool_choice != "auto")


class ToolConstraints:
    """Makes matchers for requests: one vocabulary per engine, grammars cached per tool set.
    `dialect`: the calls' form, by default the one the tokenizer's chat template asks for (the
    template the engine's ChatFormatter renders, so prompt, grammar and parser agree)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, dialect: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.dialect = dialect or tool_dialect(tokenizer.chat_template)
        self._vocab: TokenVocab | None = None
        self._masks: OrderedDict[tuple, CallMasks] = OrderedDict()
        self._openers: np.ndarray | None = None

    @property
    def vocab(self) -> TokenVocab:
        if self._vocab is None:
            self._vocab = TokenVocab(self.tokenizer, self.vocab_size)
        return self._vocab

    def matcher(self, tools: Sequence[dict[str, Any]] | None, tool_choice: str | dict,
                end_ids: Iterable[int], call_threshold: float | None = None, *,
                single: bool = False) -> ToolCallMatcher | None:
        """The matcher for a request, or None when nothing is constrained ("none", no tools).
        Raises ValueError naming the field when tool_choice does not fit the tools.
        `call_threshold`: in an "auto" Hermes turn, its first token chooses between a call and
        an answer (ChoosingMatcher); elsewhere it changes nothing. `single`: at most one call
        (parallel_tool_calls false)."""
        if not constrains(tools, tool_choice):
            return None
        forced = tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None
        if not tools:
            raise ValueError(f"SamplingParams.tool_choice={tool_choice!r} needs tools: pass "
                             "tools=[...] with the request")
        specs = tool_specs(tools)
        if forced is not None:
            specs = [s for s in specs if s.name == forced][:1]
            if not specs:
                names = ", ".join(sorted({s.name for s in tool_specs(tools)}))
                raise ValueError(f"SamplingParams.tool_choice names {forced!r}, which is not one "
                                 f"of the tools offered ({names})")
        mode = "named" if forced is not None else tool_choice
        ends = tuple(sorted(end_ids))
        masks = self._masks_for(specs, mode, ends, single)
        if mode == "auto" and call_threshold is not None and self.dialect == HERMES:
            return ChoosingMatcher(masks, self._masks_for(specs, "required", ends, single),
                                   call_threshold, self.openers)
        return ToolCallMatcher(masks)

    @property
    def openers(self) -> np.ndarray:
        if self._openers is None:
            self._openers = opener_ids(self.vocab.bytes)
        return self._openers

    def _masks_for(self, specs: list, mode: str, ends: tuple[int, ...], single: bool) -> CallMasks:
        key = (tuple(specs), mode, ends, single)
        masks = self._masks.get(key)
        if masks is None:
            grammar = CallGrammar(specs, mode, can_end=bool(ends), dialect=self.dialect,
                                  single=single)
            masks = self._masks[key] = CallMasks(grammar, self.vocab, ends)
            if len(self._masks) > _MAX_GRAMMARS:
                self._masks.popitem(last=False)
        self._masks.move_to_end(key)
        return masks
