"""The slash commands the Discord connector registers: each hands the text form of the command
("/remind in 2 hours tea") to the connector's handler, which the gateway answers as if typed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import discord
from discord import app_commands

OnSlash = Callable[[discord.Interaction, str], Awaitable[None]]

SLASH_COMMANDS = {
    "new": "Archive this conversation and start a fresh one",
    "stop": "Stop the answer being generated (and any running tool)",
    "status": "Model, queue, KV cache use, tokens used today",
    "help": "What the assistant's commands do",
    "audit": "Your last tool calls and how they ended",
    "jobs": "Your scheduled jobs (type /jobs cancel N to cancel one)",
    "memory": "What I keep of you (type /memory forget N, off or on)",
    "heartbeat": "Your heartbeat (type /heartbeat on, off, every 30m, ...)",
    "private": "Whether I keep traces of your turns (type /private on or off)",
    "good": "Grade my last reply to you as good", "bad": "Grade my last reply to you as bad",
}
# Answers to a tool call waiting for the user's approval; the number is the request's.
NUMBERED_COMMANDS = {
    "approve": "Allow the tool call with this number to run",
    "deny": "Refuse the tool call with this number",
}


def slash_commands(on_slash: OnSlash) -> list[app_commands.Command]:
    """Every command, each calling `on_slash(interaction, its text form)`."""
    return [*(_plain(on_slash, name, text) for name, text in SLASH_COMMANDS.items()),
            *(_numbered(on_slash, name, text) for name, text in NUMBERED_COMMANDS.items()),
            _remind(on_slash), _reminders(on_slash), _sh(on_slash), _run(on_slash)]


def _plain(on_slash: OnSlash, name: str, description: str) -> app_commands.Command:
    async def callback(interaction: discord.Interaction) -> None:
        await on_slash(interaction, f"/{name}")

    return app_commands.Command(name=name, description=description, callback=callback)


def _numbered(on_slash: OnSlash, name: str, description: str) -> app_commands.Command:
    async def callback(interaction: discord.Interaction, number: int) -> None:
        await on_slash(interaction, f"/{name} {number}")

    return app_commands.Command(name=name, description=description, callback=callback)


def _remind(on_slash: OnSlash) -> app_commands.Command:
    async def callback(interaction: discord.Interaction, what: str) -> None:
        await on_slash(interaction, f"/remind {what}")

    return app_commands.Command(
        name="remind", description="Remind you, e.g. in 20 minutes stretch", callback=callback)


def _reminders(on_slash: OnSlash) -> app_commands.Command:
    async def callback(interaction: discord.Interaction, cancel: int | None = None) -> None:
        await on_slash(interaction, "/reminders" + (f" cancel {cancel}" if cancel else ""))

    return app_commands.Command(
        name="reminders", description="Your reminders in this channel; cancel: the one to cancel",
        callback=callback)


def _sh(on_slash: OnSlash) -> app_commands.Command:
    async def callback(interaction: discord.Interaction, command: str) -> None:
        await on_slash(interaction, f"/sh {command}")

    return app_commands.Command(name="sh", description="Run a shell command yourself",
                                callback=callback)


def _run(on_slash: OnSlash) -> app_commands.Command:
    async def callback(interaction: discord.Interaction, skill: str, arguments: str = "") -> None:
        await on_slash(interaction, f"/run {skill} {arguments}".rstrip())

    return app_commands.Command(
        name="run", description='Call a skill yourself; arguments: {"key": "value"} or key=value',
        callback=callback)
