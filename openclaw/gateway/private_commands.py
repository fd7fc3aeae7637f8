"""/private: a user's opt-out of the traces kept to grade and improve the agent (openclaw/traces).

    /private on    no trace is kept of your turns from now on; none of yours is exported
    /private off   your turns are traced again (for `openclaw traces export`)
    /private       which it is now

While private, nothing of the user's turns goes into the `traces` table at all (the conversation
itself is kept as before: it is the agent's memory), and the traces kept before `/private on`
are left out of every export: the export asks the user's choice as it runs, so after
`/private off` those are exportable again, and the turns between were never traced.
"""

from __future__ import annotations

from openclaw.gateway.contract import InboundMessage
from openclaw.store import Store

PRIVATE_COMMANDS = ("/private",)
PRIVATE_USAGE = "Use /private on, /private off, or /private to see which it is."
ON = ("Private is on: I keep no trace of your turns for improving the assistant, and none of "
      "yours is ever exported. Our conversation is kept as before (/new starts a fresh one).")
OFF = ("Private is off: your turns are traced, graded and may be exported to improve the "
       "assistant (secrets and private paths redacted). /private on stops it.")


async def answer_private(store: Store, msg: InboundMessage, argument: str) -> str:
    """The reply to /private [on|off]."""
    word = argument.strip().lower()
    if word in ("on", "off"):
        if not await store.set_private(msg.user, word == "on"):
            return "I have no record of you yet to change; send me a message first."
        return ON if word == "on" else OFF
    if word:
        return PRIVATE_USAGE
    return ON if await store.is_private(msg.user) else OFF
