"""Approvals in the chat: a skill call that needs one is shown to its user with a number, and waits
until the same user answers `/approve N` or `/deny N` (the executor's timeout counts as deny).
Only the user the call acts for can answer it; a number of someone else's request is "unknown"."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from openclaw.gateway.contract import approval_asked, literal_block
from openclaw.gateway.outbox import Outbox
from openclaw.store.records import OutboundMessage
from sandbox.policy import Principal

# Why a piece of a request to approve is not sent: its wait ended (answered, timed out, /stop, or
# the run that asked stopped), so the number it names is void.
STALE_REQUEST = "not sent: a request to approve whose wait had ended"


@dataclass
class _Request:
    user: str
    skill: str
    future: asyncio.Future


class Approvals:
    def __init__(self) -> None:
        self._pending: dict[int, _Request] = {}

    async def ask(self, user: str, skill: str, summary: str,
                  send: Callable[[str], Awaitable[None]]) -> bool:
        """Show the request to `user` (through `send`) and wait for the answer. Cancelling the wait
        (timeout, /stop) withdraws the request."""
        # Random, not counting from 1: a prompt from before a restart (or one delivered late)
        # must not name a new request.
        number = secrets.randbelow(900_000) + 100_000
        while number in self._pending:
            number = secrets.randbelow(900_000) + 100_000
        request = _Request(user, skill, asyncio.get_running_loop().create_future())
        self._pending[number] = request
        try:
            # The summary (the command, path or address) as a literal block: no Markdown of the
            # app's may change what the user reads (see contract.LITERAL_INFO).
            await send(f"Approval needed ({skill}):\n{literal_block(summary)}\n{approval_asked(number)}")
            return await request.future
        finally:
            self._pending.pop(number, None)

    def answer(self, user: str, argument: str, approve: bool) -> tuple[str, Callable[[], None] | None]:
        """The reply to `/approve N` or `/deny N` from `user`, and what settles the request: the
        caller settles it once the reply is out, so "Approved"/"Denied" comes before what the
        call does next (its output, the model's answer)."""
        verb = "approve" if approve else "deny"
        mine = sorted(n for n, r in self._pending.items() if r.user == user)
        if not argument.strip():  # never guess: a repeated tap must not answer a newer request
            return (f"Which one? Reply /{verb} N; waiting: {', '.join(map(str, mine))}." if mine
                    else "Nothing is waiting for your approval."), None
        try:
            number = int(argument.strip().lstrip("#"))
        except ValueError:
            return f"Usage: /{verb} N, with N the number of the request.", None
        request = self._pending.get(number)
        if request is None or request.user != user or request.future.done():
            return f"There is no request {number} waiting for you" + (
                f" (pending: {', '.join(map(str, mine))})." if mine else "."), None
        del self._pending[number]  # answered: a second /approve N finds nothing

        def settle() -> None:
            if not request.future.done():  # else its wait ended meanwhile (timeout, /stop)
                request.future.set_result(approve)

        return (f"Approved: {request.skill} #{number} runs now." if approve else
                f"Denied: {request.skill} #{number} will not run."), settle

    def withdraw(self, user: str) -> int:
        """Deny every request of `user` now (their access was withdrawn); how many there were."""
        return self.withdraw_if(lambda who, skill: who == user)

    def withdraw_if(self, denied: Callable[[str, str], bool]) -> int:
        """Deny now every request for which `denied(user, skill)`; how many there were."""
        numbers = [n for n, r in self._pending.items() if denied(r.user, r.skill)]
        for number in numbers:
            future = self._pending.pop(number).future
            if not future.done():
                future.set_result(False)
        return len(numbers)



def asking_in(approvals: Approvals, outbox: Outbox, channel: str, chat_id: str):
    """An executor's approver that asks in this chat; the answer must come from the user the call
    acts for."""
    async def approve(principal: Principal, skill: str, summary: str) -> bool:
        asked: list[OutboundMessage] = []

        async def send(text: str) -> None:
            await outbox.reply(channel, chat_id, text, conversation_id=None, event=None, kept=asked)
        try:
            return await approvals.ask(principal.user, skill, summary, send)
        finally:
            # Its wait is over (answered, timed out, /stop): a piece of the request still waiting
            # to go out (a retry, a send cut short) would name a void number.
            await outbox.give_up(asked, STALE_REQUEST)
    return approve
