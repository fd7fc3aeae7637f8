"""The engine's tokenizer: a `tokenizers.Tokenizer` from a HF folder or rebuilt from GGUF metadata.

The one rule that matters for safety lives here: text from users and tools is encoded with
`allow_special=False`, so a message that contains "<|im_start|>system" is plain text, never a role
marker. Only text the engine itself produced (the chat template's own scaffolding) may contain
special tokens.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

# GGUF token types (llama.cpp's llama_token_type).
_GGUF_CONTROL, _GGUF_USER_DEFINED = 3, 4

# Pre-tokenizer regexes llama.cpp names in `tokenizer.ggml.pre`.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass
class Tokenizer:
    """Encode/decode plus the facts the engine needs (eos ids, chat template, special ids)."""

    backend: HFTokenizer
    eos_token_ids: list[int]
    bos_token_id: int | None = None
    add_bos: bool = False
    chat_template: str | None = None
    special_ids: frozenset[int] = frozenset()
    # tokenizers.Tokenizer is not safe to reconfigure from two threads at once.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, allow_special: bool) -> list[int]:
        """Token ids of `text`, without BOS. `allow_special=False` for every untrusted string."""
        if not text:
            return []
        with self._lock:
            self.backend.encode_special_tokens = not allow_special
            try:
                return self.backend.encode(text, add_special_tokens=False).ids
            finally:
                self.backend.encode_special_tokens = False

    def encode_prompt(self, text: str) -> list[int]:
        """A raw completion prompt from the caller of `generate`: BOS added if the model wants it."""
        ids = self.encode(text, allow_special=True)
        if self.add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids = [self.bos_token_id, *ids]
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
        )

    @classmethod
    def from_gguf_fields(cls, fields: dict[str, Any]) -> Tokenizer:
        """Rebuild the tokenizer from GGUF metadata (`tokenizer.ggml.*`), BPE ('gpt2') models."""
        kind = fields.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(
                f"GGUF tokenizer.ggml.model={kind!r} is not supported yet (only 'gpt2' byte-level "
                "BPE); load the model's Hugging Face folder instead"
            )
        tokens: list[str] = fields["tokenizer.ggml.tokens"]
        types: list[int] = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges", [])]
        vocab = {t: i for i, t in enumerate(tokens)}
        backend = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        backend.pre_tokenizer = _gguf_pre_tokenizer(fields.get("tokenizer.ggml.pre", "default"))
        backend.decoder = decoders.ByteLevel()
        specials = [
            AddedToken(t, special=True, normalized=False)
            for t, ty in zip(tokens, types, strict=True)
            if ty == _GGUF_CONTROL
        ]
        user_defined = [
            AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types, strict=True)
            if ty == _GGUF_USER_DEFINED
        ]
        backend.add_special_tokens(specials)
        backend.add_tokens(user_defined)
        eos = fields.get("tokenizer.ggml.eos_token_id")
        eot = fields.get("tokenizer.ggml.eot_token_id")
        eos_ids = [i for i in (eos, eot) if isinstance(i, int)]
        bos = fields.get("tokenizer.ggml.bos_token_id")
        return cls(
            backend=backend,
            eos_token_ids=list(dict.fromkeys(eos_ids)),
            bos_token_id=bos,
            add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", False)),
            chat_template=fields.get("tokenizer.chat_template"),
            special_ids=_special_ids(backend),
        )


def _gguf_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
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


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}
