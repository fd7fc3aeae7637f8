"""The chart of `openclaw prompts report --plot`: each variant's success rate with its 95%
interval, as a PNG. matplotlib is optional (the `plot` extra): imported only here, when asked."""

from __future__ import annotations

from pathlib import Path

from openclaw.traces.report import VariantStats


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def plot_success(stats: list[VariantStats], name: str, path: Path) -> None:
    """Write the chart to `path` (PNG). Variants with no rated turn are shown without a bar."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: a file only
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'openclaw-py[plot]' "
                              "(or pip install matplotlib)") from None
    labels = [f"{s.variant}\n(n={s.good + s.bad})" for s in stats]
    rates = [100 * s.success if s.success is not None else 0.0 for s in stats]
    below = [100 * (s.success - s.interval[0]) if s.interval and s.success is not None else 0.0
             for s in stats]
    above = [100 * (s.interval[1] - s.success) if s.interval and s.success is not None else 0.0
             for s in stats]
    figure, axes = plt.subplots(figsize=(max(4.0, 1.4 * len(stats) + 2), 4))
    try:
        axes.bar(labels, rates, yerr=[below, above], capsize=6, color="#4c78a8")
        axes.set_ylim(0, 100)
        axes.set_ylabel("success rate, % (good / rated), 95% CI")
        axes.set_title(f"prompt {name!r} by variant")
        figure.tight_layout()
        figure.savefig(path, format="png")
    finally:
        plt.close(figure)
