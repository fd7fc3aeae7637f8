"""`openclaw doctor`: what is wrong with this install and how to fix it. Each check tries what
`openclaw run` would do (load the config and the model, open the database, bind the admin port,
run a sandboxed command, connect with each token) and says ✓ or ✗ with the fix, or ⚠ for what
works with a gap the admin should close."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from openclaw import kv_report
from openclaw.channels import configured_connectors, disabled_with_token
from openclaw.cli.common import with_later_problems
from openclaw.cli.doctor_mcp import check_mcp_servers
from openclaw.config import Config, ConfigError, load_config, model_file_problems
from openclaw.datadir import lock_holder

# A check's mark: True (✓), False (✗: doctor exits 1) or WARN (⚠: it works, degraded; the exit
# status stays 0, since `run` would start).
WARN: Literal["warn"] = "warn"
Mark = bool | Literal["warn"]
MARKS: dict[Mark, str] = {True: "✓", False: "✗", WARN: "⚠"}


def add_commands(sub, common_sub) -> None:
    p = sub.add_parser("doctor", help="check config, database, model, sandbox, tokens")
    p.add_argument("--skip-model", action="store_true",
                   help="do not load the model (nor ask the model's server)")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    checks: list[tuple[Mark, str, str]] = []  # (mark, what, how to fix)
    try:
        config = load_config(args.config)
        checks.append((True, f"config: {config.source or 'none (defaults)'}", ""))
    except ConfigError as exc:
        if exc.partial is not None:
            exc = with_later_problems(exc)
        print(f"✗ config\n{exc}")
        return 1
    checks += _check_secrets_exposed(config)
    checks += asyncio.run(_check_database(config))
    if not args.skip_model:
        checks += _check_model(config)
    else:  # not loaded, but a path that holds no model is seen without loading it
        checks += [(False, p, "check engine.model (a HF folder or a .gguf file)")
                   for p in model_file_problems(config.engine)]
    checks += _check_admin_port(config)
    checks.append(_check_skills(config))
    checks += _check_skipped_skills(config)
    checks += check_mcp_servers(config)
    checks.append(_check_sandbox(config))
    checks.append(_check_disk_reserve(config))
    checks += _check_sandbox_network(config)
    checks += _check_command_memory(config)
    checks += _check_granted_folders(config)
    checks += _check_shared_workspaces(config)
    checks += _check_connectors(config)
    for mark, what, fix in checks:
        print(f"{MARKS[mark]} {what}" + ("" if mark is True or not fix else f"\n    fix: {fix}"))
    return 0 if all(mark is not False for mark, _, _ in checks) else 1


TOKEN_CHECK_S = 10.0  # how long doctor waits for Telegram's or Discord's answer to a token
_NETWORK_FIX = "check this machine's network, DNS and firewall"


def _check_secrets_exposed(config: Config) -> list[tuple[bool, str, str]]:
    """A config file other users may read must not hold a secret written in it ("env:NAME" and
    "file:PATH" references are fine). Names the keys, never their values."""
    from openclaw.config import exposed_secrets

    file = config.source
    held = exposed_secrets(config, file) if file is not None else []
    if not held:
        return []
    return [(False, f"config: other users can read it, and it holds secrets ({', '.join(held)})",
             f"chmod 600 {file}")]


def _check_connectors(config: Config) -> list[tuple[Mark, str, str]]:
    """Each enabled connector's token, tried as `run` connects with it; first, what `run` refuses
    before connecting (a missing token, an unsupported setting)."""
    enabled = [name for name in ("telegram", "discord") if getattr(config, name).enabled]
    off: list[tuple[Mark, str, str]] = [(WARN, what, fix) for what, fix in disabled_with_token(config)]
    missing = [(False, f"{name}: no token set", f"set {name}.token (e.g. \"env:{name.upper()}_BOT_TOKEN\")")
               for name in enabled if getattr(config, name).token is None]
    if missing:
        return off + missing
    try:
        configured_connectors(config)
    except ConfigError as exc:
        return off + [(False, f"connectors: {'; '.join(exc.problems)}", "fix it in the config")]
    checks = {"telegram": _check_telegram_token, "discord": _check_discord_token}

    async def check_all() -> list[tuple[bool, str, str]]:
        return list(await asyncio.gather(*(checks[name](getattr(config, name)) for name in enabled)))

    return off + (asyncio.run(check_all()) if enabled else [])


async def _check_telegram_token(section) -> tuple[bool, str, str]:
    """getMe, through python-telegram-bot as the connector calls it (HTTPS_PROXY is honoured)."""
    from telegram import Bot
    from telegram.error import BadRequest, InvalidToken, NetworkError, TelegramError

    from connectors.telegram import TELEGRAM_API, keep_token_out_of_logs

    token = section.token.get()
    host = _host(section.base_url or TELEGRAM_API)
    keep_token_out_of_logs()  # with -v, httpx would log each URL, and a Bot API URL holds the token
    bot = Bot(token, **({"base_url": section.base_url} if section.base_url else {}))
    # With a self-hosted server named, the likely fault is its URL, not the network or the token.
    own_server = section.base_url and (
        f"check telegram.base_url ({section.base_url}): a self-hosted Bot API server's URL ending in "
        '"/bot", e.g. "http://127.0.0.1:8081/bot"; or remove it to use Telegram\'s own')
    try:
        async with asyncio.timeout(TOKEN_CHECK_S):
            await bot.initialize()  # getMe
    except InvalidToken as exc:  # its own message repeats the token; the server's is its cause
        why = getattr(exc.__cause__, "message", "rejected")
        token_fix = "check telegram.token (from @BotFather)"
        # Not a Bot API there (a wrong path answers 404): every token is refused alike.
        return False, f"telegram: the token was refused ({why})", \
            token_fix if why == "Unauthorized" else own_server or token_fix
    except BadRequest as exc:  # a NetworkError to PTB, but an answer
        return False, f"telegram: {host} answered: {_redact(exc, token)}", own_server or "try again later"
    except (NetworkError, TimeoutError) as exc:  # TimedOut, a refused connection, a 5xx
        return (False, f"telegram: {host} not reachable: {_redact(exc, token)}",
                f"{own_server}; if it is right, {_NETWORK_FIX}" if own_server else
                f"{_NETWORK_FIX}; behind a proxy, set HTTPS_PROXY for openclaw")
    except TelegramError as exc:  # e.g. 429
        return False, f"telegram: {host} answered: {_redact(exc, token)}", "try again later"
    finally:
        await bot.shutdown()
    return True, f"telegram: token works (bot @{bot.username})", ""


async def _check_discord_token(section) -> tuple[bool, str, str]:
    """GET /users/@me, what discord.py's login sends (it uses no proxy, and neither does this)."""
    import aiohttp
    import discord

    token = section.token.get().strip()  # as discord.py's login does
    base = (section.api_base or discord.http.Route.BASE).rstrip("/")
    host = _host(base)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TOKEN_CHECK_S)) as http, \
                http.get(f"{base}/users/@me", headers={"Authorization": f"Bot {token}"}) as answer:
            me = await answer.json(content_type=None) if answer.status == 200 else None
    except (aiohttp.ClientError, TimeoutError) as exc:
        return False, f"discord: {host} not reachable: {_redact(exc, token)}", _NETWORK_FIX
    if answer.status == 401:
        return (False, f"discord: the token was refused ({answer.reason})",
                "check discord.token (Bot > Token in the Discord developer portal)")
    if me is None:
        return False, f"discord: {host} answered {answer.status} {answer.reason}", "try again later"
    return True, f"discord: token works (bot @{me.get('username')})", ""


