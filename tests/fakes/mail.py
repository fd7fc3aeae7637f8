"""Real mail servers on 127.0.0.1 for tests: an SMTP server (aiosmtpd) that keeps what it receives,
with AUTH when given users and without STARTTLS, and an in-memory IMAP server (pymap's dict
backend) seeded with messages. Both run in the test's own event loop and are async context managers:

    async with FakeSMTPServer(users={"bot": "pw"}) as smtp, FakeIMAPServer() as imap:
        uid = await imap.add_message(subject="Hi", body="hello")
        ...  # connect to smtp.host/smtp.port and imap.host/imap.port
        assert smtp.messages[0].message["Subject"] == "..."
"""

from __future__ import annotations

import asyncio
import email.policy
import warnings
from argparse import Namespace
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage
from email.parser import BytesParser
from email.utils import format_datetime
from typing import Any

from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from proxyprotocol.reader import ProxyProtocolReader
from pymap.backend.dict import Config as DictConfig
from pymap.backend.dict import Identity, Login
from pymap.concurrent import Subsystem
from pymap.imap import IMAPServer
from pymap.parsing.message import AppendMessage
from pymap.parsing.specials.flag import Flag, Seen
from pymap.user import Passwords, UserMetadata

HOST = "127.0.0.1"


@dataclass
class ReceivedMail:
    """One message as the SMTP server got it: the envelope, the parsed message, who logged in."""

    mail_from: str
    rcpt_tos: list[str]
    raw: bytes
    login: str | None  # the AUTH user name; None when the client did not authenticate

    @property
    def message(self) -> EmailMessage:
        return BytesParser(policy=email.policy.default).parsebytes(self.raw)  # type: ignore[return-value]


@dataclass
class FakeSMTPServer:
    """An SMTP server on 127.0.0.1 (plain, no STARTTLS). With `users` it offers AUTH (PLAIN, LOGIN)
    and requires it; without, it accepts mail from anyone and offers no login, as `python -m
    aiosmtpd` does on a plain connection. Received mail lands in `messages`."""

    users: dict[str, str] | None = None
    host: str = HOST
    port: int = 0
    messages: list[ReceivedMail] = field(default_factory=list)
    failed_logins: list[str] = field(default_factory=list)  # user names (never the passwords)
    _server: asyncio.Server | None = None

    async def __aenter__(self) -> FakeSMTPServer:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    def _protocol(self) -> SMTP:
        with warnings.catch_warnings():  # AUTH without TLS is the point of a loopback test server
            warnings.simplefilter("ignore", UserWarning)
            return SMTP(self, hostname="smtp.fake.test", loop=asyncio.get_running_loop(),
                        authenticator=self._authenticate if self.users is not None else None,
                        auth_required=self.users is not None,
                        auth_require_tls=self.users is None)  # True: no AUTH without TLS

    def _authenticate(self, server: SMTP, session: Session, envelope: Envelope, mechanism: str,
                      auth_data: Any) -> AuthResult:
        assert isinstance(auth_data, LoginPassword) and self.users is not None
        user, password = auth_data.login.decode(), auth_data.password.decode()
        if self.users.get(user) == password:
            return AuthResult(success=True, auth_data=user)
        self.failed_logins.append(user)
        # handled=False: aiosmtpd answers 535 itself (handled=True would leave the client waiting).
        return AuthResult(success=False, handled=False)

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:  # noqa: N802
        raw = envelope.original_content or envelope.content or b""
        assert isinstance(raw, bytes)
        login = session.auth_data if session.authenticated else None
        self.messages.append(ReceivedMail(envelope.mail_from or "", list(envelope.rcpt_tos), raw, login))
        return "250 OK"


class _Config(DictConfig):
    @property
    def greeting(self) -> bytes:
        return b"Server ready imap.fake.test"  # the default asks DNS for this host's FQDN


@dataclass
class FakeIMAPServer:
    """An IMAP server on 127.0.0.1 (plain, no STARTTLS) with one user and in-memory mailboxes.
    Seed it with add_message(); UIDs are pymap's (they start at 101 in each mailbox)."""

    user: str = "bob@example.org"
    password: str = "imap-secret"
    host: str = HOST
    port: int = 0
    _server: asyncio.Server | None = None
    _identity: Identity | None = None

    async def __aenter__(self) -> FakeIMAPServer:
        args = Namespace(passlib_cfg=None, proxy_protocol=None, debug=False, inherited_sockets=None)
        config = _Config(args, host=self.host, port=0, tls_enabled=False, reject_dnsbl=False,
                         invalid_user_sleep=0.0, cpu_subsystem=Subsystem.for_asyncio(),
                         demo_data=False, demo_user="demouser", demo_password="demopass")
        login = Login(config)
        self._identity = Identity(self.user, login, None, frozenset())
        hashed = await Passwords(config).hash_password(self.password)
        await self._identity.set(UserMetadata(config, self.user, password=hashed))
        callback = ProxyProtocolReader(config.proxy_protocol).get_callback(IMAPServer(login, config))
        self._server = await asyncio.start_server(callback, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def add_mailbox(self, name: str) -> None:
        assert self._identity is not None
        async with self._identity.new_session() as session:
            await session.mailbox_set.add_mailbox(name)

    async def add_message(self, raw: bytes | EmailMessage | None = None, *, mailbox: str = "INBOX",
                          seen: bool = False, when: datetime | None = None, **fields: Any) -> int:
        """Append a message and return its UID: `raw` as is, or one built by make_message(**fields)."""
        assert self._identity is not None
        if raw is None:
            raw = make_message(**fields)
        if isinstance(raw, EmailMessage):
            raw = raw.as_bytes(policy=email.policy.SMTP)
        flags: frozenset[Flag] = frozenset({Seen}) if seen else frozenset()
        async with self._identity.new_session() as session:
            box = await session.mailbox_set.get_mailbox(mailbox)
            message = await box.append(AppendMessage(raw, when or datetime.now(UTC), flags),
                                       recent=not seen)
        return message.uid


def make_message(*, subject: str = "Hello", body: str = "Hello there.", html: str | None = None,
                 sender: str = "Alice Example <alice@example.org>", to: str = "bob@example.org",
                 date: datetime | None = None,
                 attachments: dict[str, bytes] | None = None) -> EmailMessage:
    """A message as a mail client would write it: text (and HTML alternative, or HTML only when
    body is ""), with named attachments."""
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = sender, to, subject
    message["Date"] = format_datetime(date or datetime(2024, 3, 1, 9, 30, tzinfo=UTC))
    if body or html is None:
        message.set_content(body)
        if html is not None:
            message.add_alternative(html, subtype="html")
    else:
        message.set_content(html, subtype="html")
    for name, data in (attachments or {}).items():
        message.add_attachment(data, maintype="application", subtype="octet-stream", filename=name)
    return message
