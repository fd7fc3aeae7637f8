"""`openclaw skills list`, `skills show NAME` and `skills run NAME --as USER --args JSON`: what each
skill is, where it came from, what it takes and who may use it; and a run as any user through
exactly the policy, sandbox, approval and audit a model's call goes through (skills/executor.py),
printed as JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys

from engine.chat import example_arguments
from openclaw.config import CHANNELS, Config, default_config_path, load_config
from openclaw.gateway import access
from openclaw.skillset import configured_skills, executor_for, mcp_for, mcp_session
from openclaw.store.records import UserStatus, parse_user_key
from sandbox.policy import mcp_server_of
from skills import SkillRegistry
from skills.executor import ApprovalUnavailable
from skills.registry import installed_names


def add_commands(sub, common_sub) -> None:
    skills = common_sub(sub.add_parser("skills", help="installed skills; run one as a user")
                        .add_subparsers(dest="skills_cmd", required=True))
    skills.add_parser("list", help="each skill, its origin and the roles that may use it") \
        .set_defaults(func=cmd_skills_list)
    p = skills.add_parser("show", help="one skill: its description, arguments' JSON schema, roles "
                                       "and an example `skills run` line")
    p.add_argument("name")
    p.set_defaults(func=cmd_skills_show)
    p = skills.add_parser("run", help="run a skill as USER, as a model's call would (JSON out)")
    p.add_argument("name")
    p.add_argument("--as", dest="user", required=True, help='the user, e.g. "telegram:1001"')
    p.add_argument("--args", dest="arguments", default="{}", help="the arguments as a JSON object")
    p.add_argument("--chat", default="", help="the chat the call is made from (where a reminder is "
                                              'delivered): "telegram:-1001234567890" as `openclaw '
                                              "reminders` writes it, or the chat id alone")
    p.add_argument("--yes", action="store_true",
                   help="approve the call if the user's role needs approval (else asked on a terminal, "
                        "refused when not interactive)")
    p.set_defaults(func=cmd_skills_run)


def cmd_skills_list(args: argparse.Namespace) -> int:
    config = load_config(args.config, tokens=False)
    registry = with_mcp_tools(config, configured_skills(config, secrets=False))  # listed, never run
    policy = config.policy()
    for name in registry.names:
        skill = registry.get(name)
        roles = policy.roles_granting(name)
        approval = [r for r in roles if policy.roles[r].requires_approval(name)]
        print(f"{name}\n  {skill.description}\n  from: {registry.origin(name)}\n"
              f"  permissions: {', '.join(sorted(skill.permissions)) or 'none'}\n"
              f"  roles: {', '.join(roles) or 'none'}"
              + (f" (approval needed: {', '.join(approval)})" if approval else ""))
    for line in (line for line in registry.skipped if line.startswith("mcp:")):
        print(line)
    if not registry.names:
        print("no skills enabled; add them to [skills] enabled")
    return 0


def with_mcp_tools(config: Config, registry: SkillRegistry) -> SkillRegistry:
    """`registry` with the MCP servers' tools: each server started once to list them."""
    async def look() -> None:
        async with mcp_session(config, registry):
            pass

    if config.mcp.servers:
        asyncio.run(look())
    return registry


def cmd_skills_show(args: argparse.Namespace) -> int:
    config = load_config(args.config, tokens=False)
    registry = configured_skills(config, secrets=False)
    if mcp_server_of(args.name):
        registry = with_mcp_tools(config, registry)
    skill = registry.get(args.name)
    if skill is None:
        refusal = _cannot_run(config, registry, args.name, {}, "") or (
            f"no skill named {args.name!r}; enabled: {', '.join(registry.names) or 'none'}")
        print(f"openclaw skills show: {refusal}", file=sys.stderr)
        return 1
    policy = config.policy()
    roles = policy.roles_granting(args.name)
    approval = [r for r in roles if policy.roles[r].requires_approval(args.name)]
    example = json.dumps(example_arguments(skill.parameters), ensure_ascii=False)
    print(f"{args.name}: {skill.description}\nfrom: {registry.origin(args.name)}\n"
          f"permissions: {', '.join(sorted(skill.permissions)) or 'none'}\n"
          f"roles: {', '.join(roles) or 'none'}"
          + (f" (approval needed: {', '.join(approval)})" if approval else "")
          + f"\narguments (JSON schema):\n{json.dumps(skill.parameters, indent=2, ensure_ascii=False)}"
          f"\nexample:\n  openclaw skills run {shlex.quote(args.name)} --as USER --args "
          f"{shlex.quote(example)}")
    return 0


