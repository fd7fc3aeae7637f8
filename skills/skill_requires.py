"""What a SKILL.md skill needs to be offered, as OpenClaw gates it: `metadata.openclaw.requires`
(`bins`: every program on PATH; `anyBins`: one of them; `env`: every variable set and not empty)
and `os` (the systems it runs on). A skill that lacks one is left out: its instructions would have
the model call a program that is not there, or a service without its key.

`metadata` is YAML or, as OpenClaw's registry writes it, a JSON string; `clawdbot` and `clawdis`
are older names of `openclaw`. `requires.config` names keys of OpenClaw's own config file, which
has no counterpart here, so it is not checked."""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any

_KEYS = ("openclaw", "clawdbot", "clawdis")


def unmet(meta: dict[str, Any]) -> list[str]:
    """Why the skill with this front matter cannot work here (empty: it can); ValueError naming
    the key when its metadata is malformed."""
    gate = _gate(meta)
    if not gate:
        return []
    requires = gate.get("requires") or {}
    if not isinstance(requires, dict):
        raise ValueError(f"metadata.{_key(meta)}.requires must be a mapping (bins, anyBins, env)")
    why = []
    systems = _names(gate, "os", meta)
    if systems and sys.platform not in systems:
        why.append(f"runs on {', '.join(systems)} only, not {sys.platform}")
    why += [f"needs the program {name}, not found on PATH"
            for name in _names(requires, "bins", meta, "requires.") if shutil.which(name) is None]
    any_of = _names(requires, "anyBins", meta, "requires.")
    if any_of and not any(shutil.which(name) for name in any_of):
        why.append(f"needs one of the programs {', '.join(any_of)}, none found on PATH")
    why += [f"needs the environment variable {name}, which is not set"
            for name in _names(requires, "env", meta, "requires.") if not os.environ.get(name)]
    return why


def _gate(meta: dict[str, Any]) -> dict[str, Any]:
    metadata = meta.get("metadata")
    if isinstance(metadata, str):  # the agentskills spec's string values: maybe JSON, maybe prose
        try:
            metadata = json.loads(metadata)
        except ValueError:
            return {}
    if not isinstance(metadata, dict):
        return {}
    key = next((k for k in _KEYS if k in metadata), None)
    if key is None:
        return {}
    gate = metadata[key]
    if isinstance(gate, str):
        try:
            gate = json.loads(gate)
        except ValueError as exc:
            raise ValueError(f"metadata.{key} is not valid JSON: {exc}") from None
    if gate is None:
        return {}
    if not isinstance(gate, dict):
        raise ValueError(f"metadata.{key} must be a mapping (requires, os, ...)")
    return gate


def _key(meta: dict[str, Any]) -> str:
    metadata = meta.get("metadata")
    if isinstance(metadata, str):
        metadata = json.loads(metadata)
    return next(k for k in _KEYS if k in metadata)


def _names(table: dict[str, Any], field: str, meta: dict[str, Any], prefix: str = "") -> list[str]:
    """The names listed under `field`: a list of strings, or one string."""
    value = table.get(field)
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"metadata.{_key(meta)}.{prefix}{field} must be a list of names, got "
                         f"{json.dumps(value)[:80]}")
    return [v.strip() for v in value]