def _host(url: str) -> str:
    parts = urlsplit(url)
    return parts.hostname + (f":{parts.port}" if parts.port else "")


def _redact(exc: BaseException, token: str) -> str:
    """What went wrong in a line, never with the token in it."""
    text = str(exc) or (f"no answer in {TOKEN_CHECK_S:.0f} s" if isinstance(exc, TimeoutError)
                        else type(exc).__name__)
    return text.replace(token, "***")


def _check_admin_port(config: Config) -> list[tuple[bool, str, str]]:
    """`run` refuses to start with its admin port taken (and a chat goes on without it)."""
    from openclaw.admin import port_in_use

    host, port = config.admin.host, config.admin.port
    if not config.admin.enabled or port == 0:
        return []
    fix = "stop what holds it, or set [admin] port = N (a free one) or [admin] enabled = false"
    try:
        taken = port_in_use(host, port)
    except OSError as exc:
        return [(False, f"admin port: cannot bind {port} on {host}: {exc}", "fix [admin] host")]
    if taken and _our_daemon_serves(config):
        return [(True, f"admin port: {port} on {host} is served by the daemon running here", "")]
    if taken:
        return [(False, f"admin port: {port} on {host} is in use (another daemon? see "
                        "`ss -ltnp`)", fix)]
    return [(True, f"admin port: {port} on {host} is free", "")]


