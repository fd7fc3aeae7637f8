"""The engine's TokenLogprob in OpenAI's two shapes: chat's `logprobs.content` (token, logprob,
bytes, top_logprobs per token) and the legacy completions' `logprobs` (tokens, token_logprobs,
top_logprobs, text_offset). The values are the engine's, from the model's raw distribution
(docs/engine.md, "Logprobs")."""

from __future__ import annotations

import asyncio
import codecs
from typing import TYPE_CHECKING, Any

from engine.constrained.vocab import token_bytes

if TYPE_CHECKING:
    from engine import TokenLogprob
    from engine.engine_core import LLMEngine

# What a logprob of -inf is sent as, as vLLM does: JSON has no infinity, and the official clients'
# parsers refuse the "-Infinity" Python would write.
FLOOR = -9999.0


def clamp(logprob: float) -> float:
    return logprob if logprob > FLOOR else FLOOR


class TokenTexts:
    """Each token's bytes and text, as the logprobs show them. The bytes of the whole vocabulary
    are read once, for the first request that asks (0.1 s for 49k tokens; `load`); a special token is its
    written form ("<|im_end|>"); a token that is part of a character is U+FFFD in `text`, its
    bytes exact. A model without a tokenizer names tokens by id, "token_id:N", as vLLM does."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._bytes: list[bytes | None] | None = None

    async def load(self) -> None:
        """Read the vocabulary's bytes, in a thread: the event loop serves the other clients
        meanwhile (a large vocabulary takes a second)."""
        if self._bytes is None and self.engine.tokenizer is not None:
            self._bytes = await asyncio.to_thread(token_bytes, self.engine.tokenizer,
                                                  self.engine.model_config.vocab_size)

    def bytes_of(self, token: int) -> bytes | None:
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            return None
        if self._bytes is None:  # load() was not awaited: read them here
            self._bytes = token_bytes(tokenizer, self.engine.model_config.vocab_size)
        data = self._bytes[token] if token < len(self._bytes) else None
        if data is None:  # a special token
            data = tokenizer.decode([token], skip_special_tokens=False).encode()
        return data

    def text_of(self, token: int) -> str:
        data = self.bytes_of(token)
        return f"token_id:{token}" if data is None else data.decode("utf-8", "replace")

    def is_special(self, token: int) -> bool:
        tokenizer = self.engine.tokenizer
        return tokenizer is not None and token in tokenizer.special_ids


def chat_content(texts: TokenTexts, entries: list[TokenLogprob]) -> list[dict[str, Any]]:
    """Chat's `logprobs.content`: per token its text, logprob, bytes, and the top ones (most
    likely first, as many as top_logprobs asked)."""
    return [{**token_entry(texts, e.token_id, e.logprob),
             "top_logprobs": [token_entry(texts, t, lp) for t, lp in e.top]} for e in entries]


def token_entry(texts: TokenTexts, token: int, logprob: float) -> dict[str, Any]:
    data = texts.bytes_of(token)
    return {"token": texts.text_of(token), "logprob": clamp(logprob),
            "bytes": None if data is None else list(data)}


class CompletionLogprobs:
    """The legacy shape for one choice, built as its tokens come so that a stream's chunks carry
    offsets into the whole text: `text_offset` is where each token's text begins in the choice's
    text (a token inside a character begins where the character does; a special token the text
    skips adds nothing to it)."""

    def __init__(self, texts: TokenTexts, skip_special_tokens: bool) -> None:
        self.texts = texts
        self.skip_special = skip_special_tokens
        self.offset = 0  # characters of the text so far
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def add(self, entries: list[TokenLogprob]) -> dict[str, list]:
        """The legacy logprobs of these next tokens. Each position's top_logprobs maps the k most
        likely tokens' text to their logprob, and the sampled token's too (so k + 1 entries when it
        is not among them, as OpenAI says)."""
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                "text_offset": []}
        texts = self.texts
        for e in entries:
            text = texts.text_of(e.token_id)
            out["tokens"].append(text)
            out["token_logprobs"].append(clamp(e.logprob))
            top: dict[str, float] = {}
            for token, logprob in [*e.top, (e.token_id, e.logprob)]:
                top.setdefault(texts.text_of(token), clamp(logprob))  # two tokens may read alike
            out["top_logprobs"].append(top)
            out["text_offset"].append(self.offset)
            if not (self.skip_special and texts.is_special(e.token_id)):
                data = texts.bytes_of(e.token_id)
                self.offset += len(self._decoder.decode(data) if data is not None else text)
        return out
