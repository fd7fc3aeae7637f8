"""Listing and reading a mailbox over IMAP (the stdlib imaplib, in a thread, within the time limit).
Mailboxes are opened read-only and bodies fetched with BODY.PEEK: nothing here changes flags or
contents. Mailbox names travel in IMAP's modified UTF-7 (utf7_encode, utf7_decode)."""

from __future__ import annotations

import asyncio
import base64
import imaplib
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from skills.base import SkillContext, SkillError
from skills.builtin.email.addresses import refuse_control
from skills.builtin.email.render import message_text, row
from skills.builtin.email.settings import Server, server, tls_context

LIST_DEFAULT, LIST_MAX = 10, 50
READ_FETCH_BYTES = 2 << 20  # of a message, fetched from the server (attachments beyond are not named)
# All one call reads from the server: a fetched message (the server may ignore the partial fetch
# and announce a literal of any size, which imaplib would read whole), listed headers and replies.
IMAP_CALL_BYTES = 8 << 20

_T = TypeVar("_T")


async def list_messages(args: dict[str, Any], ctx: SkillContext) -> str:
    imap = server(ctx.settings, "imap", "reading email")
    mailbox = _mailbox_arg(args)
    count = args.get("count", LIST_DEFAULT)
    if count < 1:
        raise SkillError(f"'count' must be at least 1, got {count}")
    count = min(count, LIST_MAX)
    search = args.get("search") or None
    if search is not None:
        refuse_control(search, "the search text")
    unseen = bool(args.get("unseen_only"))
    total, rows = await _in_thread(imap, lambda conn: _list_sync(conn, mailbox, count, unseen, search))
    which = " unseen" if unseen else ""
    matching = f" containing {search!r}" if search else ""
    ctx.audit.detail = f"listed {len(rows)} of {total} in {mailbox}"
    if not rows:
        return f"{mailbox}: no{which} messages{matching}"
    head = f"{mailbox}: the {len(rows)} most recent of {total}{which} messages{matching}, newest first:"
    return "\n".join([head, *rows])


async def read_message(args: dict[str, Any], ctx: SkillContext) -> str:
    imap = server(ctx.settings, "imap", "reading email")
    mailbox, uid = _mailbox_arg(args), args["uid"]
    if uid < 1:
        raise SkillError(f"'uid' must be a positive number from the list action, got {uid}")
    size, raw = await _in_thread(imap, lambda conn: _read_sync(conn, mailbox, uid))
    ctx.audit.detail = f"read uid {uid} in {mailbox}"
    return message_text(raw, uid, size)


def _mailbox_arg(args: dict[str, Any]) -> str:
    mailbox = args.get("mailbox") or "INBOX"
    refuse_control(mailbox, "the mailbox name")
    return mailbox


async def _in_thread(imap: Server, work: Callable[[imaplib.IMAP4], _T]) -> _T:
    """Run `work` on a logged-in connection in a thread, within the time limit."""
    def session() -> _T:
        with _connected(imap) as conn:
            return work(conn)

    try:
        return await asyncio.wait_for(asyncio.to_thread(session), imap.timeout_s)
    except SkillError:
        raise
    except (TimeoutError, imaplib.IMAP4.abort, OSError) as exc:
        detail = (f"no answer within {imap.timeout_s:g} s" if isinstance(exc, TimeoutError)
                  else _said(exc) if isinstance(exc, imaplib.IMAP4.error) else str(exc))
        raise SkillError(imap.scrub(f"could not talk to the {imap.where}: {detail}; an admin should "
                                    "check imap_host, imap_port and imap_security (\"tls\" is usually "
                                    "port 993, \"starttls\" 143)")) from None
    except imaplib.IMAP4.error as exc:
        raise SkillError(imap.scrub(f"the {imap.where} answered: {_said(exc)}")) from None


