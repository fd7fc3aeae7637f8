"""What the daemon last learnt of each model server it used: the model's id and its context
length, per URL, in data_dir. With them a daemon restarted while its server is down still starts
(each turn then waits for the server), where it would otherwise wait for the server to start."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import NamedTuple

from openclaw.backends.http import shown_url

log = logging.getLogger(__name__)

FILE = "model_servers.json"


class Learnt(NamedTuple):
    model: str
    context_length: int


class ServerMemory:
    """The file in `data_dir`: {url: {"model", "context_length"}}. The URL is kept as messages
    show it, without a credential (shown_url); the file is the owner's alone (0600)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / FILE

    def recall(self, url: str, model: str | None) -> Learnt | None:
        """What was learnt of `url`, if it was `model` (any model, when None)."""
        entry = self._read().get(shown_url(url))
        if not isinstance(entry, dict):
            return None
        name, length = entry.get("model"), entry.get("context_length")
        if not isinstance(name, str) or not isinstance(length, int) or isinstance(length, bool) \
                or length < 1 or model not in (None, name):
            return None
        return Learnt(name, length)

    def remember(self, url: str, model: str, context_length: int) -> None:
        """Keep what `url` said, replacing the file in one step. A failure is logged: the daemon
        runs on without it."""
        known = self._read()
        known[shown_url(url)] = {"model": model, "context_length": context_length}
        tmp = None
        try:
            with tempfile.NamedTemporaryFile("w", dir=self.path.parent, prefix=".model-servers-",
                                             delete=False) as tmp:  # created 0600
                json.dump(known, tmp, indent=1)
            os.replace(tmp.name, self.path)
        except OSError as exc:
            if tmp is not None:
                Path(tmp.name).unlink(missing_ok=True)
            log.warning("could not keep what the model's server said in %s (%s): a start while "
                        "it is down will wait for it", self.path, exc)

    def _read(self) -> dict:
        try:
            known = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring %s, which cannot be read (%s)", self.path, exc)
            return {}
        return known if isinstance(known, dict) else {}
