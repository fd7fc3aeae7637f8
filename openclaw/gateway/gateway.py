"""The gateway: every inbound message passes here. `handle` admits it (access.py), stores it
(dedupe), then answers a chat command (commands.py) or queues a turn (turn.py) on its
conversation's lane (lanes.py): one at a time per conversation, concurrent across them. Replies
leave through the outbox (outbox.py); due reminders come in through due.py.

The inbound message is stored before `handle` returns, which is when a connector acknowledges it
to its service: a crash loses nothing, and a redelivery is recognised and not answered twice.
"""

from __future__ import annotations

import logging

from openclaw.agent import Agent, ChatModel
from openclaw.config import Config
from openclaw.gateway.access import Access
from openclaw.gateway.approvals import STALE_REQUEST, Approvals
from openclaw.gateway.commands import REMIND_NOT_REPEATED, Commands, command_of
from openclaw.gateway.contract import APPROVAL_ASKED, Connector, DeliveryRefused, InboundMessage
from openclaw.gateway.direct import DIRECT_COMMANDS, NOT_REPEATED, Direct
from openclaw.gateway.due import Due
from openclaw.gateway.feedback import Grading
from openclaw.gateway.lanes import Lane, Lanes, TurnJob
from openclaw.gateway.outbox import Outbox
from openclaw.gateway.turn import Spending, Turns
from openclaw.gateway.welcome import Welcomes, inbound_message
from openclaw.metrics import Metrics
from openclaw.store import Reminder, Store
from openclaw.store.records import InboundEvent, InboundStatus
from sandbox.policy import Policy

log = logging.getLogger(__name__)


