"""`[engine]`: the model the daemon talks to, chosen by its `backend` key. "local" (the default) is
the engine in this process, and the table is then the engine's own EngineConfig
(fields.EngineTable); "openai" is any OpenAI-compatible server (vLLM, SGLang, Ollama,
llama-server, `openclaw serve`), and the table is OpenAIEngineConfig.

One table whose `backend` picks its keys: a key of the other backend (a `url` left behind when
going back to the local engine) is an error that says whose key it is, not just "unknown key"."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PlainSerializer,
    PlainValidator,
    SerializationInfo,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from engine.config import EngineConfig
from engine.loader import model_problem
from openclaw.config.fields import ConfigPath, EngineTable, Section, check_url
from openclaw.config.problems import table_keys, unknown_key_hint
from openclaw.config.secrets import REDACTED, SECRET_KEY, Secret, is_reference

BACKENDS = {"local": "the engine in this process",
            "openai": "an OpenAI-compatible server: vLLM, SGLang, Ollama, llama-server, "
                      "`openclaw serve`"}


class OpenAIEngineConfig(Section):
    """`[engine]` with backend = "openai": the model runs on an OpenAI-compatible server."""

    backend: Literal["openai"] = "openai"
    url: str
    """The API's base URL as OpenAI clients take it, e.g. "http://127.0.0.1:8000/v1". Token
    counts are asked of /tokenize at the server's root (the URL without its /v1)."""
    api_key: Secret | None = None
    """Sent as a Bearer token; "env:NAME" or "file:PATH" keep it out of the file."""
    model: str | None = None
    """The model's name on the server; unset: the one model it serves."""
    tokenizer: ConfigPath | None = None
    """A local Hugging Face folder (tokenizer.json, chat template) to count tokens with, for a
    server without /tokenize; unset there: estimated from the server's reported usage."""
    context_length: int | None = Field(None, ge=1)
    """The model's context in tokens; unset: the `max_model_len` the server's /v1/models says."""
    first_token_timeout: float = Field(120.0, gt=0)
    """Seconds a request may wait for its first token (queued, then the prompt read)."""
    idle_timeout: float = Field(60.0, gt=0)
    """Seconds an answer may go without a new token; a long answer is fine."""
    connect_timeout: float = Field(10.0, gt=0)
    """Seconds to open a connection to the server."""
    retries: int = Field(3, ge=0)
    """Tries again, with backoff, a request that failed before its first token (no connection,
    5xx, 429)."""

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        check_url(url, ("http", "https"))
        return url.rstrip("/")


EngineSection = EngineConfig | OpenAIEngineConfig
"""What `[engine]` holds: the local engine's config or a server's."""

LOCAL_KEYS = frozenset(table_keys(EngineConfig) or ())
OPENAI_KEYS = frozenset(table_keys(OpenAIEngineConfig) or ()) - {"backend"}
# A key of the other backend that means the same thing here under another name.
_SAME_HERE = {("openai", "max_model_len"): "context_length",
              ("local", "context_length"): "max_model_len"}
_EXAMPLES = {"url": ', e.g. url = "http://127.0.0.1:8000/v1"'}
_LOCAL_DUMP = TypeAdapter(EngineConfig)


class _Local(Section):
    engine: EngineTable


class _OpenAI(Section):
    engine: OpenAIEngineConfig


def model_file_problems(engine: EngineSection) -> list[str]:
    """Why the local engine's `model` is no model it could load, seen without reading it; [] for
    one that may be, and for a server's (asked only when the daemon starts)."""
    if not isinstance(engine, EngineConfig):
        return []
    problem = model_problem(engine.model)
    return [f"[engine]: {problem}"] if problem else []


def validate_engine(value: Any, info: ValidationInfo) -> EngineSection:
    """The `[engine]` table, validated by its backend's model. Every problem is reported at once,
    each at its key (engine.KEY), in the file's order."""
    if isinstance(value, (EngineConfig, OpenAIEngineConfig)):
        return value
    if not isinstance(value, dict):
        raise PydanticCustomError("dict_type", "expected a table")
    backend = value.get("backend", "local")
    if not isinstance(backend, str) or backend not in BACKENDS:
        choices = " or ".join(f'"{name}" ({what})' for name, what in BACKENDS.items())
        _raise([_error(("backend",), backend, "engine_backend", f"expected {choices}")])
    own, other = (LOCAL_KEYS, OPENAI_KEYS - LOCAL_KEYS) if backend == "local" else (
        OPENAI_KEYS, LOCAL_KEYS - OPENAI_KEYS)
    table, found = {}, []
    for key, item in value.items():
        if key in own or (key == "backend" and backend == "openai"):
            table[key] = item
        elif key == "backend":
            continue
        elif key in other:
            found.append(_error((key,), _shown(key, item), "engine_other_backend",
                                _other_backend(key, backend, "backend" not in value)))
        else:
            hint, meant = unknown_key_hint(key, sorted(own | {"backend"}), "in [engine]")
            shown = REDACTED if SECRET_KEY.search(f"{key} {meant or ''}") else item
            found.append(_error((key,), shown, "engine_unknown_key", hint))
    model = _Local if backend == "local" else _OpenAI
    try:
        engine = model.model_validate({"engine": table}, context=info.context).engine
    except ValidationError as exc:
        for err in exc.errors():
            if err["type"] == "missing":  # its input is the whole table: say what to write
                found.append(_error(tuple(err["loc"][1:]), None, "missing",
                                    f'required with backend = "{backend}"'
                                    + _EXAMPLES.get(err["loc"][-1], "")))
            else:
                found.append(_error(tuple(err["loc"][1:]), err.get("input"), err["type"],
                                    err["msg"], err.get("ctx")))
    if found:
        order = list(value)
        found.sort(key=lambda e: order.index(e["loc"][0]) if e["loc"] and e["loc"][0] in order
                   else -1)
        _raise(found)
    return engine


def dump_engine(engine: EngineSection, info: SerializationInfo) -> dict[str, Any]:
    """`[engine]` as the file has it (the union's own serializer warns on the dataclass)."""
    if isinstance(engine, EngineConfig):
        return _LOCAL_DUMP.dump_python(engine, mode=info.mode)
    return engine.model_dump(mode=info.mode)


EngineField = Annotated[EngineSection, PlainValidator(validate_engine), PlainSerializer(dump_engine)]
"""The root's `engine` field: validated by its backend, dumped as the file has it."""


def _other_backend(key: str, backend: str, default: bool) -> str:
    theirs = "openai" if backend == "local" else "local"
    where = f'backend = "{backend}"' + (" (the default)" if default else "")
    text = f'a key of backend = "{theirs}" ({BACKENDS[theirs].split(":")[0]}), not of {where}'
    same = _SAME_HERE.get((backend, key))
    if same:
        return f"{text}; here it is {same}"
    if backend == "local":
        return f'{text}; set backend = "openai" to use a server, or remove it'
    return f"{text}; remove it"


def _shown(key: str, value: Any) -> Any:
    """A value as an error may show it: never a credential's."""
    return REDACTED if SECRET_KEY.search(key) and not is_reference(value) else value


def _error(loc: tuple, value: Any, kind: str, message: str,
           ctx: dict[str, Any] | None = None) -> InitErrorDetails:
    return InitErrorDetails(type=PydanticCustomError(kind, message, ctx), loc=loc, input=value)


def _raise(errors: list[InitErrorDetails]) -> None:
    raise ValidationError.from_exception_data("engine", errors)
