"""The engine's tokenizer: a `tokenizers.Tokenizer` from a HF folder or rebuilt from GGUF metadata
(byte-level BPE, 'gpt2', or SentencePiece BPE with byte fallback, 'llama').

The one rule that matters for safety lives here: text from users and tools is encoded with
`allow_special=False`, so a message that contains "<|im_start|>system" is plain text, never a role
marker. Only text the engine itself produced (the chat template's own scaffolding) may contain
special tokens.
"""

from __future__ import annotations

import heapq
import json
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

# GGUF token types (llama.cpp's llama_token_type).
_GGUF_NORMAL, _GGUF_UNKNOWN, _GGUF_CONTROL, _GGUF_USER_DEFINED = 1, 2, 3, 4
_GGUF_KINDS = ("gpt2", "llama")

# Encoded texts kept (Tokenizer.encode): about this many bytes of memory in all (kept_cost), a
# text at most ENCODED_TEXT_CHARS long.
ENCODED_BYTES = 32 << 20
ENCODED_TEXT_CHARS = 1 << 16

# SentencePiece writes a space as this character, in its pieces and in the text it tokenizes.
_SPM_SPACE = "\u2581"

# Pre-tokenizer regexes llama.cpp names in `tokenizer.ggml.pre`.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def kept_cost(text: str, ids: tuple[int, ...]) -> int:
    """About the memory a kept text and its ids take: the text (up to 4 bytes a character), a
    tuple slot and an int each id, and the entry itself."""
    return 2 * len(text) + 36 * len(ids) + 200