def _our_daemon_serves(config: Config) -> bool:
    """Whether the daemon holding this data_dir is the one answering on the admin port."""
    return _our_daemon_health(config) is not None


def _our_daemon_health(config: Config) -> dict | None:
    """/healthz of the daemon holding this data_dir, when it is the one answering on the admin
    port; None otherwise."""
    import json
    import urllib.error
    import urllib.request

    if not config.admin.enabled or config.admin.port == 0:
        return None
    try:
        holder = lock_holder(config.data_dir)
        if holder is None:
            return None
        host = f"[{config.admin.host}]" if ":" in config.admin.host else config.admin.host
        url = f"http://{host}:{config.admin.port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310 -- loopback http
                health = json.loads(answer.read())
        except urllib.error.HTTPError as unhealthy:  # 503, starting or a connector down: still ours
            health = json.loads(unhealthy.read())
    except (OSError, ValueError):
        return None
    return health if isinstance(health, dict) and health.get("pid") == holder.pid else None


def _check_skills(config: Config) -> tuple[bool, str, str]:
    from openclaw.skillset import configured_skills

    try:
        registry = configured_skills(config)
    except ConfigError as exc:
        return False, f"skills: {'; '.join(exc.problems)}", "fix [skills] / [roles] in the config"
    return True, f"skills: {', '.join(registry.names) or 'none'}", ""


def _check_skipped_skills(config: Config) -> list[tuple[Mark, str, str]]:
    """SKILL.md skills left out (broken front matter, a program or variable they require missing
    here): ⚠, one line each saying why; the daemon starts without them."""
    from openclaw.skillset import configured_skills

    try:
        registry = configured_skills(config, secrets=False)
    except ConfigError:
        return []  # the skills check says why
    return [(WARN, f"skill {line}", "fix the SKILL.md, or install what it needs, then "
             "`openclaw reload`") for line in registry.skipped]


def _check_sandbox(config: Config) -> tuple[Mark, str, str]:
    """✗ when commands cannot run; ⚠ when they run with a layer missing (no sandbox at all under
    allow_unsandboxed, no seccomp filter, /tmp unsized by an old bubblewrap: `what` names it)."""
    from openclaw.skillset import sandbox_for
    from sandbox.bwrap import FIX_HINT, isolation_available

    sandbox = sandbox_for(config)
    ok, what, whole = sandbox.isolation()
    if ok and not whole:
        unsandboxed = not isolation_available(sandbox.bwrap_path)[0]
        return WARN, f"sandbox isolation: {what}", FIX_HINT if unsandboxed else ""
    return ok, f"sandbox isolation: {what}", FIX_HINT


def _check_disk_reserve(config: Config) -> tuple[Mark, str, str]:
    """The database and the workspaces live on data_dir's filesystem. Under [sandbox]
    min_free_disk_mb there, every user's commands and writes are refused: the reserve is what keeps
    the store writable, and only freeing space lets them work again."""
    from sandbox.disk import free_bytes, megabytes

    folder = _nearest_existing(config.data_dir)
    reserve = config.sandbox.min_free_disk_mb << 20
    try:
        free = free_bytes(folder)
    except OSError as exc:
        return False, f"disk: cannot read the free space of {folder}: {exc}", "check data_dir"
    what = f"disk: {megabytes(free)} free on data_dir's filesystem ({folder})"
    if not reserve:
        return True, f"{what}; no reserve ([sandbox] min_free_disk_mb = 0)", ""
    if free < reserve:
        return (WARN, f"{what}, under the {megabytes(reserve)} reserve: every user's commands are "
                      "refused, and file writes to that disk",
                "free space on that disk, or lower [sandbox] min_free_disk_mb (0: no reserve)")
    return True, f"{what}; the reserve is {megabytes(reserve)}", ""


def _check_sandbox_network(config: Config) -> list[tuple[bool, str, str]]:
    """Roles granted network run commands behind slirp4netns (sandbox/network.py), and are refused
    without it: try it once, when some role may both run commands and use the network."""
    from openclaw.skillset import sandbox_for
    from sandbox.bwrap import isolation_available

    granted = config.policy().roles
    roles = [name for name in _command_roles(config) if granted[name].network]
    sandbox = sandbox_for(config)
    if not roles or not isolation_available(sandbox.bwrap_path)[0]:
        return []  # no such role, or no sandbox at all: the isolation check says so
    ok, what = asyncio.run(sandbox.network())
    return [(ok, f"sandbox network for roles {', '.join(roles)}: {what}",
             "apt-get install slirp4netns (what failed is said above), or set network = false "
             "on these roles")]


