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
    from connectors.telegram import TelegramConnector  # imports python-telegram-bot only when used

    section = config.telegram
    if section.webhook_url is not None:
        raise ConfigError(config.source, [
            f'telegram.webhook_url = "{section.webhook_url}": webhooks are not supported yet; remove '
            "the key to use long polling, which needs no open port"])
    return TelegramConnector(section.token.get(), workspace_for=workspace_for,
                             base_url=section.base_url, base_file_url=section.base_file_url)


def _discord(config: Config, workspace_for: WorkspaceFor):
    from connectors.discord import DiscordConnector  # discord.py is imported only when enabled

    section = config.discord
    return DiscordConnector(section.token.get(), api_base=section.api_base,
                            gateway_url=section.gateway_url)


def default_workspace_for(config: Config) -> WorkspaceFor:
    """Each user's workspace, as the sandbox policy places it (created on first use)."""
    policy = config.policy()
    return lambda user: policy.principal(user).workspace