@dataclass
class Tokenizer:
    """Encode/decode plus the facts the engine needs (eos ids, chat template, special ids)."""

    backend: HFTokenizer
    eos_token_ids: list[int]
    bos_token_id: int | None = None
    add_bos: bool = False
    # encode_prompt appends EOS (`tokenizer.ggml.add_eos_token`, for llama.cpp's add_special).
    add_eos: bool = False
    chat_template: str | None = None
    special_ids: frozenset[int] = frozenset()
    # `<0xNN>` tokens the decoder joins into characters run by run (SentencePiece byte fallback):
    # the incremental detokenizer holds a run back until it ends, see engine/detokenizer.py.
    byte_fallback_ids: frozenset[int] = frozenset()
    # tokenizers.Tokenizer is not safe to reconfigure from two threads at once.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # See _plain_backend; init=False, so dataclasses.replace(tok, backend=...) builds its own.
    _plain: HFTokenizer | None = field(default=None, init=False, repr=False, compare=False)
    # Texts encoded before, by (text, allow_special): their ids (see `encode`). Likewise its own.
    _encoded: dict[tuple[str, bool], tuple[int, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False)
    _encoded_bytes: int = field(default=0, init=False, repr=False, compare=False)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, allow_special: bool) -> list[int]:
        """Token ids of `text`, without BOS. `allow_special=False` for every untrusted string:
        then no added token comes out, special or not (Qwen's `<tool_call>`, `</tool_response>`
        and `<think>` are added tokens not marked special, which `tokenizers` matches even with
        special tokens off: a tool result could close its own response block)."""
        if not text:
            return []
        key = (text, allow_special)
        with self._lock:
            # The same texts come again and again: a conversation's earlier messages in each of
            # its prompts, the scaffolding around every tool call, a message counted then sent.
            # Kept, each costs a look-up, not a tokenizer call (tens of microseconds in a turn).
            found = self._encoded.get(key)
            if found is not None:
                return list(found)
            backend = self.backend if allow_special else self._plain_backend()
            backend.encode_special_tokens = not allow_special
            try:
                ids = backend.encode(text, add_special_tokens=False).ids
            finally:
                backend.encode_special_tokens = False
            self._keep(key, ids)
            return ids

    def _keep(self, key: tuple[str, bool], ids: list[int]) -> None:
        """Keep `ids` of a text up to ENCODED_TEXT_CHARS long, the oldest kept going first past
        ENCODED_BYTES in all."""
        if len(key[0]) > ENCODED_TEXT_CHARS:
            return
        kept = tuple(ids)
        cost = kept_cost(key[0], kept)
        while self._encoded and self._encoded_bytes + cost > ENCODED_BYTES:
            oldest = next(iter(self._encoded))
            self._encoded_bytes -= kept_cost(oldest[0], self._encoded.pop(oldest))
        self._encoded[key] = kept
        self._encoded_bytes += cost

    @property
    def added_ids(self) -> frozenset[int]:
        """Every added token, special or not: what only trusted text may produce."""
        return frozenset(self.backend.get_added_tokens_decoder())

    def _plain_backend(self) -> HFTokenizer:
        """The backend for untrusted text: a copy in which every added token is special, so that
        `encode_special_tokens` spells each out (the backend itself when all already are)."""
        if self._plain is None:
            plain = [t for t in self.backend.get_added_tokens_decoder().values() if not t.special]
            if not plain:
                self._plain = self.backend
            else:
                copy = HFTokenizer.from_str(self.backend.to_str())
                copy.add_special_tokens([
                    AddedToken(t.content, special=True, single_word=t.single_word, lstrip=t.lstrip,
                               rstrip=t.rstrip, normalized=t.normalized) for t in plain])
                self._plain = copy
        return self._plain

    def encode_prompt(self, text: str) -> list[int]:
        """A raw completion prompt from the caller of `generate`: BOS (and EOS) added if the model
        wants them."""
        ids = self.encode(text, allow_special=True)
        if self.add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids = [self.bos_token_id, *ids]
        if self.add_eos and self.eos_token_ids and ids[-1:] != self.eos_token_ids[:1]:
            ids.append(self.eos_token_ids[0])
        return ids

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.backend.id_to_token(i) or "" for i in ids]

    # ---- loading -------------------------------------------------------------------------

    @classmethod
    def from_hf_folder(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        tok_file = path / "tokenizer.json"
        if not tok_file.exists():
            raise FileNotFoundError(
                f"{path}: no tokenizer.json; the engine needs the fast-tokenizer file "
                "(pass token-id prompts, or add tokenizer.json to the folder)"
            )
        backend = HFTokenizer.from_file(str(tok_file))
        cfg = _read_json(path / "tokenizer_config.json")
        gen = _read_json(path / "generation_config.json")
        model_cfg = _read_json(path / "config.json")

        def tok_id(name: str) -> int | None:
            value = cfg.get(name)
            if isinstance(value, dict):
                value = value.get("content")
            return backend.token_to_id(value) if isinstance(value, str) else None

        eos: list[int] = []
        for source in (gen.get("eos_token_id"), model_cfg.get("eos_token_id"), tok_id("eos_token")):
            for i in source if isinstance(source, list) else [source]:
                if isinstance(i, int) and i not in eos:
                    eos.append(i)
        template = cfg.get("chat_template")
        jinja = path / "chat_template.jinja"
        if jinja.exists():
            template = jinja.read_text()
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        bos = tok_id("bos_token")
        # A post-processor that inserts BOS already does so in encode(add_special_tokens=True);
        # we encode without it and add BOS ourselves, so read the intent from the config.
        add_bos = bool(cfg.get("add_bos_token", False)) and bos is not None
        if not add_bos and bos is not None:
            probe = backend.encode("a", add_special_tokens=True).ids
            add_bos = probe[:1] == [bos]
        return cls(
            backend=backend,
            eos_token_ids=eos,
            bos_token_id=bos,
            add_bos=add_bos,
            chat_template=template,
            special_ids=_special_ids(backend),
            byte_fallback_ids=_byte_fallback_ids(backend),
        )

    @classmethod
    def from_gguf_fields(cls, fields: dict[str, Any]) -> Tokenizer:
        """Rebuild the tokenizer from GGUF metadata (`tokenizer.ggml.*`) as llama.cpp reads it."""
        kind = fields.get("tokenizer.ggml.model")
        if kind not in _GGUF_KINDS:
            raise ValueError(
                f"GGUF tokenizer.ggml.model={kind!r} is not supported (only 'gpt2' byte-level BPE "
                "and 'llama' SentencePiece BPE); load the model's Hugging Face folder instead"
            )
        spm = kind == "llama"
        tokens: list[str] = fields["tokenizer.ggml.tokens"]
        types: list[int] = fields.get("tokenizer.ggml.token_type") or [_GGUF_NORMAL] * len(tokens)

        def token_id(key: str, spm_default: int | None) -> int | None:
            # llama.cpp's defaults for a SentencePiece vocabulary that does not name its tokens.
            value = fields.get(f"tokenizer.ggml.{key}")
            return value if isinstance(value, int) else spm_default if spm else None

        unk = token_id("unknown_token_id", 0)
        backend = _spm_backend(fields, tokens, types, unk) if spm else _byte_level_backend(fields, tokens)
        # SentencePiece's <unk> is special like a control token: llama.cpp parses both only when
        # special tokens are allowed.
        special_types = (_GGUF_CONTROL, _GGUF_UNKNOWN) if spm else (_GGUF_CONTROL,)
        backend.add_special_tokens([
            AddedToken(t, special=True, normalized=False)
            for t, ty in zip(tokens, types, strict=True)
            if ty in special_types
        ])
        backend.add_tokens([
            AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types, strict=True)
            if ty == _GGUF_USER_DEFINED
        ])
        bos, eos = token_id("bos_token_id", 1), token_id("eos_token_id", 2)
        eot = token_id("eot_token_id", None)
        eos_ids = [i for i in (eos, eot) if i is not None]
        return cls(
            backend=backend,
            eos_token_ids=list(dict.fromkeys(eos_ids)),
            bos_token_id=bos,
            # llama.cpp adds BOS to a SentencePiece vocabulary whose file does not say otherwise.
            add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", spm)),
            add_eos=bool(fields.get("tokenizer.ggml.add_eos_token", False)) and eos is not None,
            chat_template=fields.get("tokenizer.chat_template"),
            special_ids=_special_ids(backend),
            byte_fallback_ids=_byte_fallback_ids(backend),
        )


