"""One lane per conversation: its jobs (turns, due reminders) run one at a time in arrival order,
while lanes run concurrently. A lane's worker ends when it has been idle a while; the next job of
its chat makes a new one. When a chat changes its id, its lanes follow it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from openclaw.gateway.contract import InboundMessage
from openclaw.metrics import Metrics
from openclaw.store import Reminder, Store
from openclaw.store.records import InboundEvent, InboundStatus

log = logging.getLogger(__name__)

# A lane with nothing to do for this long ends (its worker too): each lane kept would cost memory
# and a look at every /metrics, /status and stop, as people and chats come and go over months. The
# next message of its chat makes a new one, which looks its conversation up again.
LANE_IDLE_S = 600.0

LaneKey = tuple[str, str, str]  # (channel, chat_id, user)


def key_of(msg: InboundMessage) -> LaneKey:
    return (msg.channel, msg.chat_id, msg.user)


@dataclass
class TurnJob:
    """A message to answer with a turn of the agent."""

    message: InboundMessage
    event: InboundEvent  # as stored: answering it marks it processed
    resumed: bool = False  # recovered at start-up: taken up where the last run left it
    # Queued into an idle lane: its turn starts at once, so the admission's look at the store
    # still holds (a query costs ~0.6 ms); one that waited is looked at again.
    fresh: bool = False
    # Run in the lane once the turn ended (replied, failed or stopped), the lane still busy: work
    # the reply need not wait for (the feedback check: gateway.feedback). Never raises. Run too
    # for a job /stop drops or a stop leaves for the next start.
    after: Callable[[], Awaitable[None]] | None = None


@dataclass
class ReminderDue:
    """A due reminder to deliver between turns; `done` gets whether it was handled."""

    reminder: Reminder
    done: asyncio.Future[bool]


@dataclass
class Errand:
    """The daemon's own work in a conversation (a scheduled agent job), run between its turns:
    `run(lane)`'s result goes to `done` (None when /stop stopped it)."""

    run: Callable[[Lane], Awaitable[Any]]
    done: asyncio.Future[Any]


Job = TurnJob | ReminderDue | Errand


@dataclass
class Lane:
    """One conversation's queue and worker: jobs run one at a time, in arrival order."""

    key: LaneKey  # where it is in Lanes.by_key
    queue: asyncio.Queue[Job] = field(default_factory=asyncio.Queue)
    worker: asyncio.Task | None = None
    # What /stop and /new cancel: the lane's worker itself while it answers a turn (a task of
    # its own would cost the turn a loop iteration), a direct command's call, an errand.
    current: asyncio.Task | None = None
    stops: int = 0  # cancels sent to the worker as `current` that it has not taken back yet
    busy: bool = False
    conversation_id: int | None = None  # the active conversation, until /new
    generation: int = 0  # bumped by /new, so a look-up that raced it is not cached
    stop_requested: bool = False  # /stop arrived while a turn was starting
    reminding: bool = False  # busy with a due reminder, not a turn: nothing for /stop to stop

    def stop_current(self) -> bool:
        """Cancel what runs as `current` (/stop, /new); whether something was running. A cancel
        of the worker itself is counted, for `took_stops` to tell it from the daemon's."""
        if self.current is None or self.current.done():
            return False
        if self.current is self.worker:
            self.stops += 1
        self.current.cancel()
        return True

    def took_stops(self) -> bool:
        """In the worker, as its turn ends: takes back the cancels stop_current sent it (none
        left to cancel a later await); whether the worker is still being cancelled (the daemon
        is stopping)."""
        task = asyncio.current_task()
        while self.stops:
            self.stops -= 1
            task.uncancel()
        return task.cancelling() > 0

    def forget_conversation(self) -> None:
        """Look the conversation up again at the next job (/new archived it, or its chat moved)."""
        self.conversation_id = None
        self.generation += 1


class Worker(Protocol):
    """What runs a lane's jobs (the gateway, with turn.py and due.py)."""

    async def run_turn(self, lane: Lane, job: TurnJob) -> None: ...

    async def fire(self, lane: Lane, reminder: Reminder) -> bool:
        """Deliver a due reminder: True once handled, False to try again later."""


