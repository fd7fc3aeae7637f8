"""Delivery of due reminders: the scheduler (openclaw.reminders) hands each one here when it is
due; it is sent in its chat's lane, between turns, and joins the conversation. A reminder whose
user may no longer be reminded is cancelled instead."""

from __future__ import annotations

import logging
from collections import OrderedDict

from openclaw import reminders
from openclaw.agent import Agent
from openclaw.gateway.access import Access
from openclaw.gateway.lanes import Lane, Lanes
from openclaw.gateway.outbox import Outbox, chunk_text
from openclaw.store import Reminder, Store
from sandbox.policy import UnknownRole

log = logging.getLogger(__name__)

WARNED_KEPT = 1024  # reminder ids remembered as warned about (see Due._warn_no_channel)


class Due:
    def __init__(self, store: Store, agent: Agent, access: Access, outbox: Outbox,
                 lanes: Lanes) -> None:
        self.store, self.agent, self.access, self.outbox, self.lanes = (
            store, agent, access, outbox, lanes)
        # Reminders due on a channel not running here, warned about once each; the newest
        # WARNED_KEPT, so a daemon that runs for months does not keep every one ever due.
        self.warned: OrderedDict[int, None] = OrderedDict()

    async def remind(self, reminder: Reminder) -> bool:
        """Deliver a due reminder in its chat's lane, between turns (its message joins the
        conversation, which must not land in the middle of a turn's tool calls). True once it was
        handled; False when it cannot be sent now (its channel is not running)."""
        if not self.lanes.accepting:
            return False
        if await self._dropped(reminder):  # whatever the state of its channel
            return True
        connector = self.outbox.connectors.get(reminder.channel)
        # Not now without the channel, or while it cannot deliver (a console nobody is attached
        # to, a service out of reach): it stays due, and is late, and says so, when sent.
        if connector is None:
            self._warn_no_channel(reminder)
            return False
        if not connector.connected:
            log.debug("reminder id %d waits for the %s channel", reminder.id, reminder.channel)
            return False
        return await self.lanes.remind(reminder)

    async def fire(self, lane: Lane, r: Reminder) -> bool:
        """Send `r` now, in `lane`; whether it was handled."""
        connector = self.outbox.connectors.get(r.channel)
        if connector is None:
            return False
        if await self._dropped(r):  # again: access may have changed while it was queued
            return True
        conversation_id = await self.lanes.conversation(lane, r.user, r.chat_id, r.channel)
        now = self.store.now()
        text = reminders.message(r, now)
        # Recorded as delivered and queued for sending in one transaction: after a crash it is
        # sent (the outbox), never fired twice.
        stored = await self.store.fire_reminder(r.id, r.due_at, reminders.next_time(r, now),
                                                chunk_text(text, connector.max_message_len),
                                                conversation_id=conversation_id)
        if stored is None:  # cancelled meanwhile
            return True
        try:
            await self.agent.context.add(conversation_id, "assistant", text)
        except Exception:  # the message matters more than the model's memory of it
            log.exception("could not add reminder id %d to conversation %d", r.id, conversation_id)
        await self.outbox.deliver(r.channel, r.chat_id, stored)
        return True

    def _warn_no_channel(self, r: Reminder) -> None:
        """A channel this daemon does not run (not enabled in the config) may never come: said
        once per reminder, not at every look the scheduler takes."""
        if r.id in self.warned:
            return
        self.warned[r.id] = None
        if len(self.warned) > WARNED_KEPT:
            self.warned.popitem(last=False)
        log.warning("reminder id %d is due but cannot be sent: the %s channel is not enabled in the "
                    "config; enable [%s] and restart, or cancel it with `openclaw reminders cancel "
                    "%s %d`", r.id, r.channel, r.channel, r.user, r.number)

    async def _dropped(self, r: Reminder) -> bool:
        """Cancel `r` if its user may no longer be reminded; whether it was."""
        why_not = await self.why_not(r.user)
        if why_not:
            log.info("cancelling reminder id %d: %s", r.id, why_not)
            await self.store.cancel_reminder(r.user, r.number)
        return why_not is not None

    async def why_not(self, user: str) -> str | None:
        """Why `user` may no longer be reminded: access lost, or the reminders skill (with which
        they would cancel) no longer theirs. None when they may."""
        if not await self.access.still_allowed(user):
            return f"{user} is no longer allowed"
        try:
            role = self.access.role(user)
        except UnknownRole as exc:
            return str(exc)
        if "reminders" not in self.agent.executor.registry.names or not role.grants("reminders"):
            return f"{user} may no longer use the reminders skill"
        return None
