"""Who may talk to the agent, and as whom: `[access]` in the config, then the status the store
keeps. `Access` admits each message (a stranger gets a pairing code), checks again that a user
admitted earlier still may, and holds the config in effect, which a reload swaps.

The config's lists decide for the users they name, every time, and are never copied into the
store: a user taken out of `admins` or `allow` is no longer let in by it. Everyone else has the
status pairing, `dm_policy = "open"` or `openclaw users ...` gave them in the store."""

from __future__ import annotations

import logging
from collections.abc import Collection

from openclaw.config import LOCAL_USER, Config, validate_user
from openclaw.gateway.approvals import Approvals
from openclaw.gateway.contract import InboundMessage, literal_block
from openclaw.gateway.outbox import Outbox
from openclaw.store import (
    PairingLimits,
    PairingRefusal,
    PairingRefusalReason,
    Store,
    UnknownUserError,
    User,
)
from openclaw.store.records import UserStatus, parse_user_key
from sandbox.policy import Policy, Principal, Role
from skills.base import visible

log = logging.getLogger(__name__)


def check_user(name: str) -> str:
    """A user named on the command line, as the config names them ("channel:id"), and one who can
    exist (`terminal:local` is the terminal's only user). A ValueError says what is wrong, in one
    line."""
    return validate_user(name.strip())


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


def is_owner(config: Config, user: str, stored: User | None = None) -> bool:
    """An admin of `[access]`, or this machine's console: who answers pairing requests and sees
    what everyone uses. Or one the store made an owner (`pairing approve --admin`), unless the
    config names them: its lists win."""
    if user in config_names(config):
        return listed_in(config, user) in ("admins", "console")
    return stored is not None and stored.admin


def role_of(config: Config, user: str, stored: User | None = None,
            defined: Collection[str] | None = None) -> str:
    """The role `user` acts with: the config's (`[access] roles`, admins, the console) for the
    users it names; else the one the store gives them (`pairing approve --role`, or "admin" for
    `--admin`) while the config defines it (`defined`: the policy's roles); else "user"."""
    if user in config_names(config):
        return config.user_role(user)
    if stored is not None and stored.role:
        if stored.role in (defined if defined is not None else config.policy().roles):
            return stored.role
        log.warning("%s has the role %r in the store, which the config no longer defines: they "
                    "act as \"user\"", user, stored.role)
    return "admin" if stored is not None and stored.admin else "user"


def config_status(config: Config, user: str) -> UserStatus | None:
    """ALLOWED or BLOCKED when the config decides for `user`; None when the store does."""
    listed = listed_in(config, user)
    if not listed:
        return None
    return UserStatus.BLOCKED if listed == "blocked" else UserStatus.ALLOWED


def pairing_limits(config: Config) -> PairingLimits:
    """How many pairing codes strangers get, as `[access.pairing]` says."""
    pairing = config.access.pairing
    return PairingLimits(pending=pairing.pending, per_user=pairing.codes_per_user_per_day,
                         overall=pairing.codes_per_hour)


# Why a stranger got no code, and the setting that decides it.
REFUSED_BECAUSE = {
    PairingRefusalReason.USER_RATE: "had their codes for the day (access.pairing.codes_per_user_per_day)",
    PairingRefusalReason.OVERALL_RATE: "the hour's codes were given out (access.pairing.codes_per_hour)",
}
REFUSED_HEADING = ("Refused lately (asked for a code, got none; `openclaw users allow USER` "
                   "admits one):")


def refusal_line(refusal: PairingRefusal) -> str:
    """One stranger's refused requests, as `openclaw pairing list` and /pairing show them."""
    r = refusal
    times = f"{r.count} time{'s' if r.count != 1 else ''}"
    return (f"{r.user}  {visible(r.display_name or '')}  on {r.channel}, {times}, "
            f"{r.first_at:%Y-%m-%d %H:%M} to {r.last_at:%Y-%m-%d %H:%M} UTC: {REFUSED_BECAUSE[r.reason]}")