class _Bounded:
    """A connection that reads at most IMAP_CALL_BYTES in all, and refuses a literal (the "{N}"
    a server announces before N bytes) that would go past it before reading a byte of it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.bytes_left = IMAP_CALL_BYTES  # set first: the constructor reads the greeting
        super().__init__(*args, **kwargs)

    def _take(self, size: int) -> None:
        if size > self.bytes_left:
            self.bytes_left = -1
            raise SkillError(f"the mail server sent more than {IMAP_CALL_BYTES:,} bytes for one call "
                             f"(a message is fetched {READ_FETCH_BYTES:,} bytes at most); nothing more "
                             "was read")
        self.bytes_left -= size

    def read(self, size: int) -> bytes:
        self._take(size)
        return super().read(size)  # type: ignore[misc]

    def readline(self) -> bytes:
        line = super().readline()  # type: ignore[misc]  # imaplib bounds one line to 1 MB
        self._take(len(line))
        return line


class _BoundedIMAP(_Bounded, imaplib.IMAP4):
    pass


class _BoundedIMAPSSL(_Bounded, imaplib.IMAP4_SSL):
    pass


@contextmanager
def _connected(imap: Server) -> Iterator[imaplib.IMAP4]:
    if imap.security == "tls":
        conn: imaplib.IMAP4 = _BoundedIMAPSSL(imap.host, imap.port, ssl_context=tls_context(),
                                              timeout=imap.timeout_s)
    else:
        conn = _BoundedIMAP(imap.host, imap.port, timeout=imap.timeout_s)
    try:
        if imap.security == "starttls":
            if "STARTTLS" not in conn.capabilities:
                raise SkillError(f"the {imap.where} does not offer STARTTLS, so the password would travel "
                                 "in clear text; refused. An admin should set imap_security = \"tls\" "
                                 "(for port 993)")
            conn.starttls(tls_context())
        _login(conn, imap)
        yield conn
    finally:
        try:
            if getattr(conn, "bytes_left", 0) < 0:  # over budget: what the server still sends is not read
                conn.shutdown()
            else:
                conn.logout()
        except (imaplib.IMAP4.error, OSError, SkillError):
            pass


def _login(conn: imaplib.IMAP4, imap: Server) -> None:
    if not imap.username or not imap.password:
        raise SkillError("reading email is not set up: an admin must set imap_username and imap_password "
                         "(or smtp_username and smtp_password, used for both) in [skills.email]")
    try:
        if imap.password.isascii() and imap.username.isascii():
            conn.login(imap.username, imap.password)
        else:
            credentials = f"\0{imap.username}\0{imap.password}".encode()
            conn.authenticate("PLAIN", lambda _: credentials)
    except imaplib.IMAP4.error as exc:
        raise SkillError(imap.scrub(
            f"the {imap.where} refused the login of {imap.username!r} ({_said(exc)}); an admin should "
            "check imap_username and imap_password in [skills.email]")) from None


def _select(conn: imaplib.IMAP4, mailbox: str) -> None:
    """Open `mailbox` read-only: nothing this skill does changes flags or contents."""
    status, _ = conn.select(_quote(utf7_encode(mailbox)), readonly=True)
    if status != "OK":
        raise SkillError(f"there is no mailbox {mailbox!r}; mailboxes: {', '.join(_mailboxes(conn))}")


def _list_sync(conn: imaplib.IMAP4, mailbox: str, count: int, unseen: bool,
               search: str | None) -> tuple[int, list[str]]:
    _select(conn, mailbox)
    which = "UNSEEN" if unseen else "ALL"
    if search is None:
        uids = _search(conn, mailbox, [which])
    else:  # a search per key: imaplib sends one literal per command, and some servers' TEXT skips headers
        uids = set().union(*(_search(conn, mailbox, [which, key], search)
                             for key in ("SUBJECT", "FROM", "TEXT")))
    chosen = sorted(uids)[-count:][::-1]
    if not chosen:
        return 0, []
    status, data = conn.uid("FETCH", ",".join(map(str, chosen)),
                            "(UID FLAGS BODY.PEEK[HEADER.FIELDS (FROM SUBJECT DATE)])")
    if status != "OK":
        raise SkillError(f"fetching the messages of {mailbox!r} failed: {_text(data)}")
    parsed = {}
    for meta, header in _fetched(data):
        uid = re.search(rb"UID (\d+)", meta)
        if uid:
            flags = re.search(rb"FLAGS \(([^)]*)\)", meta)
            seen = bool(flags and b"\\Seen" in flags.group(1))
            parsed[int(uid.group(1))] = row(int(uid.group(1)), header, seen)
    return len(uids), [parsed[u] for u in chosen if u in parsed]


def _search(conn: imaplib.IMAP4, mailbox: str, criteria: list[str], text: str | None = None) -> set[int]:
    """UIDs matching `criteria`, the last of them taking `text` (sent as a literal: no quoting)."""
    if text is not None:
        conn.literal = text.encode()  # type: ignore[attr-defined]
        criteria = (["CHARSET", "UTF-8"] if not text.isascii() else []) + criteria
    status, data = conn.uid("SEARCH", *criteria)
    if status != "OK":
        raise SkillError(f"the search in {mailbox!r} failed: {_text(data)}")
    return {int(u) for u in b" ".join(d for d in data if d).split()}


def _read_sync(conn: imaplib.IMAP4, mailbox: str, uid: int) -> tuple[int, bytes]:
    _select(conn, mailbox)
    status, data = conn.uid("FETCH", str(uid), f"(UID RFC822.SIZE BODY.PEEK[]<0.{READ_FETCH_BYTES}>)")
    if status != "OK":
        raise SkillError(f"fetching uid {uid} in {mailbox!r} failed: {_text(data)}")
    for meta, raw in _fetched(data):
        if re.search(rb"UID %d\b" % uid, meta):
            size = re.search(rb"RFC822\.SIZE (\d+)", meta)
            # A server that ignored the partial fetch sent more: what is shown is parsed from
            # the bytes asked for, as from any other server.
            return (int(size.group(1)) if size else len(raw)), raw[:READ_FETCH_BYTES]
    raise SkillError(f"there is no message with uid {uid} in {mailbox!r}; the list action shows the uids")


def _fetched(data: list[Any]) -> list[tuple[bytes, bytes]]:
    """imaplib's FETCH answer as (metadata, literal) per message; servers put UID/FLAGS before or
    after the literal, so the metadata is both parts."""
    records: list[tuple[bytes, bytes]] = []
    for item in data:
        if isinstance(item, tuple):
            records.append((item[0], item[1]))
        elif isinstance(item, bytes) and records:
            records[-1] = (records[-1][0] + b" " + item, records[-1][1])
    return records


def _mailboxes(conn: imaplib.IMAP4) -> list[str]:
    status, data = conn.list()
    names = []
    for line in data if status == "OK" else []:
        if isinstance(line, bytes):
            match = re.match(rb'\([^)]*\) (?:"[^"]*"|NIL) (.+)', line)
            if match:
                names.append(utf7_decode(match.group(1).decode("ascii", "replace").strip('"')))
    return names or ["(none listed)"]


def _quote(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def utf7_encode(name: str) -> str:
    """A mailbox name in IMAP's modified UTF-7 (RFC 3501 5.1.3)."""
    out, pending = [], []

    def flush() -> None:
        if pending:
            data = base64.b64encode("".join(pending).encode("utf-16-be")).decode()
            out.append("&" + data.rstrip("=").replace("/", ",") + "-")
            pending.clear()

    for char in name:
        if " " <= char <= "~":
            flush()
            out.append("&-" if char == "&" else char)
        else:
            pending.append(char)
    flush()
    return "".join(out)


def utf7_decode(name: str) -> str:
    """A mailbox name from IMAP's modified UTF-7, as the server lists it."""
    def decode(match: re.Match[str]) -> str:
        data = match.group(1).replace(",", "/")
        if not data:
            return "&"
        return base64.b64decode(data + "=" * (-len(data) % 4)).decode("utf-16-be", "replace")

    return re.sub(r"&([A-Za-z0-9+,]*)-", decode, name)


def _said(exc: BaseException) -> str:
    """An imaplib error's text; imaplib passes the server's words on as bytes."""
    return " ".join(a.decode("utf-8", "replace") if isinstance(a, bytes) else str(a) for a in exc.args)


def _text(data: list[Any]) -> str:
    return " ".join(d.decode("utf-8", "replace") if isinstance(d, bytes) else str(d) for d in data)
