"""The column types every table of the store uses (models.py): ids, aware UTC datetimes, enums as
text, and free text and JSON made storable on both backends."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import JSON, BigInteger, CheckConstraint, DateTime, Integer, String, Text
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

# SQLite only autoincrements an INTEGER PRIMARY KEY; PostgreSQL gets 64-bit ids.
Id = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in and out. SQLite keeps no zone, so it stores naive UTC text."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r} given to the store; pass an aware (UTC) one")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class EnumText(TypeDecorator[StrEnum]):
    """A StrEnum stored as its plain string value (a CHECK constraint guards the column)."""

    impl = String(16)
    cache_ok = True

    def __init__(self, enum: type[StrEnum]):
        super().__init__()
        self.enum = enum

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else self.enum(value).value

    def process_result_value(self, value: str | None, dialect: Dialect) -> StrEnum | None:
        return None if value is None else self.enum(value)


def one_of(column: str, enum: type[StrEnum]) -> CheckConstraint:
    """A CHECK that `column` holds one of `enum`'s values, named after the column."""
    values = ", ".join(f"'{e.value}'" for e in enum)
    return CheckConstraint(f"{column} IN ({values})", name=column)


# U+0000, which PostgreSQL's text and jsonb refuse, and lone surrogates (U+D800-U+DFFF), which
# no UTF-8 encoder takes (SQLite's neither): a str holds one after json.loads of a "\ud800"
# escape, or decoding with errors="surrogateescape".
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(value: Any) -> Any:
    """`value` with what no backend can store made U+FFFD, in strings and inside JSON, so that
    such a character (a command's binary output, a name) cannot fail a write, and both backends
    keep the same text."""
    if isinstance(value, str):
        return _UNSTORABLE.sub("\ufffd", value) if _UNSTORABLE.search(value) else value
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable(v) for v in value]
    return value


class FreeText(TypeDecorator[str]):
    """Text from people, models and programs (see storable)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return storable(value)


class FreeString(FreeText):
    """A bounded FreeText: FreeString(256)."""

    impl = String
    cache_ok = True


class FreeJson(FreeText):
    """JSON of free text (see storable)."""

    impl = JSON
    cache_ok = True


# JSON columns keep Python None as SQL NULL, not the JSON text 'null'.
Json = FreeJson(none_as_null=True)
