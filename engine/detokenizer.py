"""Incremental detokenization of one request's output: safe-to-show text deltas and stop strings.

The window scheme is vLLM's: each step decodes only `tokens[prefix_offset:]` and subtracts the
decode of `tokens[prefix_offset:read_offset]`, so the work per step is the size of the newest
tokens, and a decoder that treats a window's first token specially (SentencePiece's leading-space
strip) does so identically in both decodes and cancels out.

SentencePiece byte fallback adds one wrinkle: its decoder turns a whole run of `<0xNN>` tokens into
text at once, and a run that is not valid UTF-8 becomes one U+FFFD per byte, including the bytes of
characters that were complete (a "€" followed by a stray byte turns into four U+FFFD). Text from a
run can change until the run ends, so a run is held back until a token that is not a byte follows
it (or flush()); cutting windows only after such a token keeps every decode's runs whole.
"""

from __future__ import annotations

from engine.sampling_params import SamplingParams
from engine.tokenizer import Tokenizer

# What a lossy UTF-8 decode leaves for a multi-byte character whose later bytes are still to come.
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """One request's output text, grown token by token, cut at the first stop string."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int], params: SamplingParams):
        # The output text is defined as decode(output ids) alone, the same string a
        # non-streaming caller gets, so `prompt_ids` plays no part (it stays for vLLM's shape).
        del prompt_ids
        self._tok = tokenizer
        # Duck-typed tokenizers (test doubles) may lack the attribute: no byte-fallback runs then.
        self._byte_ids = getattr(tokenizer, "byte_fallback_ids", frozenset())
        self._skip_special = params.skip_special_tokens
        self._stops = list(params.stop)
        self._include_stop = params.include_stop_str_in_output
        self._max_stop_len = max((len(s) for s in self._stops), default=0)
        self._tokens: list[int] = []
        self._prefix_offset = 0  # window start: decoded only as context for the next delta
        self._read_offset = 0  # tokens before this are already in self._text
        # Characters of the window past read_offset already in self._text: the complete ones in
        # front of a character whose last bytes have not arrived yet.
        self._partial = 0
        self._text = ""
        self._taken = 0  # len of the text already handed out by take_delta
        self._stopped: str | None = None
        self._flushed = False

    @property
    def text(self) -> str:
        """Output text so far; a trailing character whose bytes are incomplete, or a run of
        byte-fallback tokens that may still grow, joins later (at flush() at the latest)."""
        return self._text

    @property
    def stop_reason(self) -> str | None:
        """The stop string that ended the output, or None."""
        return self._stopped

    def add(self, token_ids: list[int]) -> str | None:
        """Append generated tokens; return the stop string if one just matched, else None."""
        if self._stopped is not None or self._flushed:
            return None
        if self._skip_special:
            # decode(ids, skip_special_tokens=True) equals decode of the ids without the
            # specials; dropping them here also keeps a special out of a window's first slot.
            token_ids = [i for i in token_ids if i not in self._tok.special_ids]
        if not token_ids:
            return None
        self._tokens.extend(token_ids)
        old_len = len(self._text)
        self._text += self._decode_new()
        return self._check_stop(old_len)

    def take_delta(self) -> str:
        """New text since the last call that can no longer change or be cut by a stop string."""
        end = len(self._text)
        if self._stopped is None and not self._flushed:
            end -= self._stop_prefix_len()
        if end <= self._taken:
            return ""
        delta = self._text[self._taken : end]
        self._taken = end
        return delta

    def flush(self) -> str:
        """At finish: everything not yet taken, including held-back text; the text is then final."""
        if not self._flushed and self._stopped is None and self._read_offset < len(self._tokens):
            # A character still unfinished at the very end shows as decode() shows it: U+FFFD.
            self._text += self._window_text(len(self._tokens))
            self._read_offset = len(self._tokens)
        self._flushed = True
        delta = self._text[self._taken :]
        self._taken = len(self._text)
        return delta

    # ---- internals -----------------------------------------------------------------------

    def _window_text(self, end: int) -> str:
        """Text tokens[read_offset:end] add, less what earlier steps already took of it."""
        # skip_special_tokens=False is exact here: with skipping on, specials were never kept.
        window = self._tokens[self._prefix_offset : end]
        prefix_len = self._read_offset - self._prefix_offset
        prefix_text = self._tok.decode(window[:prefix_len], skip_special_tokens=False)
        new_text = self._tok.decode(window, skip_special_tokens=False)
        return new_text[len(prefix_text) + self._partial :]

    def _decode_new(self) -> str:
        """New complete characters; a trailing unfinished one waits for its remaining bytes."""
        end = self._settled_end()
        if end <= self._read_offset:
            return ""
        fresh = self._window_text(end)
        if fresh.endswith(_REPLACEMENT):
            # Byte-level tokens split characters (🦀 is three tokens). UTF-8 resynchronises, so
            # only the last U+FFFD can still change; what precedes it is final and goes out now,
            # and the window keeps growing by these tokens until the character completes.
            self._partial += len(fresh) - 1
            return fresh[:-1]
        self._prefix_offset = self._read_offset
        self._read_offset = end
        self._partial = 0
        return fresh

    def _settled_end(self) -> int:
        """Tokens before this index decode to text that later tokens cannot change: all of them,
        less a trailing run of byte-fallback tokens (see the module docstring)."""
        end = len(self._tokens)
        while end > self._read_offset and self._tokens[end - 1] in self._byte_ids:
            end -= 1
        return end

    def _check_stop(self, old_len: int) -> str | None:
        """Find the earliest stop string that the text after `old_len` completes; cut there."""
        best: tuple[int, int, str] | None = None  # (start, -length, stop): earliest, then longest
        for stop in self._stops:
            # A match that new text completes ends past old_len, so it starts at most
            # len(stop) - 1 characters before it; anything earlier was searched last time.
            at = self._text.find(stop, max(0, old_len - len(stop) + 1))
            if at >= 0 and (best is None or (at, -len(stop)) < best[:2]):
                best = (at, -len(stop), stop)
        if best is None:
            return None
        at, _, stop = best
        self._text = self._text[: at + len(stop) if self._include_stop else at]
        self._stopped = stop
        return stop

    def _stop_prefix_len(self) -> int:
        """Length of the longest text suffix that is a proper prefix of some stop string."""
        longest = 0
        tail = self._text[-(self._max_stop_len - 1) :] if self._max_stop_len > 1 else ""
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(tail)), longest, -1):
                if tail.endswith(stop[:k]):
                    longest = k
                    break
        return longest
