"""Who may talk to the agent: `[access]` in the config, then the status the store keeps.

The config's lists decide for the users they name, every time, and are never copied into the
store: a user taken out of `admins` or `allow` is no longer let in by it. Everyone else has the
status pairing, `dm_policy = "open"` or `openclaw users ...` gave them in the store."""

from __future__ import annotations

from openclaw.config import LOCAL_USER, Config, _check_user
from openclaw.store.records import UserStatus


def check_user(name: str) -> str:
    """A user named on the command line, as the config names them ("channel:id"), and one who can
    exist (`terminal:local` is the terminal's only user). A ValueError says what is wrong, in one
    line."""
    return _check_user(name.strip())


def listed_in(config: Config, user: str) -> str:
    """What in the config decides for `user`: "console" (this machine's own terminal),
    "blocked", "admins", "allow", or "" when nothing does."""
    if user == LOCAL_USER:
        return "console"
    access = config.access
    return next((name for name in ("blocked", "admins", "allow") if user in getattr(access, name)), "")


def named_users(config: Config) -> set[str]:
    """Everyone the config decides for: the console and the users `[access]` lists."""
    access = config.access
    return {LOCAL_USER, *access.admins, *access.allow, *access.blocked}


def config_names(config: Config) -> set[str]:
    """Every user the config names: named_users, and those `[access] roles` gives a role (what
    store retention never deletes)."""
    return named_users(config) | set(config.access.roles)


def is_owner(config: Config, user: str) -> bool:
    """An admin of `[access]`, or this machine's console: who answers pairing requests and sees
    what everyone uses."""
    return listed_in(config, user) in ("admins", "console")


def config_status(config: Config, user: str) -> UserStatus | None:
    """ALLOWED or BLOCKED when the config decides for `user`; None when the store does."""
    listed = listed_in(config, user)
    if not listed:
        return None
    return UserStatus.BLOCKED if listed == "blocked" else UserStatus.ALLOWED


def status(config: Config, user: str, stored: UserStatus | None) -> UserStatus | None:
    """The status that holds for `user` now, given the store's (None: not in the store)."""
    return config_status(config, user) or stored
