"""`[traces]`: what `openclaw traces export` redacts besides the config's own secrets."""

from __future__ import annotations

from openclaw.config.fields import Section


class TracesConfig(Section):
    """`[traces]`: the export of graded turns for fine-tuning (docs/traces.md)."""

    redact_paths: list[str] = []
    """Folders whose paths (and anything under them) an export replaces by "[PATH]", besides
    data_dir (the users' workspaces) and the roles' workspace folders, which always are."""
