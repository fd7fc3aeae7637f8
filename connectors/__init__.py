"""Messaging apps behind one protocol (base.py): terminal now; Telegram and Discord next."""
