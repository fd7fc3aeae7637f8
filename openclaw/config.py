"""The daemon's one config file: TOML, validated by pydantic, every problem reported at once.

`load_config(path)` reads the file and returns a `Config`; anything wrong raises `ConfigError`,
whose message has one line per problem naming the file, the dotted key, the value found and what
is expected, so the daemon can refuse to start with a message the admin can act on. A first run
needs no file: a missing file at the default path means all defaults. `starter_config()` is the
commented file `openclaw init` writes.

Relative paths in the file (model, data_dir, skill dirs, `file:` secrets, a SQLite URL) are
relative to the file's own folder, because a daemon's working directory (`/` under systemd) is
never what the admin had in mind.
"""

from __future__ import annotations

import difflib
import hmac
import ipaddress
import json
import logging
import os
import re
import shlex
import tomllib
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

log = logging.getLogger(__name__)

REDACTED = "***"
LOCAL_USER = "terminal:local"  # whoever holds the console owns the daemon
CHANNELS = ("telegram", "discord", "terminal")
STORE_SCHEMES = ("sqlite+aiosqlite", "postgresql+asyncpg")
DEFAULT_SYSTEM_PROMPT = "You are OpenClaw, a helpful personal assistant."


def default_config_path() -> Path:
    """`~/.config/openclaw/openclaw.toml`, computed per call so a changed HOME is honoured."""
    return Path("~/.config/openclaw/openclaw.toml").expanduser()


def default_data_dir() -> Path:
    """`~/.local/share/openclaw`: the database, workspaces and other state."""
    return Path("~/.local/share/openclaw").expanduser()


class ConfigError(Exception):
    """The config cannot be used. `problems` holds one self-contained line per problem."""

    def __init__(self, path: Path | str | None, problems: list[str]) -> None:
        self.path = Path(path) if path is not None else None
        self.problems = list(problems)
        where = str(self.path) if self.path is not None else "config"
        super().__init__("\n".join(f"{where}: {p}" for p in self.problems))


# --- secrets -----------------------------------------------------------------------------------


class Secret:
    """A credential from the config: the value is only reachable through `.get()`.

    In the file it is `"env:NAME"` (read from the environment at load), `"file:PATH"` (the file's
    contents, stripped; systemd credentials and Docker secrets look like this) or a literal.
    `str()`, `repr()` and pydantic dumps all give `***`, so logging a config never leaks one.
    """

    __slots__ = ("_value", "source", "_unread")

    def __init__(self, value: str, source: Literal["env", "file", "literal"] = "literal", *,
                 unread: bool = False) -> None:
        self._value = value  # with `unread`, the "env:NAME" / "file:PATH" reference itself
        self.source = source  # where it came from; `openclaw doctor` can say so without the value
        self._unread = unread

    def get(self) -> str:
        if self._unread:  # a command that never connects loaded the file (load_config's tokens)
            raise RuntimeError(f"the secret {self._value} was not read: the config was loaded "
                               "without the connectors' tokens")
        return self._value

    def __str__(self) -> str:
        return REDACTED

    def __repr__(self) -> str:
        return f"Secret({REDACTED!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return self._unread == other._unread and \
            hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash(self._value)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.with_info_plain_validator_function(
            _validate_secret,
            serialization=core_schema.plain_serializer_function_ser_schema(lambda _: REDACTED),
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict[str, Any]:
        return {"type": "string", "writeOnly": True, "description": 'literal, "env:NAME" or "file:PATH"'}


def _base_dir(info: ValidationInfo | None) -> Path:
    """The folder relative paths are resolved against: the config file's, else the cwd."""
    context = info.context if info is not None else None
    if isinstance(context, dict) and context.get("base_dir") is not None:
        return Path(context["base_dir"])
    return Path.cwd()


def _resolve_reference(value: str, info: ValidationInfo | None) -> tuple[str, str]:
    """`env:NAME` / `file:PATH` / literal -> (value, source). Errors never contain the value."""
    if value.startswith("env:"):
        name = value[4:]
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise PydanticCustomError("secret_ref", "expected env:NAME with NAME a variable name")
        if name not in os.environ:
            raise PydanticCustomError(
                "secret_ref", "environment variable {name} is not set; export it or use file:PATH",
                {"name": name},
            )
        resolved, source = os.environ[name], "env"
    elif value.startswith("file:"):
        path = Path(value[5:]).expanduser()
        if not path.is_absolute():
            path = _base_dir(info) / path
        try:
            resolved = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise PydanticCustomError(
                "secret_ref", "cannot read secret file {path}: {reason}",
                {"path": str(path), "reason": reason},
            ) from None
        source = "file"
    else:
        resolved, source = value, "literal"
    if not resolved.strip():
        raise PydanticCustomError("secret_ref", "the value is empty")
    return resolved, source


def _validate_secret(value: Any, info: ValidationInfo) -> Secret:
    if isinstance(value, Secret):
        return value
    if not isinstance(value, str):
        raise PydanticCustomError("secret_type", 'expected a string: a literal, "env:NAME" or "file:PATH"')
    context = info.context if isinstance(info.context, dict) else {}
    if not context.get("read_tokens", True) and value.startswith(("env:", "file:")):
        # Not read: the service's environment and credential files are not the admin shell's.
        if value.startswith("env:") and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value[4:]):
            raise PydanticCustomError("secret_ref", "expected env:NAME with NAME a variable name")
        return Secret(value, "env" if value.startswith("env:") else "file", unread=True)
    resolved, source = _resolve_reference(value, info)
    return Secret(resolved, source)  # type: ignore[arg-type]


# --- shared field types ------------------------------------------------------------------------


def _validate_path(value: Any, info: ValidationInfo) -> Path:
    if not isinstance(value, (str, Path)) or not str(value):
        raise PydanticCustomError("path_type", "expected a path (a non-empty string)")
    path = Path(value).expanduser()
    return path if path.is_absolute() else _base_dir(info) / path


# `~` expanded; relative paths taken from the config file's folder.
ConfigPath = Annotated[Path, PlainValidator(_validate_path)]

_USER_RE = re.compile(r"(?P<channel>[a-z][a-z0-9_-]*):(?P<id>\S+)")