def _byte_level_backend(fields: dict[str, Any], tokens: list[str]) -> HFTokenizer:
    """'gpt2': byte-level BPE with the merges the file lists and the pre-tokenizer it names."""
    merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges", [])]
    vocab = {t: i for i, t in enumerate(tokens)}
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    backend.pre_tokenizer = gguf_pre_tokenizer(fields.get("tokenizer.ggml.pre", "default"))
    backend.decoder = decoders.ByteLevel()
    return backend


def _spm_backend(
    fields: dict[str, Any], tokens: list[str], types: list[int], unk: int | None
) -> HFTokenizer:
    """'llama': SentencePiece BPE with byte fallback, as llama.cpp's llm_tokenizer_spm runs it.

    The whole text is one word: spaces become "▁" and, with `add_space_prefix` (the default), one
    "▁" goes in front. As a normalizer that prefix also lands after every special token, which is
    what llama.cpp does (a space after a special) and what models like Llama 2 were trained on
    ("<s>[INST]" is "<s>", "▁[", ...). Characters outside the vocabulary become `<0xNN>` tokens.
    """
    vocab = {t: i for i, t in enumerate(tokens)}
    scores = fields.get("tokenizer.ggml.scores")
    unk_token = tokens[unk] if unk is not None and 0 <= unk < len(tokens) else None
    backend = HFTokenizer(models.BPE(
        vocab=vocab, merges=_spm_merges(tokens, types, scores), unk_token=unk_token,
        fuse_unk=True, byte_fallback=True,
    ))
    prefix = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
    replace = normalizers.Replace(" ", _SPM_SPACE)
    backend.normalizer = (
        normalizers.Sequence([normalizers.Prepend(_SPM_SPACE), replace]) if prefix else replace
    )
    steps = [decoders.Replace(_SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:  # the prefix space is the tokenizer's, not the text's: decode drops it again
        steps.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(steps)
    return backend


def _spm_merges(
    tokens: list[str], types: list[int], scores: list[float] | None
) -> list[tuple[str, str]]:
    """BPE merges, best first, for a SentencePiece vocabulary that stores scores, not merges.

    SentencePiece BPE repeatedly merges the adjacent pair whose merged piece scores highest, so
    every way to split a piece into two pieces is a merge ranked by the piece's score. Only normal
    pieces take part: a control token such as "</s>", a byte token or an unused one must never come
    out of plain text, whatever pieces spell it.

    Equal scores: llama.cpp merges the leftmost of the best pairs; HF's BPE takes the lowest rank
    and looks at position only between two places of one merge. No rank list does what llama.cpp
    does in general: with ("a", "b") and ("b", "a") tied, llama.cpp gives "ab a" for "aba" and
    "ba b" for "bab", and whichever ranks first is wrong for one of them. What a rank list can do is
    settle every two tied merges that compete for one piece as llama.cpp does ("abc" with ("a", "b")
    and ("b", "c"): the left one), see `_leftmost_first`.

    Scores that are absent or all equal carry no order (converters write -1000 for every token of
    a model that has only a tokenizer.json): llama.cpp then merges from the left wherever it can,
    which no rank list comes near (with a 32k vocabulary: under half of text lines alike, whatever
    the order), so vocabulary order is used, SentencePiece's own training order: the BPE the
    model was trained with.
    """
    normal = {t: i for i, (t, ty) in enumerate(zip(tokens, types, strict=True)) if ty == _GGUF_NORMAL}
    if scores is None or len({scores[i] for i in normal.values()}) <= 1:
        scores = [-float(i) for i in range(len(tokens))]
    by_score: dict[float, list[tuple[int, int, str, str]]] = defaultdict(list)
    for piece, i in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                by_score[scores[i]].append((i, cut, left, right))
    return [merge for score in sorted(by_score, reverse=True)
            for merge in _leftmost_first(sorted(by_score[score]))]


def _leftmost_first(tied: list[tuple[int, int, str, str]]) -> list[tuple[str, str]]:
    """Merges of one score, (id, cut, left, right) in vocabulary order, ranked so that each comes
    before every one whose left part is its own right part: where two of them overlap in a text
    ("a"+"b" and "b"+"c" over "abc") the left one then wins, as in llama.cpp. Otherwise vocabulary
    order holds; in a cycle of such merges the earliest one still waiting goes first."""
    if len(tied) == 1:
        return [tied[0][2:]]
    starting: dict[str, list[int]] = defaultdict(list)  # left part -> the merges it starts
    for k, (_, _, left, _) in enumerate(tied):
        starting[left].append(k)
    ending = Counter(right for *_, right in tied)
    # How many other merges must come first: those ending in this one's left part.
    waiting = [ending[left] - (left == right) for _, _, left, right in tied]
    ready = [k for k, count in enumerate(waiting) if count == 0]
    placed = [False] * len(tied)
    order: list[tuple[str, str]] = []
    earliest = 0
    while len(order) < len(tied):
        if not ready:  # only cycles are left
            while placed[earliest]:
                earliest += 1
            ready = [earliest]
        k = heapq.heappop(ready)
        if placed[k]:
            continue  # taken out of a cycle before its count reached zero
        placed[k] = True
        order.append(tied[k][2:])
        for after in starting[tied[k][3]]:
            if not placed[after]:
                waiting[after] -= 1
                if waiting[after] == 0:
                    heapq.heappush(ready, after)
    return order


def gguf_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """The byte-level pre-tokenizer llama.cpp names `pre` (a GGUF's `tokenizer.ggml.pre`:
    "llama3", "qwen2", "smollm", ...); GPT-2's for a name it does not know."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in ("llama-bpe", "llama3", "smaug-bpe"):
        split = pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated", invert=False)
        return pre_tokenizers.Sequence([split, byte_level])
    if pre in ("qwen2", "deepseek-r1-qwen"):
        split = pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False)
        return pre_tokenizers.Sequence([split, byte_level])
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact"):
        # These vocabularies were trained with every digit its own token.
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2])
    return gpt2


def _special_ids(backend: HFTokenizer) -> frozenset[int]:
    return frozenset(i for i, t in backend.get_added_tokens_decoder().items() if t.special)


def byte_token_value(token: str) -> int | None:
    """The byte a SentencePiece byte-fallback token such as `<0xE2>` stands for, else None."""
    digits = token[3:5]
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">") and _is_hex(digits):
        return int(digits, 16)
    return None


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in text)


def _byte_fallback_ids(backend: HFTokenizer) -> frozenset[int]:
    # Only a ByteFallback decoder joins `<0xNN>` runs; elsewhere such a token is plain text.
    decoder = backend.decoder
    if decoder is None or b'"ByteFallback"' not in decoder.__getstate__():
        return frozenset()
    vocab = backend.get_vocab(with_added_tokens=False)
    return frozenset(i for t, i in vocab.items() if byte_token_value(t) is not None)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}
