"""The connectors the config enables, built from their config sections.

Connectors import nothing of `openclaw` but the gateway types, so what they need from the config is
handed to them here as plain values: tokens already resolved, URLs, and `workspace_for`, which maps
a "channel:id" user to the folder where their uploaded files go.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from openclaw.config import Config, ConfigError

WorkspaceFor = Callable[[str], Path]


def configured_connectors(config: Config, workspace_for: WorkspaceFor) -> list:
    """Telegram and Discord, each when enabled; the terminal or console is added by the CLI."""
    connectors = []
    if config.telegram.enabled:
        connectors.append(_telegram(config, workspace_for))
    if config.discord.enabled:
        connectors.append(_discord(config, workspace_for))
    return connectors


def _telegram(config: Config, workspace_for: WorkspaceFor):
    raise ConfigError(config.source, [
        "telegram.enabled = true: the telegram connector is not part of this release yet; set it to false"])


def _discord(config: Config, workspace_for: WorkspaceFor):
    raise ConfigError(config.source, [
        "discord.enabled = true: the discord connector is not part of this release yet; set it to false"])


def default_workspace_for(config: Config) -> WorkspaceFor:
    """Each user's workspace folder under the data dir (created on first use)."""
    def workspace_for(user: str) -> Path:
        folder = config.data_dir / "workspaces" / user.replace(":", "-").replace("/", "_")
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        return folder
    return workspace_for
