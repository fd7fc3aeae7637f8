"""The daemon's side of reloading its config on SIGHUP (`systemctl reload openclaw`, `openclaw
reload`): which sections change at once, and the outcome it leaves in data_dir for `openclaw
reload` (openclaw/cli/reload.py) to print.

Access, roles, skills, the agent's settings and the sandbox's are read per message or per call, so
they change at once. The data folder, the engine, the store, the admin port and the connectors are
built once at start: a change to them is reported and waits for a restart; until then the daemon
goes on with the values it started with. A config that does not load changes nothing."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from openclaw.config import Config, ConfigError, cross_reference_problems

# "traces" is read by `openclaw traces export` from the file, each time: a change applies at once.
RELOADABLE = ("access", "agent", "roles", "sandbox", "skills", "jobs", "traces")
AT_RESTART = ("data_dir", "engine", "store", "admin", "serve", "telegram", "discord", "mcp",
              "memory")

OUTCOME_FILE = "reload.json"
_asked_early: list[int] = []  # SIGHUPs that came before the daemon's own handler was in


def keep_early_reloads() -> None:
    """From now until the daemon's start puts its own handler in, a SIGHUP (a reload asked for
    while the file is being read, or the model loads) is kept for the daemon to honour once
    started, instead of ending the process, which is its default action."""
    signal.signal(signal.SIGHUP, lambda signum, _frame: _asked_early.append(signum))


def asked_early() -> bool:
    """Whether a SIGHUP came before the daemon's handler was in (see keep_early_reloads); once."""
    asked = bool(_asked_early)
    _asked_early.clear()
    return asked


def merge(running: Config, loaded: Config) -> tuple[Config, list[str], list[str]]:
    """(the config to serve with now, the sections that changed and apply at once, the sections
    that changed and wait for a restart). ConfigError when the new sections do not fit the
    running ones (a folder granted over the data folder still in use)."""
    applied = [name for name in RELOADABLE if getattr(running, name) != getattr(loaded, name)]
    waiting = [name for name in AT_RESTART if getattr(running, name) != getattr(loaded, name)]
    if "data_dir" in waiting:  # the grants were checked against the new one, not the one in use
        problems = cross_reference_problems(running.data_dir, dict(loaded.roles), loaded.access.roles)
        if problems:
            raise ConfigError(loaded.source, problems)
    return loaded.model_copy(update={name: getattr(running, name) for name in AT_RESTART}), \
        applied, waiting


@dataclass
class Outcome:
    """What a reload did, as `openclaw reload` prints it."""

    ok: bool
    applied: list[str] = field(default_factory=list)  # sections in effect now
    waiting: list[str] = field(default_factory=list)  # sections changed, in effect at restart
    problems: list[str] = field(default_factory=list)  # why nothing changed (ok is False)
    source: str | None = None
    pid: int = field(default_factory=os.getpid)
    at: float = field(default_factory=time.time)

    def summary(self, one_line: bool = False) -> str:
        """What happened, a line each; `one_line` (a log entry): "; " between them."""
        where = self.source or "the defaults (no config file)"
        if not self.ok:
            head = f"config not reloaded from {where}; the daemon goes on with the one it has:"
            items = list(self.problems)
            if any("environment variable" in p for p in self.problems):
                items.append("(`env:` secrets come from the daemon's own environment, the one it "
                             "started with: a variable exported in this shell does not reach it; set "
                             "it where the service gets it, e.g. Environment= in the unit, and "
                             "restart, or use file:PATH)")
            return head + (" " + "; ".join(items) if one_line else
                           "".join(f"\n  {item}" for item in items))
        lines = [f"config reloaded from {where}: " + (
            f"{_sections(self.applied)} in effect now" if self.applied else "no change in effect now")]
        if self.waiting:
            lines.append(f"changed but in effect only after a restart of the daemon: "
                         f"{_sections(self.waiting)}")
        return ("; " if one_line else "\n").join(lines)


def _sections(names: list[str]) -> str:
    return ", ".join(name if name == "data_dir" else f"[{name}]" for name in names)


def write_outcome(data_dir: Path, outcome: Outcome) -> None:
    """Replace the outcome file in one step: `openclaw reload` never reads half of one."""
    with tempfile.NamedTemporaryFile("w", dir=data_dir, prefix=".reload-", delete=False) as tmp:
        json.dump(asdict(outcome), tmp)
    os.replace(tmp.name, data_dir / OUTCOME_FILE)


def read_outcome(data_dir: Path) -> Outcome | None:
    try:
        return Outcome(**json.loads((data_dir / OUTCOME_FILE).read_text()))
    except (OSError, ValueError, TypeError):  # none yet, or not one of ours
        return None
