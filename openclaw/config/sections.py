"""The tables of the config file, one model each: what each key means, its default, its checks.

`[engine]` is in engine.py (the engine's own EngineConfig, or an OpenAI-compatible server's); the
root that holds these tables, and the checks across them, are in model.py.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)

from openclaw.config.fields import (
    LOCAL_USER,
    ConfigPath,
    Section,
    UserName,
    check_url,
    require_str,
    validate_path,
)
from openclaw.config.secrets import (
    Secret,
    base_dir,
    is_reference,
    mask_password,
    redact_settings,
    resolve_reference,
)

if TYPE_CHECKING:
    from sandbox.policy import Role

STORE_SCHEMES = ("sqlite+aiosqlite", "postgresql+asyncpg")
DEFAULT_SYSTEM_PROMPT = "You are OpenClaw, a helpful personal assistant."


class SamplingPreset(Section):
    """One purpose's sampling (`[agent.sampling.chat]`, `.tool_arguments`, `.summary`)."""

    temperature: float = Field(0.7, ge=0)
    """0 is greedy."""
    top_p: float = Field(0.95, gt=0, le=1)
    """Nucleus sampling: keep the smallest set of tokens with this total probability."""
    repetition_penalty: float = Field(1.0, gt=0, le=2)
    """Above 1, tokens already in the prompt or the reply become less likely: the guard against
    a small model repeating a sentence to the token cap. 1 is off."""
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    """Lowers a token's logit by this much per time it was already generated."""


class SamplingPresets(Section):
    """`[agent.sampling]`: the sampling of each kind of model call."""

    chat: SamplingPreset = Field(default_factory=lambda: SamplingPreset(
        temperature=0.0, top_p=1.0, repetition_penalty=1.1))
    """The replies of a turn (also `[agent] temperature` and `top_p`, which set its two). Greedy by
    default: sampled at 0.7, the embedded model copies the tool prompt's worked examples after its
    answer ("Example: User: ..."), and the agent eval is measured greedy."""
    tool_arguments: SamplingPreset = Field(
        default_factory=lambda: SamplingPreset(temperature=0.0, top_p=1.0))
    """Inside a tool call the engine constrains: greedy, and no penalty, which would keep the
    model from copying the user's words (a command, a path) into the arguments."""
    summary: SamplingPreset = Field(
        default_factory=lambda: SamplingPreset(temperature=0.0, top_p=1.0, repetition_penalty=1.1))
    """The summaries of older turns that no longer fit the context."""


class AgentConfig(Section):
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
    temperature: float = Field(0.0, ge=0)
    """Sampling temperature of replies; 0 is greedy (sampling.chat's, in short)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling: keep the smallest set of tokens with this total probability
    (sampling.chat's, in short)."""
    sampling: SamplingPresets = Field(default_factory=SamplingPresets)
    """Per purpose: chat, tool_arguments, summary."""
    tool_call_threshold: float = Field(0.06, ge=0, le=1)
    """The engine in this process: the first token of a reply chooses between calling a tool and
    answering, a call when the model gives `<tool_call>` at least this probability (a small model
    rarely opens it by itself; see docs/BENCHMARKS.md). 0: the model alone decides."""
    loop_repeats: int = Field(3, ge=0)
    """A reply that repeats the same sentence (or passage) this many times is ended there, and
    the user gets it without the repeats. 0 is off."""
    show_tools: Literal["brief", "off", "full"] = "brief"
    """What the chat shows of each tool call: "brief" a line ("🔧 shell: ls -la — exit 0"), "full"
    also the arguments and the first lines of the result, "off" nothing."""
    compaction_keep_messages: int = Field(8, ge=0)
    """The most recent messages, never compacted, so the model always sees the latest turns verbatim."""
    tool_timeout_s: float = Field(60.0, gt=0)
    """Seconds a tool call may run before it is stopped and reported to the model as an error."""
    memory_tokens: int | None = Field(None, ge=0)
    """Tokens of the user's memory a prompt may hold; None: a tenth of the prompt budget."""

    @model_validator(mode="after")
    def _chat_sampling(self) -> AgentConfig:
        """`temperature` and `top_p` are the chat preset's: the one place they are read."""
        chat = self.sampling.chat
        for key in ("temperature", "top_p"):
            if key in self.model_fields_set and key not in chat.model_fields_set:
                object.__setattr__(chat, key, getattr(self, key))
            object.__setattr__(self, key, getattr(chat, key))
        return self

    def conversation_tokens(self, max_model_len: int) -> int:
        """The tokens one conversation may hold (prompt and reply) on a model of max_model_len."""
        return min(self.context_tokens or max_model_len, max_model_len)


class StoreConfig(Section):
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
        if not context.get("read_store_url", True) and is_reference(require_str(value)):
            return value  # left unread, as written (load_config's store=False)
        url, _ = resolve_reference(require_str(value), info)
        scheme, sep, rest = url.partition("://")
        if not sep or scheme not in STORE_SCHEMES:
            raise ValueError(_store_scheme_hint(scheme if sep else ""))
        return _absolute_sqlite_url(url, info) if scheme == "sqlite+aiosqlite" else url

    @field_serializer("url")
    def _dump_url(self, url: str | None) -> str | None:
        return mask_password(url)

    def __repr_args__(self):  # type: ignore[override]
        yield "url", mask_password(self.url)


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
    return f"{prefix}{validate_path(path, info)}{sep}{query}"


class PairingConfig(Section):
    """`[access.pairing]`: how many pairing codes strangers get, so that a few of them asking
    again and again cannot keep everyone else out."""

    pending: int = Field(3, ge=1, le=100)
    """Codes waiting for the owner at once; a newcomer's replaces the code of whoever had the
    most today, the oldest first."""
    codes_per_user_per_day: int = Field(3, ge=1, le=100)
    """Codes one stranger gets in 24 hours (a code lives an hour); then they are refused."""
    codes_per_hour: int = Field(12, ge=1, le=1000)
    """Codes everyone gets together in an hour; then newcomers are refused."""


