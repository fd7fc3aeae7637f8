"""What /healthz says of the connectors: one that the config enables and that stays disconnected
past a grace period makes the daemon unhealthy (503), and the report names it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from openclaw.config import Config
from openclaw.gateway.contract import Connector

# A reconnect after a network blip or a restart of the service takes seconds; the Telegram
# connector's longest backoff is 60 s, so two failed tries in a row at it is the edge of a normal
# reconnect. Longer, and that channel's users are not being answered: the daemon says so.
CONNECTOR_GRACE_S = 120.0
SAMPLE_EVERY_S = 1.0


def enabled_connectors(config: Config, connectors: Sequence[Connector]) -> list[Connector]:
    """The connectors of the services the config enables. Not the console's nor the terminal's:
    their `connected` says whether someone is attached, which is no fault."""
    enabled = {name for name, on in (("telegram", config.telegram.enabled),
                                     ("discord", config.discord.enabled)) if on}
    return [c for c in connectors if c.name in enabled]


class ConnectorWatch:
    """Since when each watched connector has been disconnected, sampled every second (a scrape
    every minute would miss when an outage began)."""

    def __init__(self, connectors: Sequence[Connector], grace_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.connectors = list(connectors)
        self.grace_s = CONNECTOR_GRACE_S if grace_s is None else grace_s
        self._clock = clock
        self._down_since: dict[str, float] = {}

    def sample(self) -> None:
        now = self._clock()
        for connector in self.connectors:
            if connector.connected:
                self._down_since.pop(connector.name, None)
            else:
                self._down_since.setdefault(connector.name, now)

    def down(self) -> dict[str, float]:
        """The connectors disconnected for longer than the grace: name -> seconds disconnected."""
        self.sample()
        now = self._clock()
        return {name: round(now - since, 1) for name, since in sorted(self._down_since.items())
                if now - since > self.grace_s}

    async def follow(self, every_s: float = SAMPLE_EVERY_S) -> None:
        """Sample until cancelled."""
        while True:
            self.sample()
            await asyncio.sleep(every_s)