def cmd_skills_run(args: argparse.Namespace) -> int:
    config = load_config(args.config, tokens=False)
    try:
        user = access.check_user(args.user)
        chat_id = _chat_id(user, args.chat)
        arguments = json.loads(args.arguments)
    except json.JSONDecodeError as exc:
        print(f"openclaw skills run: --args is not JSON: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"openclaw skills run: {exc}", file=sys.stderr)
        return 2
    # Only this skill's secrets: the admin's shell may lack the others' (the service's unit holds
    # them), and a test of the clock should not need the mail password.
    registry = configured_skills(config, secrets={args.name})
    refusal = _cannot_run(config, registry, args.name, arguments, chat_id)
    if refusal:
        print(f"openclaw skills run: {refusal}", file=sys.stderr)
        return 2
    # Before the workspace below it: the data folder is the owner's alone (0700), whoever makes it.
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    async def approve(_principal, skill: str, summary: str) -> bool:
        if args.yes:
            return True
        if not sys.stdin.isatty():
            print(f"{skill} needs approval for {user}; not interactive, so refused (use --yes)",
                  file=sys.stderr)
            raise ApprovalUnavailable("`openclaw skills run` has no terminal to ask on; --yes "
                                      "approves")
        answer = await asyncio.to_thread(input, f"Approval needed ({skill}): {summary}\nAllow? [y/N] ")
        return answer.strip().lower() in ("y", "yes")

    async def run():
        from openclaw.reminders import Reminders
        from openclaw.store import Store
        from openclaw.store.mcp_pins import McpPins

        store = await Store.open(config.store.url)
        try:
            known = await store.get_user(*parse_user_key(user))
            # What the daemon would let them do: a test run for someone it does not answer
            # would show the admin results that user can never get.
            codes = [c.code for c in await store.list_pairing_codes() if c.user == user]
            why_not = _not_admitted(config, user, known and known.status, codes[-1] if codes else None)
            if why_not:
                print(f"openclaw skills run: {why_not}", file=sys.stderr)
                return None
            # Only now: it creates their workspace. The role the daemon would give them: the
            # config's, else the store's (`pairing approve --role`).
            policy = config.policy()
            principal = policy.principal(user, access.role_of(config, user, known, policy.roles))
            # A reminder added here is delivered by the running daemon, which polls every minute.
            executor = executor_for(config, registry, store.add_audit, Reminders(store))
            # An MCP tool: its server started here (its tools listed and reviewed, as the daemon's).
            mcp = mcp_server_of(args.name) and principal.may_use(args.name)
            servers = await mcp_for(config, registry, McpPins(store)) if mcp else None
            try:
                return principal, await executor.call(args.name, arguments, principal,
                                                      chat_id=chat_id, approver=approve)
            finally:
                if servers is not None:
                    await servers.close()
        finally:
            await store.close()

    ran = asyncio.run(run())
    if ran is None:
        return 2
    principal, outcome = ran
    print(json.dumps({"skill": args.name, "user": user, "role": principal.role.name,
                      "decision": outcome.decision, "ok": outcome.ok, "output": outcome.text},
                     ensure_ascii=False, indent=2))
    return 0 if outcome.ok else 1


def _chat_id(user: str, chat: str) -> str:
    """The chat id in `chat`, written as the reminders commands write a chat ("telegram:-100123")
    or as the id alone. Filed under "telegram:telegram:-100123", a reminder would never arrive."""
    channel, sep, chat_id = chat.partition(":")
    if not sep or channel not in CHANNELS:
        return chat
    user_channel = parse_user_key(user)[0]
    if channel != user_channel:
        raise ValueError(f"--chat {chat} is a {channel} chat, and {user} is on {user_channel}: a "
                         f"call is made from one of its user's own chats")
    if not chat_id:
        raise ValueError(f'--chat {chat} names no chat: write "{channel}:CHAT_ID", or the id alone')
    return chat_id


def _cannot_run(config: Config, registry: SkillRegistry, name: str, arguments: object,
                chat: str) -> str | None:
    """What keeps this call from running whoever makes it, said for the admin at the command line
    (the model, which cannot change either, is told otherwise); None when nothing does."""
    if name not in registry.names and name in installed_names():
        return (f"{name} is not enabled: add it to [skills] enabled in "
                f"{config.source or default_config_path()}")
    if name == "reminders" and not chat and isinstance(arguments, dict) and arguments.get("action") == "add":
        return "a reminder needs --chat ID: the chat it is delivered to (e.g. the Telegram chat id)"
    return None


def _not_admitted(config: Config, user: str, stored: UserStatus | None,
                  code: str | None = None) -> str | None:
    """Why the daemon would not answer `user` (the config's lists, then the store's status), and
    how to admit them; None when it would. `code`: their live pairing code, if they have one."""
    now = access.status(config, user, stored)
    if now is UserStatus.ALLOWED:
        return None
    if now is UserStatus.BLOCKED:
        if access.listed_in(config, user) == "blocked":
            return f"{user} is in access.blocked of the config; take them out of it to admit them"
        return (f"{user} is blocked (openclaw users block, or a denied pairing request); "
                f"`openclaw users allow {user}` admits them")
    if now is UserStatus.PENDING and code:
        return (f"{user} is not admitted yet (pending): `openclaw pairing approve {code}` (their "
                f"pairing code) or `openclaw users allow {user}` admits them")
    if now is UserStatus.PENDING:
        return (f"{user} is not admitted yet (pending, no pairing code): they get a code when they "
                f"write again, or `openclaw users allow {user}` admits them now")
    return (f"{user} is not a known user (never paired nor allowed): `openclaw users allow {user}` "
            "admits them")