def _check_user(name: str) -> str:
    """A user is `channel:id`, and one who can exist; catch the mistakes admins really make, with
    the fix in the message."""
    m = _USER_RE.fullmatch(name)
    if m is None:
        raise ValueError(
            'expected a user "channel:id", e.g. "telegram:1001", "discord:42" or "terminal:local"'
        )
    channel, ident = m["channel"], m["id"]
    if channel not in CHANNELS:
        close = difflib.get_close_matches(channel, CHANNELS, n=1)
        hint = f'did you mean "{close[0]}"? ' if close else ""
        raise ValueError(f'unknown channel "{channel}"; {hint}channels are {", ".join(CHANNELS)}')
    if channel in ("telegram", "discord") and not re.fullmatch(r"[0-9]+", ident):
        # Usernames can be changed and taken over; the numeric id is what the connector sees.
        raise ValueError(
            f'{channel} users are named by their numeric id, e.g. "{channel}:1001", not a username'
        )
    if channel == "terminal" and name != LOCAL_USER:
        # The terminal connector only ever sees the console's owner: any other entry matches no one.
        raise ValueError(
            f'the terminal has one user, "{LOCAL_USER}" (the console\'s owner), so "{name}" is no one; '
            'other users are "telegram:ID" or "discord:ID"'
        )
    return name


UserName = Annotated[str, PlainValidator(lambda v: _check_user(_require_str(v)))]


def _require_str(value: Any) -> str:
    if not isinstance(value, str):
        raise PydanticCustomError("string_type", "expected a string")
    return value


def _check_url(value: str | None, schemes: tuple[str, ...]) -> str | None:
    if value is not None and not value.startswith(tuple(f"{s}://" for s in schemes)):
        raise ValueError(f"expected a URL starting with {' or '.join(s + '://' for s in schemes)}")
    return value


class _Section(BaseModel):
    # forbid: a typo such as `dm_polcy` is an error, not a silently ignored key.
    # strict: TOML has real types, so `port = "9477"` is a mistake worth reporting.
    model_config = ConfigDict(extra="forbid", strict=True)


# --- sections ----------------------------------------------------------------------------------