class AccessConfig(Section):
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
    pairing: PairingConfig = PairingConfig()
    """How many pairing codes strangers get (dm_policy = "pairing")."""

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


class AdminConfig(Section):
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


class ServeConfig(Section):
    """`[serve]`: the OpenAI-compatible API over the daemon's own engine (docs/serving.md); also
    the defaults of `openclaw serve`."""

    enabled: bool = False
    """Serve the API from the daemon, on the model it already loaded (the weights load once)."""
    host: str = "127.0.0.1"
    """Address to bind; anything but loopback needs an api_key."""
    port: int = Field(8000, ge=0, le=65535)
    """TCP port; 0 picks a free one (tests)."""
    api_key: Secret | None = Field(None, validate_default=True)
    """The key clients send as `Authorization: Bearer KEY`; "env:NAME" or "file:PATH". Unset: no
    key is asked, which only loopback allows."""
    served_model_name: str | None = None
    """The model's name in the API (`model` of requests, /v1/models); unset: the model's file or
    folder name."""
    max_connections: int = Field(512, ge=1, le=65536)
    """Connections at once; past it, half-sent ones are dropped (a flood), and at twice it new ones
    are refused. Streaming clients each hold one."""

    # host is declared before api_key so api_key's validator can see it.
    @field_validator("api_key")
    @classmethod
    def _key_beyond_loopback(cls, key: Secret | None, info: ValidationInfo) -> Secret | None:
        host = info.data.get("host")
        if key is None and host is not None and not _is_loopback(host):
            raise ValueError(f"required when serve.host ({host}) is not loopback: the API would "
                             'answer anyone who can reach it; e.g. api_key = "env:OPENCLAW_API_KEY"')
        return key

    @field_validator("served_model_name")
    @classmethod
    def _name(cls, name: str | None) -> str | None:
        if name is not None and not name.strip():
            raise ValueError("expected a non-empty name, e.g. \"smollm2\"")
        return name


def _require_token(token: Secret | None, info: ValidationInfo, section: str, env: str) -> Secret | None:
    if token is None and info.data.get("enabled"):
        raise ValueError(f'required when {section}.enabled = true, e.g. token = "env:{env}"')
    return token


class TelegramConfig(Section):
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
        return check_url(value, ("http", "https"))


class DiscordConfig(Section):
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
        return check_url(value, ("http", "https"))

    @field_validator("gateway_url")
    @classmethod
    def _ws(cls, value: str | None) -> str | None:
        return check_url(value, ("ws", "wss"))


class SandboxConfig(Section):
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


class SkillsConfig(Section):
    """`[skills]`: which skills exist, and `[skills.NAME]` tables with each skill's settings."""

    hidden_keys: ClassVar[frozenset[str]] = frozenset({"settings"})  # not a key of the file

    enabled: list[str] = ["clock"]
    """Skills offered to the model: built-in names, entry points (group "openclaw.skills") or
    "module:Class". Roles decide who may use each."""
    dirs: list[ConfigPath] = []
    """Folders of SKILL.md skills (OpenClaw format), offered by name and description."""
    python_paths: list[ConfigPath] = []
    """Folders added to the import path (after site-packages, so they shadow nothing installed)
    of the daemon and the CLI, where a "module:Class" skill in `enabled` may live."""
    settings: dict[str, dict[str, Any]] = {}
    """Each `[skills.NAME]` table, by NAME; checked by the skill itself."""

    @model_validator(mode="before")
    @classmethod
    def _collect_tables(cls, data: Any) -> Any:
        # In the file a skill's settings are `[skills.NAME]`, i.e. a table inside [skills]; any
        # other unknown key stays put so extra="forbid" reports it (`enabeld = [...]`).
        if not isinstance(data, dict):
            return data
        fixed = {k: v for k, v in data.items()
                 if k in ("enabled", "dirs", "python_paths") or not isinstance(v, dict)}
        tables = {k: v for k, v in data.items() if k not in fixed}
        return {**fixed, "settings": tables} if tables else fixed

    @model_serializer(mode="wrap")
    def _dump_as_file(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Dump in the file's shape, so a dump validates back to the same config.
        data = handler(self)
        settings = data.pop("settings", {})
        return {**data, **{name: redact_settings(table) for name, table in settings.items()}}

    def __repr_args__(self):  # type: ignore[override]
        yield "enabled", self.enabled
        yield "dirs", self.dirs
        yield "python_paths", self.python_paths
        yield "settings", {name: redact_settings(t) for name, t in self.settings.items()}


class RoleConfig(Section):
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
    approve_after_untrusted: bool = True
    """Once the conversation's prompt holds untrusted content (a file or mail read, a command's
    output, a SKILL.md skill's text), every call that may act (shell, files write/edit, email
    send, reminders add/cancel, any skill that does not declare itself read-only) waits for the
    user's /approve, whatever `approval` says; false: only `approval` decides."""
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
        return str(path if path.is_absolute() else base_dir(info) / path)

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

    def to_role(self, name: str, base: Role | None = None) -> Role:
        """The sandbox Role; for a built-in name, keys not given here keep `base`'s values."""
        from sandbox.policy import Role  # the sandbox costs ~0.1 s to import: only when used

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
                  "approval_timeout_s": self.approval_timeout_s, "daily_tokens": self.daily_tokens,
                  "approve_after_untrusted": self.approve_after_untrusted}
        for key, value in simple.items():
            if base is None or key in given:
                fields[key] = value
        return replace(role, name=name, **fields)