def _check_command_memory(config: Config) -> list[tuple[Mark, str, str]]:
    """Where some role may run commands: whether their memory is bounded as a whole (a cgroup
    per command) or per process only (⚠: memfds, SysV shared memory and many processes each
    under RLIMIT_AS could still run the host out of memory). The running daemon's answer when
    there is one: on cgroup v2 its cgroup, delegated by its unit, is not this shell's."""
    from sandbox import cgroups

    if not _command_roles(config):
        return []
    health = _our_daemon_health(config)
    if health is not None and "command_memory" in health:
        what, whose = health["command_memory"], "the running daemon"
        whole = what.startswith("all of")
    else:
        found = cgroups.probe()
        what, whose, whole = cgroups.describe(found), "a daemon started here", found[0] is not None
    fix = ("run the daemon as the service (`openclaw service install`: Delegate=memory), or as "
           "root where the cgroup v1 memory controller is mounted")
    return [(True if whole else WARN, f"sandbox memory ({whose}): {what}", "" if whole else fix)]


def _command_roles(config: Config) -> list[str]:
    """The roles that may run commands (a skill with the "exec" permission)."""
    from openclaw.skillset import configured_skills

    try:
        registry = configured_skills(config)
    except ConfigError:
        return []  # the skills check says why
    runners = [name for name in registry.names if "exec" in registry.get(name).permissions]
    return [name for name, role in config.policy().roles.items()
            if any(role.grants(skill) for skill in runners)]


def _check_granted_folders(config: Config) -> list[tuple[bool, str, str]]:
    """Each folder a role grants must exist (the sandbox cannot bind a missing one), and as root
    its users act with their own sandbox uid there, so a shared writable folder must let them."""
    checks = []
    for name, role in config.roles.items():
        for key in ("read_only", "read_write"):
            for index, path in enumerate(getattr(role, key)):
                where = f"roles.{name}.{key}[{index}] {path}"
                if not path.is_dir():
                    checks.append((False, f"{where}: no such folder",
                                   "create it, or remove it from the role"))
                elif key == "read_write" and os.geteuid() == 0 and not _others_may_write(path):
                    checks.append((False, f"{where}: users cannot write there (as root, each "
                                   "user's commands and files run as a uid of their own)",
                                   f"e.g. chmod 1777 {path}, or an ACL for the uids `openclaw users` "
                                   "shows"))
    return checks


def _check_shared_workspaces(config: Config) -> list[tuple[bool, str, str]]:
    """A folder granted above where a role keeps its users' workspaces ("/home/{user}/oc" under a
    granted "/home") hands every one of those workspaces to the grantee's users. The config allows
    it (an admin's role may be meant to see them all); the admin should know. (Folders over
    data_dir, where the default workspaces are, are refused when the config loads.)"""
    checks = []
    for owner, kept in config.roles.items():
        if not kept.workspace:
            continue  # the default, under data_dir (a workspace always holds "{user}")
        template = Path(kept.workspace).expanduser()
        root = Path(*template.parts[:next(i for i, part in enumerate(template.parts)
                                          if "{user}" in part)])
        for name, role in config.roles.items():
            for key in ("read_only", "read_write"):
                for index, path in enumerate(getattr(role, key)):
                    if Path(os.path.realpath(root)).is_relative_to(os.path.realpath(path)):
                        verb = "read" if key == "read_only" else "read and change"
                        checks.append((False, f"roles.{name}.{key}[{index}] {path} holds the "
                                       f"workspace of every user of role {owner} ({kept.workspace}): "
                                       f"users of role {name} can {verb} them all",
                                       "grant a folder beside those workspaces, not above them, or "
                                       f"move roles.{owner}.workspace elsewhere"))
    return checks


def _others_may_write(path) -> bool:
    try:
        has_acl = "system.posix_acl_access" in os.listxattr(path)
    except OSError:
        has_acl = False
    return has_acl or bool(path.stat().st_mode & 0o002)