def status(config: Config, user: str, stored: UserStatus | None) -> UserStatus | None:
    """The status that holds for `user` now, given the store's (None: not in the store)."""
    return config_status(config, user) or stored


class Access:
    """Admission and the still-allowed checks, under the config and policy in effect now: every
    part of the gateway reads them here, so a reload applies everywhere at once."""

    def __init__(self, config: Config, policy: Policy, store: Store, approvals: Approvals,
                 outbox: Outbox) -> None:
        self.config, self.policy = config, policy
        self.store, self.approvals, self.outbox = store, approvals, outbox
        # Users the config lets in, once their row exists (forgotten at a reload). Everyone else
        # is looked up each time, because `openclaw users block` or `revoke` may change the store
        # under it.
        self.listed: set[str] = set()
        # What makes a config edit take effect, as the owner is told in chat: the service re-reads
        # the file on `openclaw reload`; a chat that runs the daemon in its terminal (the daemon
        # says so) only when restarted.
        self.apply_edit = "run `openclaw reload`"
        # The store's word on each user's role and owner flag (pairing approve --role/--admin),
        # as read at their latest admission or access check: what `principal` and `is_owner`
        # use for those the config does not name.
        self.stored: dict[str, User] = {}

    def reconfigure(self, config: Config, policy: Policy) -> None:
        self.config, self.policy = config, policy
        self.listed.clear()  # the config's lists may have changed

    async def retire_listed_codes(self) -> None:
        """The config decides for the users it names from now on: a code one of them got as a
        stranger (the owner, who wrote to the bot before listing themselves) answers nothing,
        and is no longer listed as waiting. At start and after each reload."""
        if retired := await self.store.retire_pairing_codes(named_users(self.config)):
            log.info("%d pairing code(s) retired: the config now decides for their users", retired)

    def principal(self, user: str) -> Principal:
        """Who `user` acts as, with the role they have now (role_name)."""
        return self.policy.principal(user, self.role_name(user))

    def role(self, user: str) -> Role:
        return self.policy.role(self.role_name(user))

    def role_name(self, user: str) -> str:
        """The role the config gives `user`, else the store (role_of)."""
        return role_of(self.config, user, self.stored.get(user), self.policy.roles)

    def is_owner(self, user: str) -> bool:
        return is_owner(self.config, user, self.stored.get(user))

    async def admit(self, msg: InboundMessage) -> bool:
        """Whether the caller may talk to the agent; if not, answer (pairing) or drop."""
        user, config = msg.user, self.config
        if user in self.listed:
            return True
        decided = config_status(config, user)
        if decided is UserStatus.BLOCKED:
            self._withdraw_approvals(user)
            return False
        if decided is UserStatus.ALLOWED:
            # The row their conversations hang on; the store's status is left alone, so taking
            # them out of the config later takes their access away too.
            await self.store.ensure_user(msg.channel, msg.user_id, msg.display_name)
            self._remember_listed(user, config)
            return True
        known = await self.store.ensure_user(msg.channel, msg.user_id, msg.display_name,
                                             status=UserStatus.PENDING)
        self._remember_stored(known)
        if known.status is UserStatus.ALLOWED:
            return True
        self._withdraw_approvals(user)
        if known.status is UserStatus.BLOCKED:
            return False
        if self.config.access.dm_policy == "open" and not msg.is_group:
            await self.store.set_user_status(msg.channel, msg.user_id, UserStatus.ALLOWED)
            return True
        if self.config.access.dm_policy == "pairing" and not msg.is_group:
            limits = pairing_limits(self.config)
            try:
                asked = await self.store.request_pairing(user, limits, chat_id=msg.chat_id,
                                                         message=msg.text)
            except UnknownUserError:  # store retention removed the stranger's old row just now
                await self.store.ensure_user(msg.channel, msg.user_id, msg.display_name,
                                             status=UserStatus.PENDING)
                asked = await self.store.request_pairing(user, limits, chat_id=msg.chat_id,
                                                         message=msg.text)
            code = asked.code
            if code is None and (await self.store.get_user(msg.channel, msg.user_id)).status \
                    is not UserStatus.PENDING:
                return False  # blocked (or let in) by `openclaw users` a moment ago
            text = (f"Hi! I don't know you yet. Your pairing code is {code}. Ask the owner of this "
                    f"assistant to approve it: /pairing approve {code} in their chat with me, or "
                    f"openclaw pairing approve {code}" if code else
                    "Hi! I don't know you yet, and I have given out as many pairing codes as I "
                    "may for now. Please try again later.")
            await self.outbox.reply(msg.channel, msg.chat_id, text, conversation_id=None, event=None)
            if asked.new:  # once per code: asking again gives the same code, and tells nobody
                await self._tell_owners(msg, asked.code)
        return False

    async def _tell_owners(self, msg: InboundMessage, code: str) -> None:
        """Tell every owner the daemon can reach now (an admin on a connected channel, the
        console's owner while a console is attached) that `msg`'s sender asks for access."""
        name = visible(msg.display_name or "") or "no name"
        # Literal: the owner lets a person in by what this shows, and the name is the stranger's own.
        text = (f"Someone asks for access, with the pairing code {code}:\n"
                + literal_block(f"{msg.channel} user {visible(msg.user_id)} ({name})")
                + f"\nTo let them in, answer:\n/pairing approve {code}\n(or /pairing deny {code} to "
                "refuse them)")
        stored_owners = {u.key for u in await self.store.list_users(UserStatus.ALLOWED)
                         if u.admin and is_owner(self.config, u.key, u)}
        for owner in sorted({LOCAL_USER, *self.config.access.admins, *stored_owners}):
            channel, external_id = parse_user_key(owner)
            connector = self.outbox.connectors.get(channel)
            if connector is None or not connector.connected:
                continue
            # Telegram's and the console's private chat has the user's id; Discord's DM has its
            # own, known once the owner wrote to the bot.
            chat = await self.store.private_chat_of(owner) or external_id
            await self.outbox.reply(channel, chat, text, conversation_id=None, event=None)

    async def still_allowed(self, user: str) -> bool:
        """What `admit` would say now, for a user who was admitted before (their turn waited for a
        restart, their reminder is due)."""
        config = self.config
        decided = config_status(config, user)
        if decided is None:
            known = await self.store.get_user(*parse_user_key(user))
            decided = known.status if known is not None else None
            if known is not None:
                self._remember_stored(known)
        elif decided is UserStatus.ALLOWED and user not in self.listed:
            await self.store.ensure_user(*parse_user_key(user))  # as admit: the row it needs
            self._remember_listed(user, config)
        return decided is UserStatus.ALLOWED

    def _remember_stored(self, known: User) -> None:
        """Keep what the store says of `known`'s role and owner flag; only for those it gives
        either, so strangers do not fill the map."""
        if known.role or known.admin:
            self.stored[known.key] = known
        else:
            self.stored.pop(known.key, None)

    def _withdraw_approvals(self, user: str) -> None:
        """A user shut out while a call of theirs waits for their /approve: their answer is no
        longer heard, so the call is denied now (not at its timeout) and the turn stops at its
        next access check, sending nothing."""
        if withdrawn := self.approvals.withdraw(user):
            log.info("%d approval request(s) of %s denied: their access was withdrawn", withdrawn, user)

    def _remember_listed(self, user: str, config: Config) -> None:
        """Skip the store for `user` from now on, as `config` lets them in; unless a reload came
        while the store was asked, whose lists may not (and which emptied the set meanwhile)."""
        if config is self.config:
            self.listed.add(user)
