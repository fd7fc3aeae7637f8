"""The built-in `email` skill: skill.py (schema, approval prompt), settings.py ([skills.email]),
addresses.py (parsing, no header injection), smtp.py (sending), imap.py (reading, read-only) and
render.py (a message as text for the model)."""

from skills.builtin.email.skill import EmailSkill

__all__ = ["EmailSkill"]
