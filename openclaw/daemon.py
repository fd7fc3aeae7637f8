"""The daemon: puts config, store, engine, skills, agent, gateway, connectors and the admin port
together, runs until told to stop, and stops cleanly (drain, then close in reverse order)."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from engine.config import EngineConfig
from openclaw import kv_report, systemd
from openclaw.admin import AdminPortInUse, AdminServer
from openclaw.agent import Agent, ChatModel
from openclaw.agent.model import ModelUnavailable
from openclaw.backends import Backend, open_backend, shown_url
from openclaw.config import Config, ConfigError, load_config, model_file_problems
from openclaw.datadir import claim_data_dir, keep_private, release_data_dir
from openclaw.descriptors import quiet_accept_failures, raise_open_files_limit
from openclaw.gateway import access
from openclaw.gateway.contract import Connector
from openclaw.gateway.gateway import Gateway
from openclaw.health import ConnectorWatch, enabled_connectors
from openclaw.memory import Memory
from openclaw.memory_consolidation import Consolidation
from openclaw.metrics import Metrics, follow_loop_lag
from openclaw.reload import RELOADABLE, Outcome, asked_early, merge, write_outcome
from openclaw.reminders import Reminders
from openclaw.scheduler.agent_job import AgentJobs
from openclaw.scheduler.heartbeat import Heartbeats, follow_heartbeat
from openclaw.scheduler.priority_gate import PriorityGate
from openclaw.scheduler.service import Scheduling, agent_runners
from openclaw.skillset import add_mcp_tools, configured_skills, executor_for, mcp_for
from openclaw.store import JobKind, Store
from openclaw.store.mcp_pins import McpPins
from openclaw.store.retention import Retention, RetentionTask
from sandbox import cgroups
from skills import SkillRegistry
from skills.executor import AuditSink

if TYPE_CHECKING:
    from openclaw.serve import APIServer
    from skills.mcp.servers import McpServers

log = logging.getLogger(__name__)


def freeze_start_up_heap() -> int:
    """Collect once, then freeze every object alive; the number frozen. The ~400,000 objects the
    libraries and the model keep for the process's life are then never walked again by a full
    collection, which stalled replies and engine steps ~0.2 s each time (bench/gc_pause.py).
    Frozen cyclic garbage is never freed: call it once, when the start is done."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class Daemon:
    def __init__(self, config: Config, *, model: ChatModel | None = None,
                 connectors: list[Connector] | None = None, admin_optional: bool = False,
                 hangup_reloads: bool = True, freeze_heap: bool = False) -> None:
        """`admin_optional`: a port in use is a warning, and the daemon goes on without it (a chat
        in this terminal); else it stops the start (the service, which is scraped).
        `hangup_reloads`: SIGHUP re-reads the config (the service); else it stops the daemon (a
        chat in this terminal, whose terminal closed).
        `freeze_heap`: at the end of the start, move what it allocated out of the garbage
        collector's reach (freeze_start_up_heap); for the process's owner, `openclaw run`."""
        self.config = config
        self.freeze_heap = freeze_heap
        self.hangup_reloads = hangup_reloads
        self.admin_optional = admin_optional
        self.model = model
        self._owns_model = model is None
        self.connectors = list(connectors or [])
        self.metrics = Metrics()
        self.store: Store | None = None
        self.gateway: Gateway | None = None
        self.admin: AdminServer | None = None
        self.api: APIServer | None = None  # the OpenAI-compatible API, with [serve] enabled
        self.reminders: Reminders | None = None
        self.mcp: McpServers | None = None  # [mcp.servers.*], their tools in the skills
        self.memory: Memory | None = None
        self.scheduling: Scheduling | None = None  # the scheduler, with reminders and jobs on it
        self.retention: RetentionTask | None = None
        self._watchdog: asyncio.Task | None = None
        self._loop_lag: asyncio.Task | None = None
        self._connector_watch: ConnectorWatch | None = None
        self._watching: asyncio.Task | None = None
        self._restore_exception_handler: Callable[[], None] | None = None
        self._reload_task: asyncio.Task | None = None  # held: the loop keeps only weak references
        self._reload_pending = False  # SIGHUP came during start-up
        self._phase = "starting"  # then "running", "stopping"
        self._lock: TextIO | None = None
        self._stop = asyncio.Event()
        self.started_at = time.time()

    async def start(self) -> None:
        cfg = self.config
        cfg.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        keep_private(cfg.data_dir)
        # Before anything reads or sends from the store, and before the signal handlers: a
        # refused second daemon in the same process must leave the first one's alone.
        self._lock = claim_data_dir(cfg.data_dir, reloads=self.hangup_reloads)
        if raised := raise_open_files_limit():  # else a flood or many commands' pipes starve it
            log.info("raised the open-files limit from %d to %d, the hard limit", *raised)
        loop = asyncio.get_running_loop()
        self._restore_exception_handler = quiet_accept_failures(loop)
        # Before the daemon starts a process of its own: on cgroup v2 it moves into a leaf of its
        # cgroup, alone there, so that commands' memory cgroups can be made beside it.
        await asyncio.to_thread(cgroups.default.available)
        for sig in (signal.SIGTERM, signal.SIGINT):  # before READY=1: a stop may follow at once
            loop.add_signal_handler(sig, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, self._hangup)
        if asked_early() and self.hangup_reloads:  # one came while `openclaw run` began
            self._hangup()
        try:  # a bad [skills] or [roles] stops the start, naming the key
            skills = configured_skills(cfg)
        except ConfigError as exc:  # with the model file's problem, if any: one report, not two
            raise ConfigError(exc.path, exc.problems + model_file_problems(cfg.engine)) from None
        for line in skills.skipped:  # a broken SKILL.md, or one whose program is missing: left out
            log.warning("skill %s", line)
        self.store = await Store.open(cfg.store.url, loop_writes=True)
        self.mcp = await mcp_for(cfg, skills, McpPins(self.store))
        if cfg.admin.enabled:  # before the model loads: a port in use is said at once, and
            # /healthz answers "starting" while it loads
            self.admin = await self._start_admin()
        if self.model is None:
            self.model = await self._open_model()
            if self.model is None:  # stopped while it waited for the model's server
                return
        # max_num_seqs conversations overflow the KV pool
        kv_report.warn_at_start(cfg, self.model, (c.name for c in self.connectors))
        if cfg.serve.enabled:  # on the model just loaded; a port in use stops the start here
            from openclaw.serve import serve_daemon_model

            self.api = await serve_daemon_model(self.model, cfg.serve)
        self.scheduling = Scheduling(self.store, cfg.store.url)
        self.reminders = self.scheduling.reminders
        # A remote model's requests are queued by priority here; the engine orders its own.
        gated = (self.model if getattr(self.model, "orders_by_priority", False)
                 else PriorityGate(self.model))
        self.memory = Memory(self.store, cfg.memory, Consolidation(self.store, gated, cfg.memory).run)
        executor = executor_for(cfg, skills, self._audit(skills), self.reminders, self.scheduling.jobs,
                                self.memory)
        agent = Agent(gated, self.store, executor, cfg.agent, metrics=self.metrics, memory=self.memory,
                      prompts=self.store)
        self.gateway = Gateway(cfg, self.store, agent, self.model, self.metrics)
        self.agent_jobs = AgentJobs(self.gateway)  # what scheduled jobs run: see openclaw/scheduler
        self.heartbeats = Heartbeats(self.agent_jobs, self.store)
        self.gateway.commands.heartbeat = self.heartbeats.command
        self.heartbeats.on_change = functools.partial(follow_heartbeat, self.scheduling.jobs)
        if not self.hangup_reloads:  # `openclaw reload` refuses a daemon that does not re-read
            self.gateway.access.apply_edit = "restart `openclaw chat`, which runs the daemon in its terminal"
        self._register_gauges()
        await self.gateway.access.retire_listed_codes()
        for connector in self.connectors:
            self.gateway.add_connector(connector)
        # Older pending replies first: recovered turns and notices queue behind them per chat.
        # But not the approval requests among them: void now, asked again by the turns resumed.
        await self.gateway.void_stale_requests()
        await self.gateway.outbox.recover()
        await self.gateway.recover()
        for connector in self.connectors:
            await connector.start(self.gateway.handle)
            self.gateway.outbox.retry_channel_now(connector.name)
        self._connector_watch = ConnectorWatch(enabled_connectors(cfg, self.connectors))
        self._watching = asyncio.create_task(self._connector_watch.follow(), name="connector watch")
        # A reminder due while its channel was away goes as soon as it is back, as replies do.
        self.gateway.outbox.follow_connections(on_back=lambda channel: self.reminders.retry_now())
        # Due ones queue behind recovered turns.
        await self.scheduling.start(self.gateway, cfg, {**agent_runners(self.gateway),
                                                        JobKind.HEARTBEAT: self.heartbeats.runner})
        self.gateway.welcomes.start()  # strangers approved meanwhile, and from now on
        # After recovery, which reads the rows it must never touch; in the background, a batch
        # at a time: the first run after an upgrade may have months of rows to delete.
        self.retention = RetentionTask(self.store, Retention.of(cfg.store), self._kept_users)
        self.retention.start()
        if self._reload_pending:  # asked for while the model loaded: the file may have changed
            await self.reload(notify=False)
        if self.freeze_heap:
            freeze_start_up_heap()
        self._phase = "running"
        systemd.ready()
        self._watchdog = systemd.start_watchdog()
        self._loop_lag = asyncio.create_task(follow_loop_lag(self.metrics), name="event loop lag")
        log.info("openclaw is running with %s", ", ".join(c.name for c in self.connectors) or
                 "no connectors")

    async def _open_model(self) -> Backend | None:
        """The model `[engine]` names: loaded here, or a server's, waited for until it is up or a
        stop comes (None)."""
        cfg = self.config
        local = isinstance(cfg.engine, EngineConfig)
        log.info("loading the model (%s)", (cfg.engine.model or "embedded SmolLM2-135M-Instruct")
                 if local else f"{cfg.engine.model or 'the one served'} on {shown_url(cfg.engine.url)}")
        try:
            return await open_backend(cfg.engine, self._stop, cfg.data_dir)
        except ModelUnavailable:
            if self._stop.is_set():
                return None
            raise
        except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
                ValueError) as exc:
            # [engine] names a model (not there, unreadable, not a model, not served), device or
            # dtype this machine cannot use: a config error (exit status 2, which the unit does
            # not restart every 5 s), said in one line.
            log.debug("the model did not load", exc_info=True)
            raise ConfigError(cfg.source, [f"[engine]: {exc}"]) from exc

    async def _start_admin(self) -> AdminServer | None:
        cfg = self.config.admin
        admin = AdminServer(self.metrics, self.health)
        try:
            await admin.start(cfg.host, cfg.port)
        except AdminPortInUse as exc:
            if not self.admin_optional:
                raise
            log.warning("[admin] port %d on %s is in use (another openclaw? see `ss -ltnp`): going "
                        "on without /healthz and /metrics; to serve them, set [admin] port = N (a "
                        "free one), or [admin] enabled = false to stop this warning", exc.port,
                        exc.host)
            return None
        log.info("admin port on http://%s:%d (/healthz, /metrics)", cfg.host, admin.port)
        return admin

    def _kept_users(self) -> set[str]:
        """Users retention never deletes: the ones the config (as reloaded) names."""
        return access.config_names(self.config)

    def health(self) -> dict[str, Any]:
        """/healthz: 200 when "ok"; "starting" until the start is done; "disconnected" while a
        connector the config enables has been disconnected longer than CONNECTOR_GRACE_S."""
        down = self._connector_watch.down() if self._connector_watch else {}
        report = {"status": "starting" if self.gateway is None else "disconnected" if down else "ok",
                  "pid": os.getpid(),  # `doctor` tells this data_dir's daemon from another's
                  "uptime_s": round(time.time() - self.started_at, 1),
                  # `connected` where a connector can tell (a service it keeps reconnecting to)
                  "connectors": {c.name: c.connected for c in self.connectors},
                  "queue": self.gateway.queue_length() if self.gateway else 0,
                  # How sandboxed commands' memory is bounded, as a whole or per process: `doctor`
                  # shows the running daemon's, whose cgroup is not the doctor's.
                  "command_memory": cgroups.describe(cgroups.default.available())}
        if down:
            report["disconnected_s"] = down  # which connectors, and for how long
        return report

    def _register_gauges(self) -> None:
        m = self.metrics
        m.gauge("openclaw_queue_length", self.gateway.queue_length, "messages waiting or answering")
        m.add_engine(self.model.stats, since=self.started_at)  # the engine's numbers, at each scrape
        kv_report.add_gauges(m, self.model.stats, lambda: self.config.agent.conversation_tokens(
            self.model.max_model_len))
        m.histogram("openclaw_time_to_first_token_seconds", help_text="a model call's first token")
        m.histogram("openclaw_turn_seconds", help_text="a message's whole answer, tools included")
        m.histogram("openclaw_tool_seconds", help_text="a tool call's run, after any approval")

    def _audit(self, registry: SkillRegistry) -> AuditSink:
        """The executor's audit: the store's row, and the tool-call metrics (alone: `counted`,
        for a row its caller stores with the call's result, skills.executor keep_audit)."""
        def counted(user: str, skill: str, arguments: Any, decision: str, **fields: Any) -> None:
            # The model names the skill: a label takes only the enabled ones, or it is unbounded.
            known = skill if skill in registry.names else "(unknown)"
            self.metrics.inc("openclaw_tool_calls_total", skill=known, decision=decision)
            if fields.get("duration_ms") is not None:
                self.metrics.observe("openclaw_tool_seconds", fields["duration_ms"] / 1000)

        async def audit(user: str, skill: str, arguments: Any, decision: str, **fields: Any) -> Any:
            counted(user, skill, arguments, decision, **fields)
            return await self.store.add_audit(user, skill, arguments, decision, **fields)

        audit.counted = counted  # type: ignore[attr-defined]
        return audit

    def request_stop(self) -> None:
        self._stop.set()

    def _hangup(self) -> None:
        if not self.hangup_reloads:
            self.request_stop()
        elif self._phase == "starting":  # READY=1 must not come before the start's end
            log.info("SIGHUP during start-up: the config is re-read once started")
            self._reload_pending = True
        elif self._phase == "stopping":
            log.info("SIGHUP while stopping: ignored")
        else:
            self._reload_task = asyncio.create_task(self.reload())

    async def reload(self, notify: bool = True) -> Outcome:
        """Re-read the config file and serve with it: access, roles, skills, the agent's and the
        sandbox's settings at once; a change that needs a restart is said and waits for one. A
        file that does not load changes nothing. The outcome is logged and left in data_dir for
        `openclaw reload`."""
        # No await from here to the end: two SIGHUPs in a row cannot interleave their reloads.
        if notify:
            systemd.reloading()
        try:
            outcome = self._reload()
        finally:
            if notify:
                systemd.ready()
        self.metrics.inc("openclaw_config_reloads_total", result="ok" if outcome.ok else "failed")
        level = logging.ERROR if not outcome.ok else (
            logging.WARNING if outcome.waiting else logging.INFO)
        log.log(level, "%s", outcome.summary(one_line=True))  # one journal entry
        try:
            write_outcome(self.config.data_dir, outcome)
        except OSError as exc:
            log.warning("could not write the reload's outcome for `openclaw reload`: %s", exc)
        if outcome.ok:  # after the outcome: the only awaits, idempotent if reloads overlap
            await self.gateway.access.retire_listed_codes()
            await self.scheduling.reconcile(self.config)  # [[jobs]] as the file says now
        return outcome

    def _reload(self) -> Outcome:
        source = str(self.config.source) if self.config.source else None
        before = _skill_set(self.gateway.agent.executor.registry)
        try:
            # The file the daemon started from; one started on the defaults reads the default
            # path, where `openclaw init` writes.
            loaded = load_config(self.config.source)
            config, applied, waiting = merge(self.config, loaded)
            # A model loaded only at the next start: said now, not then.
            if "engine" in waiting and (problems := model_file_problems(loaded.engine)):
                raise ConfigError(loaded.source, [
                    f"{p}; the daemon would not start with it" for p in problems])
            skills = configured_skills(config)
            if self.mcp is not None:  # [mcp] waits for a restart: the tools found at the start
                add_mcp_tools(skills, self.mcp)
            for line in skills.skipped:
                log.warning("skill %s", line)
            executor = executor_for(config, skills, self._audit(skills), self.reminders,
                                    self.scheduling.jobs, self.memory)
            self.gateway.agent.reconfigure(executor, config.agent)  # nothing changed if it raises
        except ConfigError as exc:
            return Outcome(False, problems=exc.problems, source=source)
        except ValueError as exc:  # the agent's budget does not fit the model
            return Outcome(False, problems=[str(exc)], source=source)
        except Exception as exc:  # a skill's own code failing to load: never the daemon's end
            log.exception("reloading the config failed")
            return Outcome(False, problems=[f"{type(exc).__name__}: {exc}"], source=source)
        if "skills" not in applied and _skill_set(skills) != before:
            # Same [skills] section, other skills: a SKILL.md added, removed or edited in `dirs`.
            applied = sorted([*applied, "skills"], key=RELOADABLE.index)
        self.config = config
        self.gateway.reconfigure(config)
        self.store.forget_prompt_snapshot()  # the prompt library is re-read too, at the next turn
        return Outcome(True, applied, waiting, source=source)

    async def wait_stop_requested(self) -> None:
        await self._stop.wait()

    async def run_until_stopped(self, drain_timeout: float = 30.0) -> None:
        """Serve until SIGTERM/SIGINT (or request_stop), then stop gracefully."""
        try:
            await self._stop.wait()
        finally:
            await self.stop(drain_timeout)

    async def stop(self, drain_timeout: float = 30.0) -> None:
        if self._lock is None:  # never started (or refused: another daemon holds data_dir)
            return
        systemd.stopping()
        self._phase = "stopping"
        self._stop.set()  # as a signal's stop: whatever waits for a model's server gives up now
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if self._reload_task:
            await self._reload_task
        if self.retention:  # ends after its batch in progress
            await self.retention.stop()
        if self.scheduling:  # what is not yet delivered stays due for the next start
            await self.scheduling.stop(drain_timeout)
        if self.memory:  # a consolidation cut short changed nothing
            await self.memory.stop()
        if self.gateway:  # an approval not yet taken up is, at the next start
            await self.gateway.welcomes.stop()
        if self.gateway:  # refuses new messages at once; replies still go out while it drains
            await self.gateway.drain(drain_timeout)
        for connector in self.connectors:
            try:
                await connector.stop()
            except Exception:
                log.exception("stopping the %s connector failed", connector.name)
        if self.gateway:  # what is still undelivered stays pending for the next start
            await self.gateway.outbox.close()
        if self._watchdog:
            self._watchdog.cancel()
        if self._loop_lag:
            self._loop_lag.cancel()
        if self._watching:
            self._watching.cancel()
        if self.admin:
            await self.admin.stop()
        if self.api:  # its requests in flight are aborted; before the engine shuts down
            await self.api.stop()
        if self.model is not None and self._owns_model:
            await self.model.close()
        if self.mcp is not None:  # after the drain: no call of a turn is left
            await self.mcp.close()
        if self.store:
            await self.store.close()
        # Only now: without a handler SIGHUP ends the process, mid-drain.
        loop.remove_signal_handler(signal.SIGHUP)
        if self._restore_exception_handler is not None:
            self._restore_exception_handler()
            self._restore_exception_handler = None
        if self._lock is not None:
            release_data_dir(self._lock)
            self._lock = None
        if self.freeze_heap:
            # Left frozen, the start's objects are never collected at exit: their cycles' finalizers
            # do not run, and Triton's bindings, which count theirs, print "leaked" warnings.
            gc.unfreeze()
        log.info("openclaw stopped")


def _skill_set(registry: SkillRegistry) -> set[tuple[str, str, str]]:
    """Each skill's name, where it comes from and what the model is told of it."""
    return {(name, str(registry.origin(name)), registry.get(name).description)
            for name in registry.names}
