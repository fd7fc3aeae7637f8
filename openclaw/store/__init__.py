"""The daemon's store: SQLAlchemy 2 async over SQLite (WAL) or PostgreSQL, migrated by Alembic.

    store = await Store.open("sqlite+aiosqlite:///~/.local/share/openclaw/openclaw.db")
    user = await store.ensure_user("telegram", 1001, "Ada")
    conv = await store.active_conversation(user.key, chat_id=1001)

`Store.open` applies pending migrations first; `upgrade(url)` does only that (`openclaw db upgrade`).
"""

from openclaw.store.engine import create_engine, normalize_url
from openclaw.store.migrate import (
    current_revision,
    head_revision,
    known_revisions,
    migrate,
    migrations_dir,
    upgrade,
)
from openclaw.store.records import (
    AuditEntry,
    Conversation,
    ConversationStatus,
    InboundEvent,
    InboundStatus,
    Job,
    JobKind,
    JobRun,
    JobStatus,
    Message,
    MessageRole,
    OutboundMessage,
    OutboundStatus,
    PairingCode,
    PairingLimits,
    PairingRefusal,
    PairingRefusalReason,
    PairingRequest,
    Reminder,
    ReminderStatus,
    StoreUnavailableError,
    Summary,
    UnknownUserError,
    User,
    UserStatus,
    parse_user_key,
    user_key,
)
from openclaw.store.store import Store
from openclaw.store.users import PAIRING_ALPHABET, new_pairing_code, normalize_pairing_code

__all__ = [
    "PAIRING_ALPHABET",
    "AuditEntry",
    "Conversation",
    "ConversationStatus",
    "InboundEvent",
    "InboundStatus",
    "Job",
    "JobKind",
    "JobRun",
    "JobStatus",
    "Message",
    "MessageRole",
    "OutboundMessage",
    "OutboundStatus",
    "PairingCode",
    "PairingLimits",
    "PairingRefusal",
    "PairingRefusalReason",
    "PairingRequest",
    "Reminder",
    "ReminderStatus",
    "Store",
    "StoreUnavailableError",
    "Summary",
    "UnknownUserError",
    "User",
    "UserStatus",
    "create_engine",
    "current_revision",
    "head_revision",
    "known_revisions",
    "migrate",
    "migrations_dir",
    "new_pairing_code",
    "normalize_pairing_code",
    "normalize_url",
    "parse_user_key",
    "upgrade",
    "user_key",
]
