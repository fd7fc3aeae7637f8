"""Metrics.inc keeps each counter's label children found (openclaw/metrics.py): counts still add up
per label set (label names in any order, past MAX_CHILDREN too), and a name still refuses label
names other than its first, even with values a kept child has."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from openclaw import metrics as metrics_module
from openclaw.metrics import Metrics

TURNS = "openclaw_turns_total"


def test_counts_add_up_per_label_set_in_the_registry() -> None:
    m = Metrics()
    for _ in range(3):
        m.inc(TURNS, result="answered")
    m.inc(TURNS, 2.5, result="refused")
    m.inc(TURNS, result="answered")
    m.inc("openclaw_plain_total")
    m.inc("openclaw_plain_total", 4)
    m.inc("openclaw_pair_total", kind="a", lane="x")
    m.inc("openclaw_pair_total", lane="x", kind="a")  # the same child, its labels in another order
    m.inc("openclaw_pair_total", lane="y", kind="a")
    value = m.registry.get_sample_value
    assert value(TURNS, {"result": "answered"}) == 4
    assert value(TURNS, {"result": "refused"}) == 2.5
    assert value("openclaw_plain_total") == 5
    assert value("openclaw_pair_total", {"kind": "a", "lane": "x"}) == 2
    assert value("openclaw_pair_total", {"kind": "a", "lane": "y"}) == 1
    assert b'openclaw_turns_total{result="answered"} 4.0' in generate_latest(m.registry)


def test_other_label_names_are_refused_even_with_a_kept_childs_values() -> None:
    m = Metrics()
    m.inc(TURNS, result="answered")
    m.inc(TURNS, result="answered")  # its child kept now
    with pytest.raises(ValueError):
        m.inc(TURNS, outcome="answered")
    with pytest.raises(ValueError):
        m.inc(TURNS)
    with pytest.raises(ValueError):
        m.inc(TURNS, result="answered", extra="x")
    m.inc("openclaw_plain_total")
    with pytest.raises(ValueError):
        m.inc("openclaw_plain_total", result="answered")
    assert m.registry.get_sample_value(TURNS, {"result": "answered"}) == 2
    assert m.registry.get_sample_value(TURNS, {"outcome": "answered"}) is None
    assert m.registry.get_sample_value("openclaw_plain_total") == 1


def test_label_sets_past_the_kept_children_still_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_module, "MAX_CHILDREN", 3)
    m = Metrics()
    for _ in range(3):
        for i in range(10):
            m.inc(TURNS, result=f"r{i}")
    assert [m.registry.get_sample_value(TURNS, {"result": f"r{i}"}) for i in range(10)] == [3] * 10
    with pytest.raises(ValueError):
        m.inc(TURNS, outcome="r9")  # a label set never kept, refused all the same
