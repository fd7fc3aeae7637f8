"""Messaging apps as adapters of the gateway's Connector (openclaw/gateway/contract.py): the
terminal, the console socket, Telegram and Discord, with what they share (drafts, attachments,
downloads)."""