class Lanes:
    def __init__(self, store: Store, metrics: Metrics, worker: Worker) -> None:
        self.store, self.metrics, self.worker = store, metrics, worker
        self.by_key: dict[LaneKey, Lane] = {}
        # Chats that moved to a new id while running, (channel, old id) -> new id: a job queued
        # under the old id goes on in the lane and the conversation that moved.
        self.moved: dict[tuple[str, str], str] = {}
        self.accepting = True  # until drain: then jobs are left for the next start

    def get(self, key: LaneKey) -> Lane | None:
        return self.by_key.get(key)

    def of(self, key: LaneKey) -> Lane:
        """The lane of `key` (under its chat's new id, if it moved), with a running worker."""
        channel, chat_id, user = key
        key = (channel, self.moved.get((channel, chat_id), chat_id), user)
        lane = self.by_key.get(key)
        if lane is None:  # new, or ended while idle: it looks its conversation up again
            lane = self.by_key[key] = Lane(key)
        if lane.worker is None or lane.worker.done():
            lane.worker = asyncio.create_task(self._work(lane), name=f"lane {key}")
        return lane

    def put(self, job: TurnJob) -> None:
        """Queue a message's turn in its conversation's lane."""
        lane = self.of(key_of(job.message))
        job.fresh = not job.resumed and not lane.busy and lane.queue.empty()
        lane.queue.put_nowait(job)

    async def remind(self, reminder: Reminder) -> bool:
        """Deliver `reminder` in its chat's lane, between turns; whether it was handled."""
        job = ReminderDue(reminder, asyncio.get_running_loop().create_future())
        self.of((reminder.channel, reminder.chat_id, reminder.user)).queue.put_nowait(job)
        return await job.done

    async def errand(self, key: LaneKey, run: Callable[[Lane], Awaitable[Any]]) -> Any:
        """Run `run(lane)` in the lane of `key`, between its turns; its result."""
        job = Errand(run, asyncio.get_running_loop().create_future())
        self.of(key).queue.put_nowait(job)
        return await job.done

    async def conversation(self, lane: Lane, user: str, chat_id: str, channel: str) -> int:
        """The lane's active conversation, looked up in the store when the lane has none."""
        conversation_id = lane.conversation_id
        while conversation_id is None:
            generation = lane.generation
            chat_id = self.moved.get((channel, chat_id), chat_id)  # queued before a move
            conv = await self.store.active_conversation(user, chat_id, channel)
            # Else /new archived it, or its chat moved, meanwhile: look again.
            if generation == lane.generation:
                conversation_id = lane.conversation_id = conv.id
        return conversation_id

    def move(self, channel: str, chat_id: str, new_chat_id: str) -> None:
        """A chat's lanes follow it to its new id, their queued jobs in order. Where the user
        already has a lane under the new id (the move came late), that lane takes over the queued
        jobs, so the conversation goes on one turn at a time (a turn already running in the old
        lane finishes there). Every lane of either id looks its conversation up again: the store
        moved it, or archived the one the lane had."""
        self.moved[(channel, chat_id)] = new_chat_id
        for key in [k for k in self.by_key if k[:2] == (channel, chat_id)]:
            new_key = (channel, new_chat_id, key[2])
            if new_key not in self.by_key:
                lane = self.by_key[new_key] = self.by_key.pop(key)
                lane.key = new_key
                continue
            old, target = self.by_key[key], self.by_key[new_key]
            while not old.queue.empty():
                target.queue.put_nowait(old.queue.get_nowait())
                old.queue.task_done()
        for key, lane in self.by_key.items():
            if key[:2] in ((channel, chat_id), (channel, new_chat_id)):
                lane.forget_conversation()

    async def stop(self, lane: Lane | None) -> int:
        """/stop: the lane's running turn is cancelled and its queued ones dropped; how many. A due
        reminder is not the user's request: it stays queued. All that is done before the first
        await, so the lane never looks idle (and ends) with a reminder out of its queue, and a
        message sent after the /stop is answered, not stopped."""
        if lane is None:
            return 0
        dropped = []
        for _ in range(lane.queue.qsize()):
            job = lane.queue.get_nowait()
            lane.queue.task_done()
            if isinstance(job, ReminderDue | Errand):  # not a request of the user's
                lane.queue.put_nowait(job)
            else:
                dropped.append(job)
        stopped = len(dropped)
        if lane.stop_current():
            stopped += 1
        elif lane.busy and not lane.reminding:  # between taking the message and the model
            lane.stop_requested = True
            stopped += 1
        for job in dropped:
            await self.store.mark_inbound(job.event.id, InboundStatus.FAILED, "stopped")
            await _after(job)
        return stopped

    # ---- the worker ---------------------------------------------------------------------------

    async def _work(self, lane: Lane) -> None:
        while True:
            job = await self.next_job(lane)
            if job is None:  # nothing came for LANE_IDLE_S
                if self.retire(lane):
                    return
                continue  # something came just as the wait ended
            try:
                if not self.accepting:  # draining: a message stays 'received', answered after
                    if isinstance(job, ReminderDue | Errand):  # the restart, and a reminder
                        job.done.cancel()  # stays due
                    else:
                        await _after(job)
                elif isinstance(job, ReminderDue):
                    await self._fire(lane, job)
                elif isinstance(job, Errand):
                    await self._errand(lane, job)
                else:
                    await self._turn(lane, job)
            finally:
                lane.queue.task_done()

    async def _turn(self, lane: Lane, job: TurnJob) -> None:
        lane.busy, lane.stop_requested = True, False
        try:
            try:
                await self.worker.run_turn(lane, job)
            except Exception:
                log.exception("turn for %s failed", job.message.user)
                self.metrics.inc("openclaw_turns_total", result="failed")
                try:
                    await self.store.mark_inbound(job.event.id, InboundStatus.FAILED,
                                                  "internal error")
                except Exception:  # the lane must outlive a store hiccup
                    log.exception("could not mark message %s failed", job.event.id)
            await _after(job)
        finally:
            lane.busy = False

    async def _fire(self, lane: Lane, job: ReminderDue) -> None:
        lane.busy = lane.reminding = True
        try:
            handled = await self.worker.fire(lane, job.reminder)
            if not job.done.done():  # else the scheduler stopped waiting (shutdown)
                job.done.set_result(handled)
        except asyncio.CancelledError:
            job.done.cancel()
            raise
        except Exception as exc:  # the scheduler logs it and tries again later
            if not job.done.done():
                job.done.set_exception(exc)
        finally:
            lane.busy = lane.reminding = False

    async def _errand(self, lane: Lane, job: Errand) -> None:
        lane.busy = True
        lane.current = asyncio.create_task(job.run(lane))  # for /stop, as a turn
        try:
            result = await lane.current
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # the daemon is stopping, not /stop
                lane.current.cancel()
                job.done.cancel()
                raise
            result = None
        except Exception as exc:
            if not job.done.done():
                job.done.set_exception(exc)
            return
        finally:
            lane.busy, lane.current = False, None
        if not job.done.done():
            job.done.set_result(result)

    async def next_job(self, lane: Lane) -> Job | None:
        """The lane's next job; None when none came for LANE_IDLE_S. A job put as the wait ends
        stays in the queue (Queue.get takes it only when it returns), for `retire` to see."""
        try:
            async with asyncio.timeout(LANE_IDLE_S):
                return await lane.queue.get()
        except TimeoutError:
            return None

    def retire(self, lane: Lane) -> bool:
        """End an idle lane: whether it may (nothing queued, nothing running). No await here, nor
        between this and its worker's end: a message put before this look is in the queue (the
        lane goes on); one after it finds no lane under its key and makes a new one. The key is
        removed only while it still names this lane."""
        if lane.busy or not lane.queue.empty():
            return False
        if self.by_key.get(lane.key) is lane:
            del self.by_key[lane.key]
        self._forget_moves(lane.key[0])
        return True

    def _forget_moves(self, channel: str) -> None:
        """Forget the channel's chat moves that no lane needs any more: a move is looked up only
        for jobs queued under the old id before it, which sit in lanes of the old or new id."""
        chats = {key[1] for key in self.by_key if key[0] == channel}
        for (moved_channel, old), new in list(self.moved.items()):
            if moved_channel == channel and old not in chats and new not in chats:
                del self.moved[(moved_channel, old)]

    # ---- load and shutdown --------------------------------------------------------------------

    def answering(self) -> int:
        return sum(lane.busy for lane in self.by_key.values())

    def queued(self) -> int:
        return sum(lane.queue.qsize() for lane in self.by_key.values())

    async def wait_idle(self, channel: str | None = None) -> None:
        """Until every queued job (of `channel`, or of all) is done."""
        await asyncio.gather(*(lane.queue.join() for key, lane in self.by_key.items()
                               if channel is None or key[0] == channel))

    async def drain(self, timeout: float) -> None:
        """Take no more jobs; let running ones finish within `timeout`, then cancel the workers.
        What is left stays in the store for the next start."""
        self.accepting = False
        self._say_what_drains(timeout)
        try:
            if self.answering():
                await asyncio.wait_for(self._finish_running(), timeout)
        except TimeoutError:
            log.warning("drain timed out after %.0f s: aborting the turns still running", timeout)
        for lane in self.by_key.values():
            if lane.worker:
                lane.worker.cancel()
        await asyncio.gather(*(lane.worker for lane in self.by_key.values() if lane.worker),
                             return_exceptions=True)

    def _say_what_drains(self, timeout: float) -> None:
        """A stop may wait `timeout` for running turns: the log says so, and for what."""
        running, queued = self.answering(), self.queued()
        left = f"{queued} queued message(s) wait for the next start" if queued else ""
        if running:
            log.info("stopping: finishing %d running conversation(s), up to %g s%s", running,
                     timeout, f"; {left}" if left else "")
        elif left:
            log.info("stopping: %s", left)

    async def _finish_running(self) -> None:
        while self.answering():
            await asyncio.sleep(0.05)


async def _after(job: TurnJob) -> None:
    """The job's `after`, once."""
    after, job.after = job.after, None
    if after is not None:
        await after()
