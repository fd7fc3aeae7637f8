"""The label an assistant message keeps of the prompt versions that produced it (column
messages.prompt_version): "system=v3;tools=builtin", names sorted. A name answered without a
library entry is written with the stand-in of where its text came from (CONFIG, BUILTIN)."""

from __future__ import annotations

CONFIG = "config"  # "system" from the config's [agent] system_prompt
BUILTIN = "builtin"  # "tools" from the engine's built-in template
LABEL_CHARS = 160  # the column's width


def make_label(versions: dict[str, str]) -> str:
    """{"tools": "v1", "system": "v3"} -> "system=v3;tools=v1"."""
    for name, version in versions.items():
        if not name or not version or any(c in name + version for c in "=;"):
            raise ValueError(f"cannot label prompt {name!r} version {version!r}: "
                             "neither may be empty or hold '=' or ';'")
    label = ";".join(f"{name}={versions[name]}" for name in sorted(versions))
    if len(label) > LABEL_CHARS:
        raise ValueError(f"prompt label {label!r} is longer than {LABEL_CHARS} characters")
    return label


def parse_label(label: str) -> dict[str, str]:
    """"system=v3;tools=v1" -> {"system": "v3", "tools": "v1"}; "" (a message from before the
    library) -> {}. ValueError for text that is not a label."""
    if not label:
        return {}
    versions: dict[str, str] = {}
    for part in label.split(";"):
        name, sep, version = part.partition("=")
        if not sep or not name or not version or "=" in version or name in versions:
            raise ValueError(f"{label!r} is not a prompt label (like 'system=v3;tools=builtin')")
        versions[name] = version
    return versions