async def _check_database(config: Config) -> list[tuple[bool, str, str]]:
    """Opens the database as `run` does, but changes nothing: a check must not. A database (or
    data folder) not there yet is what `run` creates; a schema behind this version's is what it
    upgrades."""
    from openclaw.store import Store, head_revision, known_revisions
    from openclaw.store.engine import normalize_url, sqlite_file

    fix = "check store.url and that the data folder is writable"
    try:
        path = sqlite_file(normalize_url(config.store.url))
    except ValueError as exc:
        return [(False, f"database: {exc}", fix)]
    if path is not None and not path.exists():
        nearest = _nearest_existing(path.parent)
        if not os.access(nearest, os.W_OK | os.X_OK):
            return [(False, f"database: {path} cannot be created: {nearest} is not writable", fix)]
        return [(True, f"database: {path} does not exist yet; will be created at first start", ""),
                _check_sandbox_uids(config, [])]
    head = head_revision()
    try:
        store = await Store.open(config.store.url, migrate_schema=False)
        try:
            revision = await store.schema_revision()
            # An older schema may lack what list_users reads: its users are counted once upgraded.
            users = [u.key for u in await store.list_users()] if revision == head else []
        finally:
            await store.close()
    except Exception as exc:
        return [(False, f"database: {exc}", fix)]
    if revision == head:
        return [(True, f"database: schema {revision}", ""), _check_sandbox_uids(config, users)]
    if revision is not None and revision not in known_revisions():
        return [(False, f"database: schema {revision}, which this openclaw does not know (a newer "
                        "version made it)", "upgrade openclaw, or restore a backup made by this version")]
    return [(True, f"database: schema {revision or 'none yet'}; upgraded to {head} at the next start",
             ""), _check_sandbox_uids(config, users)]


def _nearest_existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def _check_sandbox_uids(config: Config, stored: list[str]) -> tuple[bool, str, str]:
    """Each user's commands and files run as a uid derived from their name (sandbox_uid). Two
    users on one uid still see only their own workspace (each sandbox binds only its own), but
    share a process limit and may change each other's files in a folder granted to both. Unlikely
    (1 in 10^8 per pair), so checked here, over everyone the store and config know."""
    from sandbox.policy import sandbox_uid

    users = sorted(set(stored) | {u for name in ("admins", "allow") for u in getattr(config.access, name)})
    by_uid: dict[int, list[str]] = {}
    for user in users:
        by_uid.setdefault(sandbox_uid(user), []).append(user)
    shared = [f"{uid}: {', '.join(names)}" for uid, names in by_uid.items() if len(names) > 1]
    if shared:
        return (False, f"sandbox uids shared by users ({'; '.join(shared)})",
                "they share a process limit and may change each other's files in a folder granted "
                "to both: keep such folders out of their roles")
    return True, f"sandbox uids: {len(users)} user(s), each on a uid of its own", ""


def _check_model(config: Config) -> list[tuple[Mark, str, str]]:
    """The local engine: loaded, and a few tokens generated. A server: what `run` needs of it
    (openclaw/backends/probe.py)."""
    from openclaw.config import OpenAIEngineConfig

    if isinstance(config.engine, OpenAIEngineConfig):
        from openclaw.backends.probe import check_server

        return [*asyncio.run(check_server(config.engine)), (True, f"KV cache: {kv_report.NOT_KNOWN}", "")]
    try:
        from engine import LLM

        llm = LLM(config.engine, kv_cache_gib=0.05)  # not the configured pool: a daemon may hold it
        out = llm.generate("Hello", None)[0]
        return [(True, f"model: loaded on {llm.engine.device}, generated {len(out.token_ids)} "
                       "tokens", ""), _check_kv_budget(config, llm.engine)]
    except Exception as exc:
        return [(False, f"model: {exc}", "check engine.model (a HF folder or a .gguf file)")]


def _check_kv_budget(config: Config, engine) -> tuple[Mark, str, str]:
    """The pool `run` would allocate with this config (engine/kv_budget.py), and whether
    max_num_seqs conversations of the configured context fit in it."""
    from engine.kv_budget import plan

    budget = plan(engine.model_config, config.engine, engine.device.type)
    context = config.agent.conversation_tokens(engine.max_model_len)
    what = f"KV cache: {kv_report.pool_text(budget)}; {kv_report.fit_text(budget, context)}"
    found = kv_report.overcommit(budget, config.engine.max_num_seqs, context)
    return (True, what, "") if found is None else (WARN, f"{what}; {found[0]}", found[1])
