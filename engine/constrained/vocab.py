"""A vocabulary as bytes, for constrained decoding: each token's bytes, a byte trie of all tokens,
and precomputed token classes. Built once per tokenizer, on first use (about 1 s for 150k tokens).
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from engine.constrained.grammar import OPEN_TAG, PYTHON_TAG
from engine.tokenizer import Tokenizer, byte_token_value


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the printable character that stands for each byte."""
    direct = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in direct}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shifted)
            shifted += 1
    return {c: b for b, c in chars.items()}


def token_bytes(tokenizer: Tokenizer, vocab_size: int) -> list[bytes | None]:
    """The bytes of every token id below `vocab_size`; None for special tokens and unused ids.

    Byte-level BPE vocabularies (GPT-2, Llama 3, Qwen, SmolLM) spell bytes with GPT-2's alphabet.
    Others are read SentencePiece-style: `<0xNN>` is a byte and `▁` a space.
    """
    backend = tokenizer.backend
    byte_level = type(backend.decoder).__name__ == "ByteLevel"
    alphabet = _byte_level_alphabet()
    out: list[bytes | None] = [None] * vocab_size
    for text, i in backend.get_vocab(with_added_tokens=False).items():
        if i >= vocab_size:
            continue
        byte = byte_token_value(text)
        if byte_level and all(c in alphabet for c in text):
            out[i] = bytes(alphabet[c] for c in text)
        elif byte is not None:
            out[i] = bytes([byte])
        else:
            out[i] = text.replace("\u2581", " ").encode()
    for i, added in backend.get_added_tokens_decoder().items():
        if i < vocab_size:
            out[i] = None if added.special else added.content.encode()
    return [b if b else None for b in out]


class ByteTrie:
    """Tokens by their bytes: node 0 is the root; `ends[node]` lists the tokens spelled up to it."""

    def __init__(self, entries: list[tuple[bytes, int]]) -> None:
        self.children: list[dict[int, int]] = [{}]
        self.ends: list[list[int]] = [[]]
        for data, token in entries:
            node = 0
            for b in data:
                nxt = self.children[node].get(b)
                if nxt is None:
                    nxt = len(self.children)
                    self.children.append({})
                    self.ends.append([])
                    self.children[node][b] = nxt
                node = nxt
            self.ends[node].append(token)

    def node_of(self, prefix: bytes, start: int = 0) -> int | None:
        """The node `prefix` leads to from `start`, or None if no token goes on that way."""
        node = start
        for b in prefix:
            node = self.children[node].get(b)
            if node is None:
                return None
        return node

    def tokens_under(self, node: int) -> list[int]:
        """Every token whose bytes start with the prefix that leads to `node`."""
        out, stack = [], [node]
        while stack:
            n = stack.pop()
            out += self.ends[n]
            stack += self.children[n].values()
        return out


def _is_string_byte(b: int) -> bool:
    """A byte that stays inside a JSON string as it is: not a quote, backslash or control byte."""
    return b >= 0x20 and b != 0x22 and b != 0x5C


class TokenVocab:
    """What masks are built from. `string_plain`: tokens made only of bytes that leave a JSON
    string as it is; `string_rest`: the other tokens, keyed by their bytes from the first byte
    that matters (a quote, a backslash, a control byte), so inside a string only those few are
    walked through the grammar."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.size = vocab_size
        self.bytes = token_bytes(tokenizer, vocab_size)
        spelled = [(b, i) for i, b in enumerate(self.bytes) if b is not None]
        self.trie = ByteTrie(spelled)
        plain = np.zeros(vocab_size, dtype=np.bool_)
        rest = []
        for data, i in spelled:
            cut = next((k for k, b in enumerate(data) if not _is_string_byte(b)), None)
            if cut is None:
                plain[i] = True
            else:
                rest.append((data[cut:], i))
        self.string_plain = plain
        self.string_rest = ByteTrie(rest)
        # Llama 3's <|python_tag|> when it is a special token (a plain one is read as its bytes).
        tag = tokenizer.backend.token_to_id(PYTHON_TAG.decode())
        self.python_tag = tag if tag is not None and tag < vocab_size and self.bytes[tag] is None \
            else None

    @cached_property
    def holding_open_tag(self) -> list[int]:
        """Tokens whose bytes hold a whole `<tool_call>` (Qwen's added token, for one)."""
        return [i for i, b in enumerate(self.bytes) if b and OPEN_TAG in b]
