"""This machine's zone as the clock keeps it (skills/zones.py MachineZone): TZ, when it names a
zone, counts at once; without it the zone files (/etc/timezone, /etc/localtime) are read at most
once a FILES_ZONE_SECONDS, and a change to them shows after that."""

from __future__ import annotations

from pathlib import Path

import pytest

from skills import zones
from skills.zones import FILES_ZONE_SECONDS, MachineZone


class _Machine:
    """The zone files in a folder of the test's, each read counted, and a MachineZone on a clock
    the test moves."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root, self.now, self.reads = root, 1000.0, 0
        self.timezone = root / "timezone"
        monkeypatch.setattr(zones, "Path", self._path)
        self.zone = MachineZone(clock=lambda: self.now)

    def _path(self, name: str) -> Path:
        assert name in ("/etc/timezone", "/etc/localtime"), name
        if name == "/etc/timezone":
            self.reads += 1
        return self.root / Path(name).name  # no localtime here: /etc/timezone decides


def test_tz_counts_at_once_even_with_the_files_zone_kept(tmp_path, monkeypatch) -> None:
    machine = _Machine(tmp_path, monkeypatch)
    machine.timezone.write_text("Asia/Tokyo\n")
    monkeypatch.delenv("TZ", raising=False)
    assert machine.zone.name() == "Asia/Tokyo"
    monkeypatch.setenv("TZ", "America/Lima")
    assert machine.zone.name() == "America/Lima"
    monkeypatch.setenv("TZ", ":Europe/Paris")
    assert machine.zone.name() == "Europe/Paris"
    monkeypatch.setenv("TZ", "Not/AZone")  # not a zone: the files' one, still kept
    assert machine.zone.name() == "Asia/Tokyo"
    assert machine.reads == 1


def test_the_files_zone_is_read_once_a_window_and_a_change_shows_after_it(tmp_path,
                                                                          monkeypatch) -> None:
    machine = _Machine(tmp_path, monkeypatch)
    monkeypatch.delenv("TZ", raising=False)
    machine.timezone.write_text("Asia/Tokyo\n")
    assert machine.zone.name() == "Asia/Tokyo"
    machine.timezone.write_text("Europe/Paris\n")
    machine.now += FILES_ZONE_SECONDS - 0.5
    assert machine.zone.name() == "Asia/Tokyo"  # within the window: not read again
    assert machine.reads == 1
    machine.now += 1
    assert machine.zone.name() == "Europe/Paris"
    assert machine.reads == 2
    machine.timezone.unlink()  # no zone in the files: UTC, kept the same way
    machine.now += FILES_ZONE_SECONDS
    assert machine.zone.name() == "UTC"
    machine.timezone.write_text("Asia/Tokyo\n")
    assert machine.zone.name() == "UTC"
    assert machine.reads == 3
