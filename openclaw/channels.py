"""The connectors the config enables, built from their config sections.

Connectors import nothing of `openclaw` but the gateway types, so what they need from the config is
handed to them here as plain values: tokens already resolved, URLs, timings.
"""

from __future__ import annotations

from openclaw.config import Config, ConfigError
from openclaw.gateway.contract import Connector


def configured_connectors(config: Config) -> list[Connector]:
    """Telegram and Discord, each when enabled; the terminal or console is added by the CLI."""
    connectors: list[Connector] = []
    if config.telegram.enabled:
        connectors.append(_telegram(config))
    if config.discord.enabled:
        connectors.append(_discord(config))
    return connectors


def disabled_with_token(config: Config) -> list[tuple[str, str]]:
    """(what, fix) for each connector whose token is set but which is off: a token set and no bot
    answering is what a user who forgot the switch sees."""
    where = f" in {config.source}" if config.source else ""
    return [(f"{name}: a token is set but the connector is not enabled",
             f"add `enabled = true` under [{name}]{where}")
            for name in ("telegram", "discord")
            if getattr(config, name).token is not None and not getattr(config, name).enabled]


def _telegram(config: Config) -> Connector:
    from connectors.telegram import TelegramConnector  # imports python-telegram-bot only when used

    section = config.telegram
    if section.webhook_url is not None:
        raise ConfigError(config.source, [
            f'telegram.webhook_url = "{section.webhook_url}": webhooks are not supported yet; remove '
            "the key to use long polling, which needs no open port"])
    return TelegramConnector(section.token.get(), base_url=section.base_url,
                             base_file_url=section.base_file_url, max_file_bytes=_bytes(section.max_file_mb))


def _discord(config: Config) -> Connector:
    from connectors.discord import DiscordConnector  # discord.py is imported only when enabled

    section = config.discord
    return DiscordConnector(section.token.get(), api_base=section.api_base,
                            gateway_url=section.gateway_url, max_file_bytes=_bytes(section.max_file_mb))


def _bytes(megabytes: float) -> int:
    return int(megabytes * 1024 * 1024)
