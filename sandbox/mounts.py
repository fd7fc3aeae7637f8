"""The mount table this process sees: /proc/self/mountinfo, one line per mount."""

from __future__ import annotations

import re
from dataclasses import dataclass

MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class Mount:
    point: str  # where it is mounted
    fstype: str  # "ext4", "cgroup2", ...
    options: frozenset[str]  # the filesystem's own (super) options: "memory" on a cgroup v1 one


def mounts(table: str = MOUNTINFO) -> list[Mount]:
    """Every mount in `table`; [] when it cannot be read. A line is: id, parent, dev, root, mount
    point, mount options, optional fields, "-", fstype, source, super options."""
    try:
        with open(table, encoding="utf-8", errors="surrogateescape") as lines:
            found = []
            for line in lines:
                fields = line.rstrip("\n").split(" ")
                if "-" not in fields[6:] or len(fields) < 10:
                    continue
                sep = fields.index("-", 6)
                found.append(Mount(_unescape(fields[4]), fields[sep + 1],
                                   frozenset(fields[sep + 3].split(",")) if len(fields) > sep + 3
                                   else frozenset()))
            return found
    except OSError:
        return []


def _unescape(field: str) -> str:
    """Spaces, tabs, newlines and backslashes in a path are written as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
