"""The `openclaw` command: main.py builds the parser and runs a command; each command group
(users, pairing, db, reminders, skills, doctor, service, reload, chat) is a module of its own."""

from openclaw.cli.main import main

__all__ = ["main"]