class EngineConfig(_Section):
    """`[engine]`: how the inference engine runs. Names are vLLM's, as in `engine.EngineConfig`."""

    model: str | None = None
    """A Hugging Face model folder (config.json + *.safetensors) or a .gguf file; None is the
    embedded SmolLM2-135M-Instruct, which needs no download."""
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    """"auto" (CUDA when available, else CPU), "cpu", "cuda" or "cuda:N"."""
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    """"auto" is bfloat16 on CUDA and float32 on CPU."""
    max_num_seqs: int = Field(16, ge=1)
    """Sequences decoded together; a personal agent rarely has more conversations at once."""
    max_num_batched_tokens: int = Field(2048, ge=1)
    """Token budget of one engine step; long prompts are prefilled in chunks of this size."""
    block_size: int = Field(16, ge=1)
    """Tokens per paged KV-cache block."""
    kv_cache_gib: float | None = Field(None, gt=0)
    """KV-cache size on CPU in GiB; None is the engine's default (1 GiB)."""
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    """Share of GPU memory the engine may use (weights + KV cache)."""
    enable_prefix_caching: bool = True
    """Reuse the KV cache of a shared prefix (system prompt, earlier turns): big latency win."""
    max_model_len: int | None = Field(None, ge=1)
    """Longest sequence; None is the model's own context length."""
    seed: int = 0
    """Seed of the engine's shared random generator (requests without a seed of their own)."""

    @field_validator("model", mode="before")
    @classmethod
    def _model_path(cls, value: Any, info: ValidationInfo) -> Any:
        return value if value is None else str(_validate_path(value, info))

    def as_engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `engine.AsyncLLM(config.engine.model, **kwargs)`."""
        return self.model_dump(exclude={"model"})


class AgentConfig(_Section):
    """`[agent]`: how one message becomes a reply."""

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    """The system prompt of every conversation."""
    max_steps: int = Field(8, ge=1)
    """Tool-call rounds per message; at the limit the user gets a clear message, not a loop."""
    context_tokens: int | None = Field(None, ge=1)
    """Prompt budget in tokens; None is the model's context length. Older turns beyond it are
    compacted into a summary."""
    reply_max_tokens: int = Field(512, ge=1)
    """Most tokens one model response may generate."""
    temperature: float = Field(0.7, ge=0)
    """Sampling temperature; 0 is greedy."""
    top_p: float = Field(0.95, gt=0, le=1)
    """Nucleus sampling: keep the smallest set of tokens with this total probability."""
    compaction_keep_messages: int = Field(8, ge=0)
    """The most recent messages, never compacted, so the model always sees the latest turns verbatim."""
    tool_timeout_s: float = Field(60.0, gt=0)
    """Seconds a tool call may run before it is stopped and reported to the model as an error."""


class StoreConfig(_Section):
    """`[store]`: where conversations, users and the audit log live."""

    url: str | None = None
    """SQLAlchemy URL: "sqlite+aiosqlite:///PATH" (default: openclaw.db in data_dir) or
    "postgresql+asyncpg://USER:PASSWORD@HOST/DB". May be "env:NAME" or "file:PATH", since a
    PostgreSQL URL carries a password; the password is masked in repr and dumps."""
    # Retention (openclaw/store/retention.py): days each kind of row is kept; 0 keeps it forever.
    # Read at start, like the rest of [store]; `openclaw db prune` reads them from the file.
    keep_journal_days: int = Field(30, ge=0)
    """Inbound messages handled and replies sent (or given up on); never one still to answer
    or to send. At least 2: the row is what recognises an update redelivered within a day."""
    keep_usage_days: int = Field(90, ge=0)
    """Token usage rows; the daily cap and /status read only today's."""
    keep_audit_days: int = Field(365, ge=0)
    """The audit log of skill calls."""
    keep_pending_users_days: int = Field(7, ge=0)
    """Strangers never admitted (pending, no live pairing code, no conversation); never a user
    the config names. Expired pairing codes are always deleted."""
    keep_archived_days: int = Field(0, ge=0)
    """Conversations closed by /new, with their messages and summaries; 0 (the default): the
    agent's memory is kept."""

    @field_validator("keep_journal_days")
    @classmethod
    def _journal_outlives_redelivery(cls, days: int) -> int:
        if days == 1:
            raise ValueError("expected 0 (keep forever) or at least 2: a handled message must "
                             "outlive a redelivery of it, which Telegram makes up to 24 hours later")
        return days

    @field_validator("url", mode="before")
    @classmethod
    def _url(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        context = info.context if isinstance(info.context, dict) else {}
        if not context.get("read_store_url", True) and _require_str(value).startswith(("env:", "file:")):
            return value  # left unread, as written (load_config's store=False)
        url, _ = _resolve_reference(_require_str(value), info)
        scheme, sep, rest = url.partition("://")
        if not sep or scheme not in STORE_SCHEMES:
            raise ValueError(_store_scheme_hint(scheme if sep else ""))
        return _absolute_sqlite_url(url, info) if scheme == "sqlite+aiosqlite" else url

    @field_serializer("url")
    def _dump_url(self, url: str | None) -> str | None:
        return _mask_password(url)

    def __repr_args__(self):  # type: ignore[override]
        yield "url", _mask_password(self.url)


def _store_scheme_hint(scheme: str) -> str:
    if scheme.startswith("sqlite"):
        return 'expected "sqlite+aiosqlite:///PATH" (the store is async: use the aiosqlite driver)'
    if scheme.startswith("postgres"):
        return 'expected "postgresql+asyncpg://USER:PASSWORD@HOST/DB" (the store is async: use asyncpg)'
    return 'expected a URL starting with "sqlite+aiosqlite://" or "postgresql+asyncpg://"'


def _absolute_sqlite_url(url: str, info: ValidationInfo) -> str:
    """A relative or `~` SQLite path would depend on the daemon's cwd: pin it to the config's folder."""
    prefix = "sqlite+aiosqlite:///"
    if not url.startswith(prefix):
        return url  # "sqlite+aiosqlite://" alone: in memory
    path, sep, query = url[len(prefix):].partition("?")
    if path in ("", ":memory:") or path.startswith("/"):
        return url
    return f"{prefix}{_validate_path(path, info)}{sep}{query}"


def _mask_password(url: str | None) -> str | None:
    # Up to the last "@": SQLAlchemy's password runs to an "@", and may hold "/", ":" or "?"
    # (one with an "@" unencoded is cut there, but the rest is as secret).
    return url if url is None else re.sub(r"(://[^:/@]*:).*@", rf"\1{REDACTED}@", url)


class AccessConfig(_Section):
    """`[access]`: who may talk to the agent. Users are "channel:id"."""

    admins: list[UserName] = []
    """Users with every permission; they approve pairing requests."""
    allow: list[UserName] = []
    """Users who may talk to the agent."""
    blocked: list[UserName] = []
    """Users who get no answer at all."""
    dm_policy: Literal["pairing", "allowlist", "open"] = "pairing"
    """Unknown users: "pairing" gives them a one-time code an admin approves; "allowlist" ignores
    them; "open" lets anyone talk to the agent (with the "user" role)."""
    roles: dict[UserName, str] = {}
    """User -> role name; without an entry admins have "admin" and everyone else "user"."""

    @field_validator("blocked")
    @classmethod
    def _blocked_is_not_let_in(cls, blocked: list[str], info: ValidationInfo) -> list[str]:
        for listed in ("admins", "allow"):
            both = [u for u in blocked if u in info.data.get(listed, ())]
            if both:
                raise ValueError(f"{', '.join(both)} cannot be both in access.{listed} and blocked")
        if LOCAL_USER in blocked:  # as `openclaw users block terminal:local` refuses
            raise ValueError(f"{LOCAL_USER}, the console's owner, is never shut out of their own "
                             "terminal; remove it from blocked")
        return blocked

    @field_validator("roles")
    @classmethod
    def _role_names(cls, roles: dict[str, str]) -> dict[str, str]:
        for user, role in roles.items():
            if not re.fullmatch(r"[A-Za-z0-9_-]+", role):
                raise ValueError(f'role of {user} must be a name like "user" or "admin", got "{role}"')
        return roles


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name could resolve anywhere


class AdminConfig(_Section):
    """`[admin]`: the HTTP port for /healthz and Prometheus /metrics."""

    enabled: bool = True
    """Serve /healthz and /metrics."""
    allow_remote: bool = False
    """Permit a non-loopback host. Off: metrics reveal usage, and nothing on it is authenticated."""
    host: str = "127.0.0.1"
    """Address to bind; loopback unless allow_remote = true."""
    port: int = Field(9477, ge=0, le=65535)
    """TCP port; 0 picks a free one (tests)."""

    # allow_remote is declared before host so host's validator can see it.
    @field_validator("host")
    @classmethod
    def _loopback_unless_allowed(cls, host: str, info: ValidationInfo) -> str:
        if not host:
            raise ValueError("expected an address such as 127.0.0.1")
        if not _is_loopback(host) and not info.data.get("allow_remote", False):
            raise ValueError(
                "the admin port must stay on loopback (127.0.0.1, ::1 or localhost); "
                "set admin.allow_remote = true to expose it deliberately"
            )
        return host


def _require_token(token: Secret | None, info: ValidationInfo, section: str, env: str) -> Secret | None:
    if token is None and info.data.get("enabled"):
        raise ValueError(f'required when {section}.enabled = true, e.g. token = "env:{env}"')
    return token


class TelegramConfig(_Section):
    """`[telegram]`: the Telegram bot connector (python-telegram-bot)."""

    enabled: bool = False
    """Run the Telegram connector."""
    token: Secret | None = Field(None, validate_default=True)
    """Bot token from @BotFather; required when enabled. Use "env:NAME" or "file:PATH"."""
    base_url: str | None = None
    """Bot API base in python-telegram-bot's form, e.g. "http://127.0.0.1:8081/bot" (self-hosted
    Bot API servers, tests); None is api.telegram.org."""
    base_file_url: str | None = None
    """File download base, e.g. "http://127.0.0.1:8081/file/bot"; None is Telegram's."""
    webhook_url: str | None = None
    """Public HTTPS URL to receive updates by webhook; None uses long polling (no open port).
    Not supported yet: setting it stops the start with that message."""
    # Read only to refuse it clearly, so the starter file does not offer it.
    hidden_keys: ClassVar[frozenset[str]] = frozenset({"webhook_url"})
    stream_edits: bool = False
    """Stream replies by editing a draft message (at most once a second)."""
    max_file_mb: float = Field(20.0, gt=0, le=2000)
    """Documents larger than this are not downloaded (the user is told). Telegram's cloud Bot API
    serves at most 20 MB to bots; a self-hosted Bot API server up to 2000."""

    @field_validator("token")
    @classmethod
    def _token_when_enabled(cls, token: Secret | None, info: ValidationInfo) -> Secret | None:
        return _require_token(token, info, "telegram", "TELEGRAM_BOT_TOKEN")

    @field_validator("base_url", "base_file_url", "webhook_url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        return _check_url(value, ("http", "https"))


class DiscordConfig(_Section):
    """`[discord]`: the Discord bot connector (discord.py)."""

    enabled: bool = False
    """Run the Discord connector."""
    token: Secret | None = Field(None, validate_default=True)
    """Bot token from the Discord developer portal; required when enabled."""
    api_base: str | None = None
    """REST API base, e.g. "http://127.0.0.1:8082/api/v10" (tests); None is discord.com's."""
    gateway_url: str | None = None
    """Websocket gateway URL, e.g. "ws://127.0.0.1:8082/" (tests); None is Discord's."""
    stream_edits: bool = False
    """Stream replies by editing a draft message."""
    max_file_mb: float = Field(20.0, gt=0, le=500)
    """Attached files larger than this are not downloaded (the user is told). Discord itself caps
    uploads between 10 and 500 MB, by the server's boost level."""

    @field_validator("token")
    @classmethod
    def _token_when_enabled(cls, token: Secret | None, info: ValidationInfo) -> Secret | None:
        return _require_token(token, info, "discord", "DISCORD_BOT_TOKEN")

    @field_validator("api_base")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        return _check_url(value, ("http", "https"))

    @field_validator("gateway_url")
    @classmethod
    def _ws(cls, value: str | None) -> str | None:
        return _check_url(value, ("ws", "wss"))


class SandboxConfig(_Section):
    """`[sandbox]`: how skills that run programs are isolated."""

    allow_unsandboxed: bool = False
    """Run the shell skill without bubblewrap when it is unavailable. Dangerous: leave off."""
    bwrap_path: ConfigPath | None = None
    """Path of the bwrap binary; None searches PATH."""
    slirp4netns_path: ConfigPath | None = None
    """Path of the slirp4netns binary, which gives network to roles granted it; None searches
    PATH."""
    min_free_disk_mb: int = Field(1024, ge=0)
    """Free space (MB) every role's commands and file writes must leave on what they write and on
    data_dir's filesystem, where the database is: a command is refused, or killed, below it; 0: no
    reserve."""


class SkillsConfig(_Section):
    """`[skills]`: which skills exist, and `[skills.NAME]` tables with each skill's settings."""

    hidden_keys: ClassVar[frozenset[str]] = frozenset({"settings"})  # not a key of the file

    enabled: list[str] = ["clock"]
    """Skills offered to the model: built-in names, entry points (group "openclaw.skills") or
    "module:Class". Roles decide who may use each."""
    dirs: list[ConfigPath] = []
    """Folders of SKILL.md skills (OpenClaw format), offered by name and description."""
    settings: dict[str, dict[str, Any]] = {}
    """Each `[skills.NAME]` table, by NAME; checked by the skill itself."""

    @model_validator(mode="before")
    @classmethod
    def _collect_tables(cls, data: Any) -> Any:
        # In the file a skill's settings are `[skills.NAME]`, i.e. a table inside [skills]; any
        # other unknown key stays put so extra="forbid" reports it (`enabeld = [...]`).
        if not isinstance(data, dict):
            return data
        fixed = {k: v for k, v in data.items() if k in ("enabled", "dirs") or not isinstance(v, dict)}
        tables = {k: v for k, v in data.items() if k not in fixed}
        return {**fixed, "settings": tables} if tables else fixed

    @model_serializer(mode="wrap")
    def _dump_as_file(self, handler: Any) -> dict[str, Any]:
        # Dump in the file's shape, so a dump validates back to the same config.
        data = handler(self)
        settings = data.pop("settings", {})
        return {**data, **{name: _redact_settings(table) for name, table in settings.items()}}

    def __repr_args__(self):  # type: ignore[override]
        yield "enabled", self.enabled
        yield "dirs", self.dirs
        yield "settings", {name: _redact_settings(t) for name, t in self.settings.items()}


_SECRET_KEY = re.compile(r"pass|token|secret|key|credential", re.IGNORECASE)


def _resolve_skill_secrets(name: str, table: dict[str, Any], base_dir: Path | None) -> tuple[
        dict[str, Any], list[str]]:
    """A skill's settings with "env:NAME" / "file:PATH" references in credential-like keys
    resolved, for handing to the skill (skills never see the config machinery); and problems."""
    info = None if base_dir is None else _BaseDirInfo(base_dir)
    resolved, problems = {}, []
    for key, value in table.items():
        if _SECRET_KEY.search(key) and isinstance(value, str):
            try:
                value = _resolve_reference(value, info)[0]  # type: ignore[arg-type]
            except PydanticCustomError as exc:
                problems.append(f"skills.{name}.{key}: {exc.message()}")
        resolved[key] = value
    return resolved, problems


class _BaseDirInfo:
    """Just enough of ValidationInfo for _resolve_reference outside validation."""

    def __init__(self, base_dir: Path) -> None:
        self.context = {"base_dir": base_dir}


_ROLE_NAME = re.compile(r"[A-Za-z0-9_-]+")


class RoleConfig(_Section):
    """`[roles.NAME]`: what users with this role may do. [roles.admin] and [roles.user] change the
    built-in roles: keys left out keep the built-in values."""

    skills: list[str] = []
    """Skills this role may use, by name; "*" for every enabled skill."""
    workspace: str | None = None
    """The user's folder ("{user}" is replaced); unset: <data_dir>/workspaces/<user>."""
    read_only: list[ConfigPath] = []
    """Extra folders the role's skills may read (shell sees them at the same path)."""
    read_write: list[ConfigPath] = []
    """Extra folders the role's skills may write."""
    network: bool = False
    """Network access for shell commands: the internet through user-mode NAT (slirp4netns), in a
    network namespace of their own, never the host's loopback services."""
    cpu_seconds: int = Field(30, ge=1)
    memory_mb: int = Field(1024, ge=16)
    wall_seconds: float = Field(60, gt=0)
    output_bytes: int = Field(64 * 1024, ge=1024)
    file_size_mb: int = Field(64, ge=1)
    """Largest file a command or the files skill may write."""
    disk_mb: int = Field(1024, ge=0)
    """What the user's workspace may hold in all (MB); 0: no quota (the built-in admin role's)."""
    processes: int = Field(64, ge=1)
    email_recipients: list[str] = []
    """Addresses the email skill may send to; "*" for anyone."""
    email_domains: list[str] = []
    """Domains the email skill may send to (anyone@domain)."""
    email_read: bool = False
    """Whether the email skill may list and read the mailbox ([skills.email] has one account for
    everyone); the built-in admin role may, other roles only when this is true."""
    approval: list[str] = []
    """Skills whose every call the user must approve in the chat (/approve N or /deny N)."""
    approval_timeout_s: float = Field(300, gt=0)
    """Seconds to wait for an approval; no answer counts as deny."""
    daily_tokens: int = Field(0, ge=0)
    """Tokens (prompt + answer, as /status counts them) a user of this role may use per UTC day;
    0: no limit. Checked when a message arrives: the turn that crosses it still finishes."""

    @field_validator("workspace")
    @classmethod
    def _workspace_path(cls, value: str | None, info: ValidationInfo) -> str | None:
        # Like every path in the file: relative to the file's folder, never to the daemon's cwd.
        if value is None:
            return None
        if "{user}" not in value:
            raise ValueError('must contain "{user}" (each user gets a folder of their own), '
                             'e.g. "/srv/openclaw/{user}"')
        path = Path(value).expanduser()
        return str(path if path.is_absolute() else _base_dir(info) / path)

    @field_validator("email_recipients")
    @classmethod
    def _addresses(cls, values: list[str]) -> list[str]:
        bad = [v for v in values if v != "*" and not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", v)]
        if bad:
            raise ValueError(f"not email addresses: {bad}; use e.g. \"me@example.org\" or \"*\"")
        return [v.lower() for v in values]

    @field_validator("email_domains")
    @classmethod
    def _domains(cls, values: list[str]) -> list[str]:
        bad = [v for v in values if not re.fullmatch(r"[A-Za-z0-9.-]+\.[A-Za-z]{2,}", v)]
        if bad:
            raise ValueError(f"not domain names: {bad}; use e.g. \"example.org\" (no @)")
        return [v.lower() for v in values]

    def to_role(self, name: str, base: Any | None = None) -> Any:
        """The sandbox Role; for a built-in name, keys not given here keep `base`'s values."""
        from dataclasses import replace

        from sandbox.policy import Role

        given = self.model_fields_set
        limits_given = given & {"cpu_seconds", "memory_mb", "wall_seconds", "output_bytes",
                                "file_size_mb", "processes", "disk_mb"}
        role = base or Role(name)
        fields: dict[str, Any] = {}
        if base is None or limits_given:
            old = role.limits
            pick = lambda key, value, current: value if (base is None or key in given) else current  # noqa: E731
            fields["limits"] = replace(
                old,
                cpu_seconds=pick("cpu_seconds", self.cpu_seconds, old.cpu_seconds),
                memory_bytes=pick("memory_mb", self.memory_mb << 20, old.memory_bytes),
                wall_seconds=pick("wall_seconds", self.wall_seconds, old.wall_seconds),
                output_bytes=pick("output_bytes", self.output_bytes, old.output_bytes),
                file_size_bytes=pick("file_size_mb", self.file_size_mb << 20, old.file_size_bytes),
                processes=pick("processes", self.processes, old.processes),
                disk_bytes=pick("disk_mb", self.disk_mb << 20, old.disk_bytes))
        simple = {"skills": frozenset(self.skills), "workspace": self.workspace,
                  "read_only": tuple(self.read_only), "read_write": tuple(self.read_write),
                  "network": self.network, "email_recipients": frozenset(self.email_recipients),
                  "email_domains": frozenset(self.email_domains), "email_read": self.email_read,
                  "approval": frozenset(self.approval),
                  "approval_timeout_s": self.approval_timeout_s, "daily_tokens": self.daily_tokens}
        for key, value in simple.items():
            if base is None or key in given:
                fields[key] = value
        return replace(role, name=name, **fields)


def _redact_settings(table: dict[str, Any]) -> dict[str, Any]:
    """Skill settings are free-form until each skill types them: mask what looks like a credential."""
    return {
        k: (REDACTED if _SECRET_KEY.search(k) and isinstance(v, str) and not v.startswith("env:") else v)
        for k, v in table.items()
    }


class Config(_Section):
    """The whole file. Load it with `load_config`."""

    data_dir: ConfigPath = Field(default_factory=default_data_dir)
    """Where state lives: the database, user workspaces."""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    access: AccessConfig = Field(default_factory=AccessConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)
    telegram: TelegramConfig = Field(default_factory=TelegramConfig)
    discord: DiscordConfig = Field(default_factory=DiscordConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    skills: SkillsConfig = Field(default_factory=SkillsConfig)
    roles: dict[str, RoleConfig] = {}
    """`[roles.NAME]` tables: what each role may do (skills, paths, network, limits)."""

    _source: Path | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _default_store_url(self) -> Config:
        if self.store.url is None:
            self.store.url = f"sqlite+aiosqlite:///{self.data_dir / 'openclaw.db'}"
        return self

    @model_validator(mode="after")
    def _cross_references(self) -> Config:
        problems = _cross_reference_problems(self.data_dir, dict(self.roles), self.access.roles)
        if problems:  # one line each; load_config splits them
            raise ValueError("\n".join(problems))
        return self

    def policy(self) -> Any:
        """The sandbox policy: built-in roles changed or extended by [roles.NAME]."""
        from sandbox.policy import BUILTIN_ROLES, Policy

        roles = {name: table.to_role(name, BUILTIN_ROLES.get(name)) for name, table in self.roles.items()}
        return Policy(roles, self.data_dir, self.user_role)

    def skill_settings(self, secrets: bool | Collection[str] = True) -> dict[str, dict[str, Any]]:
        """Each [skills.NAME] table with its credential references resolved; ConfigError if one
        cannot be (an unset variable, an unreadable file). `secrets=False`: the references left
        as written, for what only describes the skills (the service's environment may be the only
        one to hold them); a collection of names: only those skills' resolved (the one skill a
        command runs)."""
        from skills.builtin.zones import one_zone

        settings: dict[str, dict[str, Any]] = {}
        problems: list[str] = []
        base = self._source.parent if self._source else None
        for name, table in self.skills.settings.items():
            if secrets is True or (secrets is not False and name in secrets):
                settings[name], found = _resolve_skill_secrets(name, table, base)
                problems += found
            else:
                settings[name] = dict(table)
        problems += one_zone(settings, self.skills.enabled)
        if problems:
            raise ConfigError(self._source, problems)
        return settings

    @property
    def source(self) -> Path | None:
        """The file this config was read from; None when it is all defaults."""
        return self._source

    def user_role(self, user: str) -> str:
        """The role of a "channel:id" user: access.roles, else "admin" for admins and the console's
        owner (terminal:local), else "user"."""
        if user in self.access.roles:
            return self.access.roles[user]
        return "admin" if user in self.access.admins or user == LOCAL_USER else "user"


# --- checks across sections ---------------------------------------------------------------------


def _cross_reference_problems(data_dir: Path | None, roles: dict[str, RoleConfig | None],
                              access_roles: dict[str, str]) -> list[str]:
    """What no one section can check: role names, the roles `access.roles` names being defined, and
    granted folders clear of data_dir. `roles` holds every [roles.NAME], None where its table did not
    parse (the role is still defined); a None data_dir skips the folder check."""
    problems = []
    bad_names = [n for n in roles if not _ROLE_NAME.fullmatch(n)]
    if bad_names:
        problems.append(f"roles: role names are letters, digits, _ and -; got {bad_names}")
    known = {"admin", "user", *roles}
    for user, role in access_roles.items():
        if role not in known:
            problems.append(f'access.roles: {user} has the role "{role}", which is not defined; '
                            f"add a [roles.{role}] table or use one of: {', '.join(sorted(known))}")
    if data_dir is not None:
        problems += [p for name, role in roles.items() if role is not None
                     for p in _grants_over_data_dir(data_dir, name, role)]
    return problems


def _grants_over_data_dir(data_dir: Path, name: str, role: RoleConfig) -> list[str]:
    """A folder granted to a role must not hold data_dir (the database with every conversation,
    every user's workspace) nor lie inside it: the role's skills would reach all of that."""
    data = Path(os.path.realpath(data_dir.expanduser()))
    problems = []
    for key in ("read_only", "read_write"):
        for index, path in enumerate(getattr(role, key)):
            real = Path(os.path.realpath(path.expanduser()))
            if data.is_relative_to(real) or real.is_relative_to(data):
                where = "holds" if data.is_relative_to(real) else "is inside"
                problems.append(f"roles.{name}.{key}[{index}]: {path} {where} data_dir ({data_dir}: "
                                "the database and every user's workspace); grant a folder beside it")
    return problems


def _cross_references_of_what_parsed(data: dict[str, Any], base_dir: Path) -> list[str]:
    """The checks across sections on a file that failed validation: run on the parts that parse
    alone, so their problems come in the same report rather than the next one."""
    context = {"base_dir": base_dir}
    data_dir = _parsed(lambda: TypeAdapter(ConfigPath).validate_python(
        data.get("data_dir", default_data_dir()), context=context))
    raw_roles = data.get("roles", {})
    roles = {name: _parsed(lambda t=table: RoleConfig.model_validate(t, context=context))
             for name, table in raw_roles.items()} if isinstance(raw_roles, dict) else {}
    access = data.get("access", {})
    raw_access_roles = access.get("roles", {}) if isinstance(access, dict) else {}
    access_roles: dict[str, str] = {}
    if isinstance(raw_access_roles, dict):
        for user, role in raw_access_roles.items():  # each entry alone: one bad one hides no other
            parsed = _parsed(lambda u=user, r=role: AccessConfig.model_validate({"roles": {u: r}}))
            access_roles.update(parsed.roles if parsed is not None else {})
    return _cross_reference_problems(data_dir, roles, access_roles)


def _parsed(validate: Any) -> Any:
    """`validate()`, or None when it fails (its problems are already reported)."""
    try:
        return validate()
    except ValidationError:
        return None


# --- loading -----------------------------------------------------------------------------------


def _read_toml(path: str | Path | None) -> tuple[Path, dict[str, Any] | None]:
    """(the file, its TOML tables), None for a default path with no file; ConfigError else."""
    explicit = path is not None
    file = (Path(path).expanduser() if explicit else default_config_path()).absolute()
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        if explicit:  # `openclaw init` alone writes the default path, not this one
            init = "openclaw init" + ("" if file == default_config_path() else
                                      f" --config {shlex.quote(str(file))}")
            raise ConfigError(file, [f"file not found; create one with `{init}`"]) from None
        return file, None
    except OSError as exc:
        raise ConfigError(file, [f"cannot read the file: {exc.strerror or exc}"]) from None
    try:
        return file, tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(file, [f"not UTF-8 text (byte {exc.start})"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(file, [_toml_problem(exc)]) from None


def data_dir_of(path: str | Path | None = None, *, home: Path | None = None) -> Path:
    """The data_dir the config names, the rest of the file unchecked: what a command that only
    looks for the running daemon needs, run from a shell that may not hold the secrets the file
    names (`env:`, `file:` readable by the service only).

    `home`: the data_dir of a daemon whose HOME that is (a system service's `User=`, whose HOME
    systemd sets), not this shell's: the default and a leading `~/` are under it."""
    file, data = _read_toml(path)
    if data is None or "data_dir" not in data:
        return default_data_dir() if home is None else home / ".local" / "share" / "openclaw"
    value = data["data_dir"]
    if home is not None and isinstance(value, str) and (value == "~" or value.startswith("~/")):
        value = str(home / value[2:])
    try:
        return TypeAdapter(ConfigPath).validate_python(value, context={"base_dir": file.parent})
    except ValidationError as exc:
        raise ConfigError(file, [f"data_dir: {exc.errors()[0]['msg']}"]) from None


def load_config(path: str | Path | None = None, *, tokens: bool = True, store: bool = True) -> Config:
    """Read and validate the config. None means the default path, where a missing file is fine.

    `tokens=False` leaves the `env:` / `file:` references of the connectors' tokens unread (their
    `get()` raises): for commands that never connect (pairing, users, db...), which an admin runs
    from a shell that lacks the variables and credential files only the service is given.
    `store=False` leaves an `env:` / `file:` `[store] url` as written, for what never opens the
    store either (`service install`)."""
    file, data = _read_toml(path)
    if data is None:
        return Config()
    try:
        config = Config.model_validate(data, context={"base_dir": file.parent,
                                                      "read_tokens": tokens,
                                                      "read_store_url": store})
    except ValidationError as exc:
        errors = exc.errors()
        found = [line for err in errors for line in _problem(err).split("\n")]
        if any(err["loc"] for err in errors):  # a section failed, so the checks across them did not run
            found += _cross_references_of_what_parsed(data, file.parent)
        raise ConfigError(file, found) from None
    config._source = file
    _warn_if_exposed(config, file)
    return config


def _toml_problem(exc: tomllib.TOMLDecodeError) -> str:
    # Python 3.11's TOMLDecodeError only has the position inside its message: "... (at line 3, column 7)".
    message = str(exc)
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if m is None:
        return f"invalid TOML: {message}"
    return f"line {m[1]}, column {m[2]}: invalid TOML: {message[: m.start()]}"


def _warn_if_exposed(config: Config, file: Path) -> None:
    """Warn (naming the keys, never their values) when the file holds a secret written in it and
    other users may read it."""
    held = exposed_secrets(config, file)
    if held:
        log.warning("%s holds secrets (%s) and other users can read it; run: chmod 600 %s",
                    file, ", ".join(held), file)


def exposed_secrets(config: Config, file: Path) -> list[str]:
    """The keys of secrets written in `file` (not "env:NAME" or "file:PATH" references) when other
    users may read it; [] when they may not, or it holds none."""
    try:
        if not file.stat().st_mode & 0o077:
            return []
    except OSError:
        return []
    held = [f"{name}.token" for name in ("telegram", "discord")
            if (token := getattr(config, name).token) is not None and token.source == "literal"]
    held += [f"skills.{name}.{key}" for name, table in config.skills.settings.items()
             for key, value in table.items()
             if _SECRET_KEY.search(key) and isinstance(value, str)
             and not value.startswith(("env:", "file:"))]
    if _password_written(file):
        held.append("store.url (a password)")
    return held


def _password_written(file: Path) -> bool:
    """Whether `file` spells out a password in store.url: the loaded URL cannot tell, as an
    "env:NAME" or "file:PATH" there resolved to one that is not in this file."""
    try:
        _, data = _read_toml(file)
    except ConfigError:  # changed since it loaded: the next load says so
        return False
    url = ((data or {}).get("store") or {}).get("url")
    return isinstance(url, str) and not url.startswith(("env:", "file:")) \
        and _mask_password(url) != url


# --- error messages ----------------------------------------------------------------------------

_EXPECTED = {
    "model_type": "expected a table",
    "dict_type": "expected a table",
    "list_type": "expected a list",
    "string_type": "expected a string",
    "int_type": "expected an integer",
    "int_from_float": "expected an integer",
    "float_type": "expected a number",
    "bool_type": "expected true or false",
}
_BOUNDS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}


def _problem(err: Any) -> str:
    """One pydantic error -> `key = value: what is expected`."""
    loc = [p for p in err["loc"] if p != "[key]"]
    key = _dotted(loc)
    kind = err["type"]
    if not loc and kind == "value_error":  # a whole-file check; its message names the key itself
        return re.sub(r"^Value error, ", "", err["msg"])
    if kind == "extra_forbidden":
        hint, meant = _unknown_key_hint(loc)
        value = err["input"]
        if isinstance(value, str):  # a mistyped `token`, a password in the wrong table
            value = REDACTED if _SECRET_KEY.search(f"{loc[-1]} {meant or ''}") else _mask_password(value)
        return f"{key} = {_show(value)}: {hint}"
    if kind in _EXPECTED:
        expected = _EXPECTED[kind]
    elif kind in _BOUNDS:
        bound = next(iter(err["ctx"].values()))
        expected = f"expected a number {_BOUNDS[kind]} {bound}"
    elif kind == "string_pattern_mismatch" and loc == ["engine", "device"]:
        expected = 'expected "auto", "cpu", "cuda" or "cuda:N"'
    else:
        expected = re.sub(r"^Input should be ", "expected ", re.sub(r"^Value error, ", "", err["msg"]))
    value = err.get("input")
    if loc == ["store", "url"] and isinstance(value, str):
        value = _mask_password(value)
    if kind.startswith("secret") and not (isinstance(value, str) and value.startswith(("env:", "file:"))):
        value = REDACTED  # never echo a literal credential, even a malformed one
    if kind == "list_type" and isinstance(value, str) and value:  # `skills = "*"`, `enabled = "clock"`
        expected += f" (of one: [{json.dumps(value, ensure_ascii=False)}])"
    if value is None:
        return f"{key}: {expected}"
    return f"{key} = {_show(value)}: {expected}"


def _dotted(loc: list[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = part if re.fullmatch(r"[A-Za-z0-9_-]+", part) else json.dumps(part)
            out += f".{name}" if out else name
    return out or "(top level)"


def _show(value: Any) -> str:
    if value is REDACTED:
        return REDACTED
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, dict):
        return "a table"
    elif isinstance(value, Path):
        text = json.dumps(str(value))
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _unknown_key_hint(loc: list[Any]) -> tuple[str, str | None]:
    """What to say of an unknown key, and the key it was likely meant to be."""
    model: Any = Config
    parts = iter(loc[:-1])
    for part in parts:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        model = field.annotation if field is not None else None
        if get_origin(model) is dict:  # `[roles.NAME]`: skip NAME, look inside the table's model
            model = get_args(model)[1] if next(parts, None) is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return "unknown key", None
    keys = [k for k in model.model_fields if k not in getattr(model, "hidden_keys", ())]
    where = f"in [{_dotted(loc[:-1])}]" if len(loc) > 1 else "at the top level"
    close = difflib.get_close_matches(str(loc[-1]), keys, n=1)
    if close:
        return f'unknown key {where}; did you mean "{close[0]}"?', close[0]
    return f"unknown key {where}; expected one of: {', '.join(keys)}", None


# --- the starter file --------------------------------------------------------------------------

_STARTER = '''\
# OpenClaw configuration. Every key is optional: a commented line `# key = value` shows the
# default, and uncommenting it changes nothing. Lines starting `# e.g.` are examples.
# Relative paths are relative to this file's folder. Secrets (tokens, passwords) can be given
# as "env:NAME" (an environment variable) or "file:PATH" (a file's contents) instead of literally;
# they are never logged. Check the file with `openclaw doctor`.

# Where state lives: the database, user workspaces.
# data_dir = "~/.local/share/openclaw"

[engine]
# The model: a Hugging Face folder (config.json + *.safetensors) or a .gguf file.
# Unset: the embedded SmolLM2-135M-Instruct, which needs no download.
# e.g. model = "~/models/Qwen3-1.7B"
# "auto" (CUDA when available, else CPU), "cpu", "cuda" or "cuda:N".
# device = "auto"
# "auto" (bfloat16 on CUDA, float32 on CPU), "float32", "float16" or "bfloat16".
# dtype = "auto"
# Sequences decoded together, and the token budget of one engine step.
# max_num_seqs = 16
# max_num_batched_tokens = 2048
# Tokens per paged KV-cache block.
# block_size = 16
# KV-cache size on CPU in GiB (unset: 1 GiB); share of GPU memory to use on CUDA.
# e.g. kv_cache_gib = 4.0
# gpu_memory_utilization = 0.85
# Reuse the KV cache of shared prefixes (system prompt, earlier turns).
# enable_prefix_caching = true
# Longest sequence (unset: the model's context length).
# e.g. max_model_len = 8192
# Seed for requests without their own.
# seed = 0

[agent]
# system_prompt = "You are OpenClaw, a helpful personal assistant."
# Tool-call rounds per message before the agent stops with a message.
# max_steps = 8
# Prompt budget in tokens (unset: the model's context length); older turns are summarised.
# e.g. context_tokens = 4096
# Most tokens one model response may generate.
# reply_max_tokens = 512
# temperature = 0.7
# top_p = 0.95
# Recent messages that are never summarised.
# compaction_keep_messages = 8
# Seconds a tool call may run.
# tool_timeout_s = 60

[store]
# Unset: a SQLite file, openclaw.db in data_dir. PostgreSQL works too (the URL may be "env:NAME").
# e.g. url = "postgresql+asyncpg://openclaw:PASSWORD@localhost/openclaw"
# Retention: days each kind of row is kept, 0 = forever. The daemon deletes older ones at start
# and then daily (`openclaw db prune` does it now); conversations are kept unless told below.
# Inbound messages handled and replies sent (never one still to answer or send); 0 or >= 2.
# keep_journal_days = 30
# Token usage rows (the daily cap and /status count today's).
# keep_usage_days = 90
# The audit log of skill calls.
# keep_audit_days = 365
# Strangers never admitted (pending, without a live pairing code); expired codes always go.
# keep_pending_users_days = 7
# Conversations closed by /new, with their messages (0: the agent remembers them forever).
# keep_archived_days = 0

[access]
# Users are "channel:id": "telegram:1001", "discord:42", or "terminal:local" (the console's owner,
# the terminal's one user).
# Find your Telegram id by messaging the bot: the pairing request shows it.
# Admins may do everything and approve pairing requests.
admins = []
# Users who may talk to the agent.
allow = []
# Users who get no answer at all.
blocked = []
# Unknown users: "pairing" (they get a code an admin approves with `openclaw pairing approve`),
# "allowlist" (ignored), or "open" (anyone may talk to the agent).
dm_policy = "pairing"
# Roles by user (default: "admin" for admins, "user" for everyone else).
# e.g. roles = { "telegram:1001" = "family" }

[admin]
# /healthz and Prometheus /metrics over HTTP.
# enabled = true
# The port stays on loopback unless allow_remote = true (nothing on it is authenticated).
# host = "127.0.0.1"
# port = 9477
# allow_remote = false

[telegram]
enabled = false
# Bot token from @BotFather.
# e.g. token = "env:TELEGRAM_BOT_TOKEN"
# A self-hosted Bot API server (unset: api.telegram.org).
# e.g. base_url = "http://127.0.0.1:8081/bot"
# e.g. base_file_url = "http://127.0.0.1:8081/file/bot"
# Show replies as they are generated by editing a draft message.
# stream_edits = false
# Documents larger than this many MB are not downloaded (Telegram's cloud API: at most 20).
# max_file_mb = 20

[discord]
enabled = false
# Bot token from the Discord developer portal.
# e.g. token = "env:DISCORD_BOT_TOKEN"
# Other API and gateway endpoints (unset: Discord's).
# e.g. api_base = "http://127.0.0.1:8082/api/v10"
# e.g. gateway_url = "ws://127.0.0.1:8082/"
# stream_edits = false
# Attached files larger than this many MB are not downloaded.
# max_file_mb = 20

[sandbox]
# Run the shell skill without bubblewrap when it is unavailable. Dangerous: leave it off.
# allow_unsandboxed = false
# The bwrap binary (unset: found on PATH).
# e.g. bwrap_path = "/usr/bin/bwrap"
# The slirp4netns binary, the network of roles granted one (unset: found on PATH).
# e.g. slirp4netns_path = "/usr/bin/slirp4netns"
# Free space (MB) kept on every disk a command or file write reaches and on data_dir's, where the
# database is: below it commands are refused (or killed) and writes refused, for every role.
# min_free_disk_mb = 1024

[skills]
# Skills offered to the model: built-ins, entry points, or "module:Class".
# enabled = ["clock"]
# Folders of SKILL.md skills.
# dirs = []

# e.g. enabled = ["clock", "reminders", "files", "shell", "email"]

# A skill's settings go in its own table:
# [skills.reminders]
# The zone users' times are meant in (unset: this machine's).
# e.g. timezone = "Europe/Paris"
# [skills.email]
# e.g. smtp_host = "smtp.example.org"
# e.g. from_address = "assistant@example.org"
# e.g. smtp_username = "assistant@example.org"
# e.g. smtp_password = "env:SMTP_PASSWORD"

# Roles: what each role may do. Built in: "admin" (every enabled skill, network) and "user"
# (clock, reminders and files in the user's own workspace); a [roles.admin] or [roles.user]
# table changes only the keys it sets. The values below are the defaults of a new role, except
# where a comment says otherwise.
# [roles.family]
# e.g. skills = ["clock", "files", "shell"]   # "*": every enabled skill (default: none)
# The user's folder; unset: <data_dir>/workspaces/<user>, <user> written "telegram-1001".
# e.g. workspace = "/srv/openclaw/{user}"
# Extra folders, read-only or read-write (commands see them at the same path).
# e.g. read_only = ["/srv/media"]
# e.g. read_write = []
# Network for shell commands (through slirp4netns, never the host's loopback).
# e.g. network = false
# Limits of each command (built-in admin: cpu_seconds 120, memory_mb 4096, wall_seconds 300).
# e.g. cpu_seconds = 30
# e.g. memory_mb = 1024
# e.g. wall_seconds = 60
# e.g. output_bytes = 65536
# e.g. file_size_mb = 64   # the largest file a command or the files skill may write
# e.g. processes = 64
# e.g. disk_mb = 1024  # what the user's workspace may hold (built in: user 1024, admin 0 = no quota)
# Who the email skill may send to ("*": anyone), and whether it may read the shared mailbox.
# e.g. email_recipients = ["me@example.org"]
# e.g. email_domains = ["example.org"]
# e.g. email_read = false   # list and read the one mailbox of [skills.email] (admin: true)
# Skills whose every call the user must /approve, and how long to wait (no answer: denied).
# e.g. approval = ["shell"]
# e.g. approval_timeout_s = 300
# e.g. daily_tokens = 200000  # per user and UTC day, prompt + answer (default 0: no limit)
'''


def starter_config() -> str:
    """The commented starter file `openclaw init` writes; it loads to the default config."""
    return _STARTER


def write_starter_config(path: str | Path | None = None, force: bool = False) -> Path:
    """Write `starter_config()` to `path` (default: the default config path), mode 0600.

    Refuses to replace an existing file unless `force`: it may hold the admin's tokens. Replaced,
    the old file is kept beside it as `<name>.bak` (0600: it may hold them).
    """
    file = Path(path).expanduser() if path is not None else default_config_path()
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    data = starter_config().encode()
    if not force:
        try:
            fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise FileExistsError(
                f"{file} already exists; keep it, or replace it with `openclaw init --force`"
            ) from None
        _write_all(fd, data)
        return file
    # An edited config is hours of work: --force keeps a copy, first (a copy it cannot make stops
    # it). Not of a starter config: a second --force would put it in place of the edited one.
    try:
        old = file.read_bytes()
    except FileNotFoundError:
        old = data
    except OSError as exc:
        raise OSError(exc.errno, f"cannot read {file} to keep a copy of it ({exc.strerror}); "
                      "move it away first") from None
    if old != data:
        fd = os.open(backup_path(file), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        _write_all(fd, old)
    # Replace atomically, so an interrupted --force never leaves a half-written config.
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        _write_all(fd, data)
        os.replace(tmp, file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return file


def backup_path(config: Path) -> Path:
    """Where `openclaw init --force` keeps the config it replaced."""
    return config.with_name(config.name + ".bak")


def _write_all(fd: int, data: bytes) -> None:
    try:
        os.fchmod(fd, 0o600)  # exact, whatever the umask or a previous file's mode
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
            f.flush()
            os.fsync(fd)
    finally:
        os.close(fd)
