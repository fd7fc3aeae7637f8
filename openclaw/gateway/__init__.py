"""The gateway: every message in and every reply out passes here (see gateway.py); contract.py is
all that connectors know of the daemon."""