class Gateway:
    def __init__(self, config: Config, store: Store, agent: Agent, model: ChatModel,
                 metrics: Metrics | None = None, policy: Policy | None = None) -> None:
        self.store, self.agent, self.model = store, agent, model
        self.metrics = metrics or Metrics()
        self.connectors: dict[str, Connector] = {}
        self.outbox = Outbox(store, self.connectors, self.metrics)
        self.outbox.on_chat_refused = self._chat_refused
        self.approvals = Approvals()
        self.access = Access(config, policy or config.policy(), store, self.approvals, self.outbox)
        self.lanes = Lanes(store, self.metrics, worker=self)
        self.spending = Spending(store)
        self.turns = Turns(store, agent, self.access, self.approvals, self.outbox, self.lanes,
                           self.spending, self.metrics)
        self.welcomes = Welcomes(store, self.outbox, self._answer)
        self.commands = Commands(store, agent, model, self.access, self.approvals, self.outbox,
                                 self.lanes, self.spending, on_approved=self.welcomes.wake)
        self.due = Due(store, agent, self.access, self.outbox, self.lanes)
        self.direct = Direct(store, agent, self.access, self.approvals, self.outbox)
        self.grading = Grading(store, self.access)  # reactions, retries, "that's wrong"

    def reconfigure(self, config: Config) -> None:
        """Serve from now on with a reloaded config (its access lists and roles; the agent was
        given its skills and settings). Running turns follow it from their next step: access
        checks, each tool call's principal; queued messages and due reminders too."""
        policy = config.policy()
        self.access.reconfigure(config, policy)
        # A call waiting for its user's /approve may wait minutes: one the new roles or skills
        # no longer grant is denied now, not run when the answer comes.
        registry = self.agent.executor.registry
        withdrawn = self.approvals.withdraw_if(lambda user, skill: skill not in registry.names or
                                               not self.access.role(user).grants(skill))
        if withdrawn:
            log.info("%d approval request(s) denied: the reloaded config no longer grants them",
                     withdrawn)

    def add_connector(self, connector: Connector) -> None:
        self.connectors[connector.name] = connector
        connector.on_chat_moved = self.chat_moved  # a service whose chats change ids (Telegram)
        connector.on_reaction = self.grading.reaction  # 👍 / 👎 on a reply (feedback.py)

    # ---- inbound ------------------------------------------------------------------------------

    async def handle(self, msg: InboundMessage) -> None:
        """Called by connectors. Returns once the message is stored (or deliberately dropped)."""
        if not self.lanes.accepting:
            # Refused, so that a service which delivers again does not take it as confirmed. An
            # admitted user's message is kept first, for the next start to answer: Discord never
            # delivers a message again. No pairing code: a refused update comes back and again.
            if await self.access.still_allowed(msg.user):
                await self._record(msg)
            raise RuntimeError("the daemon is shutting down")  # the connector must not ack it
        self.metrics.inc("openclaw_inbound_messages_total", channel=msg.channel)
        if not await self.access.admit(msg):
            return
        event, is_new = await self._record(msg)
        if not is_new:
            log.info("ignoring redelivered message %s:%s", msg.channel, msg.message_id)
            return
        await self._answer(msg, event)

    async def _answer(self, msg: InboundMessage, event: InboundEvent) -> None:
        """An admitted, stored message: a command answered, a notice sent, or a turn queued."""
        if command := command_of(msg.text):
            await self.commands.answer(command, msg, event)
        elif msg.notice and not msg.text.strip():
            await self.outbox.reply(msg.channel, msg.chat_id, msg.notice, conversation_id=None,
                                    event=event)
        else:
            # Feedback this message gives (a retry, "that's wrong"), judged by what was answered
            # as it came; noted in order before the turn is queued. Into an idle lane: checked
            # there once its turn ended, so neither the reply nor this return waits for it
            # (nothing else is answered in between); behind other turns of the chat: now.
            check = self.grading.notice(msg, event, "")
            job = TurnJob(msg, event)
            self.lanes.put(job)
            if check is not None and job.fresh:
                job.after = check
            elif check is not None:
                await check()
            return
        await self.grading.noticed(msg, event, command)

    async def _record(self, msg: InboundMessage) -> tuple[InboundEvent, bool]:
        return await self.store.record_inbound(
            msg.channel, msg.message_id, msg.user, msg.chat_id, msg.text,
            payload={"display_name": msg.display_name, "attachments": msg.attachments,
                     "notice": msg.notice, "is_group": msg.is_group})

    async def recover(self) -> int:
        """Re-queue messages stored but never answered (the daemon stopped in between)."""
        pending = await self.store.pending_inbound()
        for event in pending:
            msg = inbound_message(event)
            if not await self.access.still_allowed(msg.user):
                await self.store.mark_inbound(event.id, InboundStatus.FAILED, "user not allowed")
            elif msg.notice and not msg.text.strip():
                await self.outbox.reply(msg.channel, msg.chat_id, msg.notice,
                                        conversation_id=None, event=event)
            elif command_of(msg.text) == "/remind":  # it may have been set before the stop
                await self.outbox.reply(msg.channel, msg.chat_id, REMIND_NOT_REPEATED,
                                        conversation_id=None, event=event)
            elif (command := command_of(msg.text)) in DIRECT_COMMANDS:  # it may have run
                await self.outbox.reply(msg.channel, msg.chat_id,
                                        NOT_REPEATED.format(command=command),
                                        conversation_id=None, event=event)
            elif command:  # answered as a command, not by the model
                await self.commands.answer(command, msg, event)
            else:
                self.lanes.put(TurnJob(msg, event, resumed=True))
        if pending:
            log.info("recovered %d unanswered messages", len(pending))
        return len(pending)

    async def void_stale_requests(self) -> int:
        """Before the outbox sends what an earlier run left pending (Daemon.start): that run's
        approval requests are not sent. Their waits ended with it, and its turns, taken up again,
        ask anew under new numbers: an old one would only be answered "no request N". How many
        pieces were voided."""
        void: set[int] = set()
        pending = await self.store.pending_outbound()
        for at, item in enumerate(pending):
            if not APPROVAL_ASKED.search(item.text):
                continue
            # The request's earlier pieces, if its summary was long: stored right before it.
            first = at
            while first > 0 and (prev := pending[first - 1]).id == pending[first].id - 1 \
                    and (prev.channel, prev.chat_id) == (item.channel, item.chat_id) \
                    and prev.created_at == item.created_at:
                first -= 1
            void.update(piece.id for piece in pending[first:at + 1])
        voided = await self.store.fail_unsent(void, STALE_REQUEST) if void else 0
        if voided:
            log.info("not sending %d piece(s) of approval requests an earlier run left pending",
                     voided)
        return voided

    async def remind(self, reminder: Reminder) -> bool:
        """The scheduler's hand-off of a due reminder (see Due.remind)."""
        return await self.due.remind(reminder)

    # ---- what lanes run (lanes.Worker) --------------------------------------------------------

    async def run_turn(self, lane: Lane, job: TurnJob) -> None:
        if command_of(job.message.text) in DIRECT_COMMANDS:
            await self.direct.run(lane, job)
        else:
            await self.turns.run(lane, job)

    async def fire(self, lane: Lane, reminder: Reminder) -> bool:
        return await self.due.fire(lane, reminder)

    # ---- chats that move or refuse ------------------------------------------------------------

    async def chat_moved(self, channel: str, chat_id: str, new_chat_id: str) -> None:
        """A chat lives on under a new id (a Telegram group upgraded to a supergroup), as its
        connector reports or a refused reply says, whichever comes first (then the other finds
        nothing left to move): its conversations, pending replies and reminders move there, its
        lanes follow, and the replies are sent there."""
        moved = await self.store.move_chat(channel, chat_id, new_chat_id)
        self.lanes.move(channel, chat_id, new_chat_id)
        if moved.outbound:
            self.outbox.redeliver(channel, new_chat_id)
        if moved.conversations or moved.outbound or moved.reminders:
            log.warning("%s chat %s is now %s: moved %d conversation(s), %d pending piece(s) of "
                        "replies, reminder(s) with id %s", channel, chat_id, new_chat_id,
                        len(moved.conversations), len(moved.outbound),
                        ", ".join(str(r.id) for r in moved.reminders) or "none")

    async def _chat_refused(self, channel: str, chat_id: str, refusal: DeliveryRefused) -> None:
        """A chat moved (its refused reply is among what moves) or refuses the bot for good
        (blocked, removed, deleted): its reminders would fail every time they repeat, so they
        end now, and the log says which."""
        if refusal.moved_to:
            await self.chat_moved(channel, chat_id, refusal.moved_to)
            return
        cancelled = await self.store.cancel_chat_reminders(channel, chat_id)
        if cancelled:
            log.warning("cancelled reminder(s) with id %s for %s:%s, which refuses messages: %s",
                        ", ".join(str(r.id) for r in cancelled), channel, chat_id, refusal)

    # ---- load and shutdown --------------------------------------------------------------------

    def queue_length(self) -> int:
        return self.lanes.queued() + self.lanes.answering()

    async def wait_idle(self, channel: str | None = None) -> None:
        """Until every queued message (of `channel`, or of all) has been answered."""
        await self.lanes.wait_idle(channel)

    async def wait_answered(self, channel: str, chat_id: str) -> None:
        """Until the channel's queued messages are answered and this chat's replies are out of the
        outbox (sent, or given up): what the console's "done" promises."""
        await self.wait_idle(channel)
        await self.outbox.settled(channel, chat_id)

    async def drain(self, timeout: float) -> None:
        """Stop taking messages; let running turns finish within `timeout`, then abort them.
        Aborted and queued messages stay 'received' in the store and are answered after restart."""
        await self.lanes.drain(timeout)
