"""Counters, sums and gauges, rendered in Prometheus' text format for the admin port's /metrics.

Small on purpose: a dict of series, no client library. Gauges are read from callbacks at scrape
time (queue length, KV usage), so they are never stale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]


@dataclass
class Metrics:
    counters: dict[tuple[str, Labels], float] = field(default_factory=dict)
    summaries: dict[str, list[float]] = field(default_factory=dict)  # name -> [count, sum]
    gauges: dict[str, Callable[[], float]] = field(default_factory=dict)
    help: dict[str, str] = field(default_factory=dict)

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        self.counters[key] = self.counters.get(key, 0.0) + value

    def observe(self, name: str, value: float) -> None:
        count_sum = self.summaries.setdefault(name, [0.0, 0.0])
        count_sum[0] += 1
        count_sum[1] += value

    def gauge(self, name: str, read: Callable[[], float], help_text: str = "") -> None:
        self.gauges[name] = read
        if help_text:
            self.help[name] = help_text

    def value(self, name: str, **labels: str) -> float:
        return self.counters.get((name, tuple(sorted(labels.items()))), 0.0)

    def render(self) -> str:
        lines: list[str] = []
        for name in sorted({n for n, _ in self.counters}):
            lines.append(f"# TYPE {name} counter")
            for (n, labels), value in sorted(self.counters.items()):
                if n == name:
                    lines.append(f"{name}{_labels(labels)} {value:g}")
        for name, (count, total) in sorted(self.summaries.items()):
            lines += [f"# TYPE {name} summary", f"{name}_count {count:g}", f"{name}_sum {total:g}"]
        for name, read in sorted(self.gauges.items()):
            if name in self.help:
                lines.append(f"# HELP {name} {self.help[name]}")
            try:
                value = float(read())
            except Exception:  # a gauge that cannot be read is left out, not a failed scrape
                continue
            lines += [f"# TYPE {name} gauge", f"{name} {value:g}"]
        return "\n".join(lines) + "\n"


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
