"""The types connectors and the gateway exchange. Connectors import these and nothing else of
`openclaw`, so dependencies point one way."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The last line of a request to approve a tool call (openclaw.approvals): a connector that can show
# buttons finds the request's number here and offers "/approve N" and "/deny N" as taps.
APPROVAL_ASKED = re.compile(r"Reply /approve (\d+) to allow it or /deny \1 to refuse\.\Z")


def approval_asked(number: int) -> str:
    """The line that ends a request to approve a tool call (see APPROVAL_ASKED)."""
    return f"Reply /approve {number} to allow it or /deny {number} to refuse."


@dataclass(frozen=True)
class InboundMessage:
    channel: str  # "terminal" | "telegram" | "discord"
    user_id: str  # the app's user id, as text
    chat_id: str  # where to answer (a DM or a group)
    message_id: str  # unique per channel: the dedupe key
    text: str
    display_name: str | None = None
    is_group: bool = False
    # Files the user sent, as the connector names them: it fetches each (fetch_attachment) into the
    # user's workspace only once the gateway admitted the user and the turn runs.
    attachments: list[str] = field(default_factory=list)
    # A fixed answer instead of the model's, for what the agent cannot take yet (a voice note):
    # sent after access control and storage, like any reply.
    notice: str | None = None

    @property
    def user(self) -> str:
        """The user's name in config and store: "channel:id"."""
        return f"{self.channel}:{self.user_id}"
