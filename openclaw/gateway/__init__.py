"""The gateway: every message in and every reply out passes here. gateway.py admits (access.py),
stores, then answers a command (commands.py) or queues a turn (turn.py) on the conversation's lane
(lanes.py); replies leave through the outbox (outbox.py); due.py delivers due reminders.
contract.py is all that connectors know of the daemon."""
