"""`email`: send plain-text mail over SMTP (aiosmtplib) to recipients the caller's role allows, and
list or read messages over IMAP (the stdlib imaplib, in a thread) without changing the mailbox.

Settings are the [skills.email] table; the daemon resolves "env:NAME" / "file:PATH" passwords before
they arrive here. Passwords never appear in results, logs or audit rows.
"""

from __future__ import annotations

import asyncio
import base64
import email.errors
import email.generator
import email.header
import email.policy
import imaplib
import io
import ipaddress
import logging
import re
import ssl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.headerregistry import Address
from email.message import EmailMessage, Message
from email.parser import BytesParser
from email.utils import format_datetime, localtime, make_msgid, parsedate_to_datetime
from html.parser import HTMLParser
from typing import Any, TypeVar

import aiosmtplib

from skills.base import Skill, SkillContext, SkillDenied, SkillError, visible

log = logging.getLogger(__name__)

SECURITY = ("starttls", "tls", "none")
DEFAULT_PORTS = {"smtp": {"starttls": 587, "tls": 465, "none": 25},
                 "imap": {"starttls": 143, "tls": 993, "none": 143}}
DEFAULT_SECURITY = {"smtp": "starttls", "imap": "tls"}
DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 300.0
SETTINGS = ("smtp_host", "smtp_port", "smtp_security", "smtp_username", "smtp_password", "from_address",
            "imap_host", "imap_port", "imap_security", "imap_username", "imap_password", "timeout_s")

MAX_RECIPIENTS = 50
MAX_SUBJECT_CHARS = 300
MAX_BODY_CHARS = 100_000
PREVIEW_CHARS = 200  # of the body, in approval prompts
LIST_DEFAULT, LIST_MAX = 10, 50
READ_BODY_CHARS = 8_000  # of a message's text, in what the model reads
READ_FETCH_BYTES = 2 << 20  # of a message, fetched from the server (attachments beyond are not named)

_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_ADDRESS = re.compile(rf"{_ATOM}(?:\.{_ATOM})*@{_LABEL}(?:\.{_LABEL})*")
_NAMED = re.compile(r"\s*(?P<name>[^<>]*?)\s*<(?P<addr>[^<>]*)>\s*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_LINE_BREAK = re.compile(r"[\r\n]")
# An RFC 2047 encoded word, or anything Python's lenient header parser might take for one: it decodes
# them when the header is set, and before 3.11.10 / 3.12.5 (CVE-2024-6923) writes a decoded CR/LF out
# raw, as a header of the model's choosing.
_ENCODED_WORD = re.compile(r"=\?.*\?=", re.DOTALL)
# How aiosmtplib writes an EmailMessage with ASCII addresses (ours are), so the check below reads the
# header block as the server will; where Python has it (3.11.10+, 3.12.5+), the generator refuses to
# write a header that would read back as more than one.
_SMTP_POLICY = (email.policy.SMTP.clone(verify_generated_headers=True)
                if hasattr(email.policy.SMTP, "verify_generated_headers") else email.policy.SMTP)

_T = TypeVar("_T")


@dataclass(frozen=True)
class _Server:
    """Where and how to connect for one protocol, from the settings."""

    protocol: str  # "smtp" | "imap"
    host: str
    port: int
    security: str
    username: str | None
    password: str | None
    timeout_s: float

    @property
    def where(self) -> str:
        return f"{self.protocol.upper()} server {self.host}:{self.port} ({self.security})"

    def scrub(self, text: str) -> str:
        """`text` with the password masked, in case a server or library echoed it."""
        return text.replace(self.password, "***") if self.password else text


class EmailSkill(Skill):
    name = "email"
    description = (
        "Send a plain-text email (action send: to, optional cc, subject, body) to recipients the "
        "user's role allows; list recent messages of a mailbox (action list: uid, from, subject, "
        "date; optional unseen_only and search text); or read one message by uid (action read: "
        "headers and text, attachments named). Reading never marks messages as read.")
    parameters = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["send", "list", "read"]},
            "to": {"type": ["array", "string"], "items": {"type": "string"},
                   "description": "send: recipient address(es), e.g. [\"ann@example.org\"]"},
            "cc": {"type": ["array", "string"], "items": {"type": "string"},
                   "description": "send: copy recipient address(es)"},
            "subject": {"type": "string", "description": "send: one line"},
            "body": {"type": "string", "description": "send: the plain-text message"},
            "mailbox": {"type": "string", "description": "list/read: default INBOX"},
            "count": {"type": "integer",
                      "description": f"list: how many recent messages (default {LIST_DEFAULT}, "
                                     f"at most {LIST_MAX})"},
            "unseen_only": {"type": "boolean", "description": "list: only messages not yet read"},
            "search": {"type": "string", "description": "list: only messages containing this text"},
            "uid": {"type": "integer", "description": "read: the message's uid, as list shows it"},
        },
        "required": ["action"],
        "additionalProperties": False,
    }
    permissions = frozenset({"email.send", "email.read", "network"})

    _ARGS = {"send": ({"to", "subject", "body"}, {"cc"}),
             "list": (set(), {"mailbox", "count", "unseen_only", "search"}),
             "read": ({"uid"}, {"mailbox"})}

    @classmethod
    def check_settings(cls, settings: dict[str, Any]) -> list[str]:
        problems = [f"{key}: unknown key (known: {', '.join(SETTINGS)})" for key in settings
                    if key not in SETTINGS]
        for protocol in ("smtp", "imap"):
            problems += _check_server_settings(settings, protocol)
        if "from_address" in settings:
            value = settings["from_address"]
            if (not isinstance(value, str) or _CONTROL.search(value) or _ENCODED_WORD.search(value)
                    or _parse_address(value, "") is None):
                problems.append(f"from_address: not an email address: {value!r}; "
                                "use e.g. \"bot@example.org\" or \"OpenClaw <bot@example.org>\"")
        if "timeout_s" in settings:
            value = settings["timeout_s"]
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not 0 < value <= MAX_TIMEOUT_S:
                problems.append(f"timeout_s: must be a number of seconds above 0 and at most "
                                f"{MAX_TIMEOUT_S:g}, got {value!r}")
        return problems

    def describe(self, args: dict[str, Any]) -> str:
        # An approval prompt: every field escaped (skills.base.visible), so a model-written subject
        # or body cannot add lines or reorder text to make the prompt read as something else.
        action = args.get("action")
        mailbox = visible(str(args.get("mailbox") or "INBOX"))
        if action == "list":
            count = args.get("count", LIST_DEFAULT)
            which = " unseen" if args.get("unseen_only") else ""
            search = f" containing {visible(str(args['search']))!r}" if args.get("search") else ""
            return f"list the {count} most recent{which} messages{search} in {mailbox}"
        if action == "read":
            return f"read the message with uid {visible(str(args.get('uid')))} in {mailbox}"
        body = str(args.get("body", ""))
        # The body keeps its line breaks (it is a letter) between markers: the closing one repeats
        # the length, so a forged "end of body" line inside it does not match, and every other
        # control or format character is escaped.
        shown = "\n".join(visible(line) for line in body[:PREVIEW_CHARS].split("\n"))
        first = f"first {PREVIEW_CHARS} of " if len(body) > PREVIEW_CHARS else ""
        lines = ["send an email", f"to: {_show_list(args.get('to'))}"]
        if args.get("cc"):
            lines.append(f"cc: {_show_list(args.get('cc'))}")
        lines += [f"subject: {visible(str(args.get('subject', '')))}",
                  f"body ({first}{len(body)} characters) >>>", shown,
                  f"<<< end of body ({len(body)} characters)"]
        return "\n".join(lines)

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        action = args["action"]
        required, optional = self._ARGS[action]
        missing = sorted(required - set(args))
        if missing:
            raise SkillError(f"action {action} needs {', '.join(map(repr, missing))}")
        extra = sorted(set(args) - required - optional - {"action"})
        if extra:
            raise SkillError(f"action {action} does not take {', '.join(map(repr, extra))} "
                             f"(it takes: {', '.join(sorted(required | optional))})")
        problems = self.check_settings(ctx.settings)
        if problems:
            raise SkillError("the [skills.email] settings are invalid (an admin must fix them): "
                             + "; ".join(problems))
        if action == "send":
            return await _send(args, ctx)
        role = ctx.principal.role
        if not role.email_read:
            raise SkillDenied(f"the role {role.name!r} may send mail but not list or read the "
                              "mailbox (it is shared by everyone who uses this assistant); an admin "
                              f"can allow it with email_read = true in [roles.{role.name}]")
        if action == "list":
            return await _list(args, ctx)
        return await _read(args, ctx)


# --- settings ----------------------------------------------------------------------------------


def _check_server_settings(settings: dict[str, Any], protocol: str) -> list[str]:
    problems = []
    host = settings.get(f"{protocol}_host")
    if f"{protocol}_host" in settings and (not isinstance(host, str) or not host.strip()
                                           or re.search(r"[\s/]", host)):
        problems.append(f"{protocol}_host: must be a host name or address, e.g. "
                        f"\"{protocol}.example.org\", got {host!r}")
    port = settings.get(f"{protocol}_port")
    if f"{protocol}_port" in settings and (isinstance(port, bool) or not isinstance(port, int)
                                           or not 0 < port < 65536):
        problems.append(f"{protocol}_port: must be a whole number from 1 to 65535, got {port!r}")
    security = settings.get(f"{protocol}_security", DEFAULT_SECURITY[protocol])
    if security not in SECURITY:
        problems.append(f"{protocol}_security: must be one of {', '.join(map(repr, SECURITY))}, "
                        f"got {security!r}")
    user, password = settings.get(f"{protocol}_username"), settings.get(f"{protocol}_password")
    if user is not None and (not isinstance(user, str) or not user or _CONTROL.search(user)):
        problems.append(f"{protocol}_username: must be a non-empty string on one line")
    if password is not None and (not isinstance(password, str) or not password
                                 or _LINE_BREAK.search(password)):
        problems.append(f"{protocol}_password: must be a non-empty string on one line (value not shown)")
    if (user is None) != (password is None):
        given, absent = (("username", "password") if password is None else ("password", "username"))
        problems.append(f"{protocol}_{absent}: missing; {protocol}_{given} is set, and a login needs both")
    if protocol == "imap" and user is None and password is None:  # falls back to the SMTP login
        password = settings.get("smtp_password")
    if (security == "none" and password is not None and isinstance(host, str)
            and not _is_loopback(host)):
        problems.append(f"{protocol}_security: \"none\" would send {protocol}_password in clear text to "
                        f"{host}; use \"tls\" or \"starttls\" (\"none\" with a password is only for "
                        "a server on this machine)")
    return problems


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _server(settings: dict[str, Any], protocol: str, action: str) -> _Server:
    host = settings.get(f"{protocol}_host")
    if not host:
        raise SkillError(f"{action} is not set up: an admin must set {protocol}_host in [skills.email] "
                         f"(the {protocol.upper()} server, e.g. \"{protocol}.example.org\")")
    security = settings.get(f"{protocol}_security", DEFAULT_SECURITY[protocol])
    user, password = settings.get(f"{protocol}_username"), settings.get(f"{protocol}_password")
    if protocol == "imap" and user is None:  # the common case: one account for sending and reading
        user, password = settings.get("smtp_username"), settings.get("smtp_password")
    return _Server(protocol, host, settings.get(f"{protocol}_port", DEFAULT_PORTS[protocol][security]),
                   security, user, password, float(settings.get("timeout_s", DEFAULT_TIMEOUT_S)))


def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


# --- addresses -------------------------------------------------------------------------------


def _parse_address(text: str, what: str) -> Address | None:
    """`addr@host` or `Name <addr@host>` as an Address; None when malformed. Raises SkillError on a
    line break, control character or encoded word, which could smuggle in extra headers."""
    _refuse_header_text(text, what)
    named = _NAMED.fullmatch(text)
    name, addr = (named["name"].strip('" '), named["addr"].strip()) if named else ("", text.strip())
    if len(addr) > 254 or not _ADDRESS.fullmatch(addr) or '"' in name or "\\" in name:
        return None
    local, _, domain = addr.rpartition("@")
    return Address(display_name=name, username=local, domain=domain.lower())


def _refuse_header_text(text: str, what: str) -> None:
    """Refuse what could become more than this one header once Python's email package has it."""
    _refuse_control(text, what)
    if _ENCODED_WORD.search(text):
        raise SkillError(f"{what} contains an RFC 2047 encoded word (=?...?=), which could inject mail "
                         "headers; refused, nothing was sent. Write the text itself (any language is "
                         "fine); it is encoded for you.")


def _refuse_control(text: str, what: str) -> None:
    if _LINE_BREAK.search(text):
        raise SkillError(f"{what} contains a line break (CR/LF), which could inject mail headers; "
                         "refused, nothing was sent. Give it on one line.")
    if _CONTROL.search(text):
        raise SkillError(f"{what} contains a control character; refused, nothing was sent")


def _recipients(value: Any, what: str) -> list[Address]:
    """A string ("a@x.org" or "a@x.org, b@y.org") or a list of them, as Addresses."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise SkillError(f"{what!r} must be an address or a list of addresses")
    found, bad = [], []
    for item in items:
        for part in _split_addresses(item):
            address = _parse_address(part, f"the recipient {_visible(part.strip())!r}")
            if address is None:
                bad.append(part.strip())
            else:
                found.append(address)
    if bad:
        raise SkillError(f"not valid email addresses in {what!r}: {', '.join(map(repr, bad))}; "
                         "use e.g. \"ann@example.org\" or \"Ann <ann@example.org>\"; nothing was sent")
    return found


def _split_addresses(text: str) -> list[str]:
    """The addresses of "a@x.org, Name <b@y.org>; c@z.org": split at commas and semicolons, but not
    inside quotes or angle brackets ('"Doe, John" <j@x.org>' is one address, as mail clients and
    the read action write it), and a bare "Doe, John <j@x.org>" is joined back into one too: a
    part with no @ cannot be an address by itself."""
    parts, current, quoted, angled = [], [], False, False
    for char in text:
        if char == '"' and not angled:
            quoted = not quoted
        elif char in "<>" and not quoted:
            angled = char == "<"
        elif char in ",;" and not quoted and not angled:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    joined: list[str] = []
    for part in (p.strip() for p in parts):
        if not part:
            continue
        if joined and "@" not in joined[-1] and _NAMED.fullmatch(part) and '"' not in part:
            joined[-1] = f"{joined[-1]}, {part}"
        else:
            joined.append(part)
    return joined


def _refused_message(refused: list[str], ctx: SkillContext) -> str:
    role = ctx.principal.role
    allowed = sorted(role.email_recipients) + [f"anyone@{d}" for d in sorted(role.email_domains)]
    scope = (f"it may email only: {', '.join(allowed)}" if allowed else "it may not email anyone")
    return (f"the role {role.name!r} of {ctx.user} may not email {', '.join(refused)} ({scope}; an admin "
            f"can add addresses with email_recipients or email_domains in [roles.{role.name}]); "
            "nothing was sent")


# --- send --------------------------------------------------------------------------------------


async def _send(args: dict[str, Any], ctx: SkillContext) -> str:
    to, cc = _recipients(args["to"], "to"), _recipients(args.get("cc", []), "cc")
    subject, body = args["subject"], args["body"]
    _refuse_header_text(subject, "the subject")
    if not to:
        raise SkillError("'to' names no recipient; nothing was sent")
    if len(subject) > MAX_SUBJECT_CHARS or len(body) > MAX_BODY_CHARS:
        raise SkillError(f"the subject (at most {MAX_SUBJECT_CHARS} characters) or the body (at most "
                         f"{MAX_BODY_CHARS}) is too long; nothing was sent")
    everyone = list({a.addr_spec.lower(): a.addr_spec for a in to + cc}.values())
    if len(everyone) > MAX_RECIPIENTS:
        raise SkillError(f"{len(everyone)} recipients; at most {MAX_RECIPIENTS}; nothing was sent")
    refused = [a for a in everyone if not ctx.principal.may_email(a)]
    if refused:
        ctx.audit.detail = f"refused recipients: {', '.join(refused)}"[:500]
        raise SkillDenied(_refused_message(refused, ctx))
    server = _server(ctx.settings, "smtp", "sending email")
    if not ctx.settings.get("from_address"):
        raise SkillError("sending email is not set up: an admin must set from_address in [skills.email] "
                         "(the sender, e.g. \"bot@example.org\")")
    sender = _parse_address(ctx.settings["from_address"], "from_address")
    assert sender is not None  # check_settings passed
    message = _message(sender, to, cc, subject, body)
    refused_by_server = await _deliver(server, message, sender.addr_spec, everyone)
    delivered = [a for a in everyone if a not in refused_by_server]
    ctx.audit.detail = f"sent to {', '.join(delivered)} (subject {_visible(subject)[:100]!r})"[:500]
    log.info("email from %s to %s sent via %s", sender.addr_spec, ", ".join(delivered), server.where)
    text = (f"sent to {', '.join(str(a) for a in to)}"
            + (f", cc {', '.join(str(a) for a in cc)}" if cc else "")
            + f" from {sender} (subject {subject!r}, {len(body)} characters; "
              f"Message-ID {message['Message-ID']})")
    if refused_by_server:
        text += "\nthe server refused: " + "; ".join(f"{a} ({r})" for a, r in refused_by_server.items())
    return text


def _message(sender: Address, to: list[Address], cc: list[Address], subject: str, body: str) -> EmailMessage:
    """The message to send; a SkillError if its header block would not be exactly these headers."""
    message = EmailMessage()
    message["From"] = sender
    message["To"] = to
    if cc:
        message["Cc"] = cc
    message["Subject"] = subject
    message["Date"] = format_datetime(localtime())
    message["Message-ID"] = make_msgid(domain=sender.domain)
    message.set_content(body)
    _check_headers(message)
    return message


def _check_headers(message: EmailMessage) -> None:
    """Defence in depth, whatever Python's version: the header block as it will be sent holds exactly
    the headers `message` was given, one each, in order, with no line break of its own (a CR/LF
    the email package decoded from somewhere and wrote out raw would add a header or end the block)."""
    out = io.BytesIO()
    try:
        email.generator.BytesGenerator(out, policy=_SMTP_POLICY).flatten(message)
    except getattr(email.errors, "HeaderWriteError", ()) as exc:  # Python 3.11.10+ / 3.12.5+
        raise SkillError(f"a header would have been written as more than one ({exc}); refused, "
                         "nothing was sent") from None
    block = out.getvalue().split(b"\r\n\r\n", 1)[0]
    names = []
    for line in block.split(b"\r\n"):
        if b"\r" in line or b"\n" in line or not line.strip():
            names.append("(a bare line break or blank line)")
        elif line[:1] not in (b" ", b"\t"):  # not a folded continuation: a header of its own
            names.append(line.split(b":", 1)[0][:60].decode("ascii", "replace").lower())
    expected = [name.lower() for name in message.keys()]
    if names != expected:
        extra = sorted(set(names) - set(expected))
        found = f"extra headers {', '.join(map(repr, extra))}" if extra else "its header block cut short"
        raise SkillError(f"the message as written would have had {found}: the subject or an address "
                         "hides a line break; refused, nothing was sent")


async def _deliver(server: _Server, message: EmailMessage, sender: str,
                   recipients: list[str]) -> dict[str, str]:
    """Send; return the recipients the server refused while accepting others (address -> reply)."""
    login = {"username": server.username, "password": server.password} if server.username else {}
    try:
        errors, _ = await asyncio.wait_for(aiosmtplib.send(
            message, sender=sender, recipients=recipients, hostname=server.host, port=server.port,
            use_tls=server.security == "tls", start_tls=server.security == "starttls",
            tls_context=_tls_context() if server.security != "none" else None,
            timeout=server.timeout_s, **login), server.timeout_s)
    except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
        raise SkillError(server.scrub(_smtp_error(server, exc)) + "; nothing was sent") from None
    return {address: f"{reply.code} {reply.message}" for address, reply in errors.items()}


def _smtp_error(server: _Server, exc: BaseException) -> str:
    where = f"the {server.where}"
    if isinstance(exc, aiosmtplib.SMTPAuthenticationError):
        return (f"{where} refused the login of {server.username!r} ({exc.code} {exc.message}); an admin "
                "should check smtp_username and smtp_password in [skills.email]")
    if isinstance(exc, aiosmtplib.SMTPRecipientsRefused):
        return f"{where} refused every recipient: " + "; ".join(
            f"{r.recipient} ({r.code} {r.message})" for r in exc.recipients)
    if isinstance(exc, aiosmtplib.SMTPSenderRefused):
        hint = (" (it wants a login: set smtp_username and smtp_password)" if exc.code == 530
                else "; check from_address")
        return f"{where} refused the sender {exc.sender} ({exc.code} {exc.message}){hint}"
    if isinstance(exc, TimeoutError):
        return f"{where} did not answer within {server.timeout_s:g} s (timeout_s in [skills.email])"
    if isinstance(exc, aiosmtplib.SMTPConnectError | OSError):
        return (f"could not connect to the {server.where}: {exc}; an admin should check smtp_host, "
                "smtp_port and smtp_security (\"tls\" is usually port 465, \"starttls\" 587)")
    if isinstance(exc, aiosmtplib.SMTPResponseException):
        return f"{where} answered {exc.code} {exc.message}"
    text = str(exc)
    # aiosmtplib's words. Its AUTH message also says "Try connecting via TLS (or STARTTLS)": the
    # login is looked for first, or a server without one would be said to lack STARTTLS.
    if "AUTH extension" in text:
        return (f"{where} does not offer a login (AUTH); remove smtp_username and smtp_password, or use "
                "smtp_security = \"starttls\"/\"tls\" (many servers offer AUTH only over TLS)")
    if "STARTTLS extension" in text:
        return (f"{where} does not offer STARTTLS, so the password and message would travel in clear "
                "text; refused. An admin should set smtp_security = \"tls\" (for port 465), or \"none\" "
                "only for a relay on this machine")
    return f"{where} failed: {type(exc).__name__}: {text}"


# --- list and read -----------------------------------------------------------------------------


async def _list(args: dict[str, Any], ctx: SkillContext) -> str:
    server = _server(ctx.settings, "imap", "reading email")
    mailbox = _mailbox_arg(args)
    count = args.get("count", LIST_DEFAULT)
    if count < 1:
        raise SkillError(f"'count' must be at least 1, got {count}")
    count = min(count, LIST_MAX)
    search = args.get("search") or None
    if search is not None:
        _refuse_control(search, "the search text")
    unseen = bool(args.get("unseen_only"))
    total, rows = await _in_thread(server, lambda conn: _list_sync(conn, mailbox, count, unseen, search))
    which = " unseen" if unseen else ""
    matching = f" containing {search!r}" if search else ""
    ctx.audit.detail = f"listed {len(rows)} of {total} in {mailbox}"
    if not rows:
        return f"{mailbox}: no{which} messages{matching}"
    head = f"{mailbox}: the {len(rows)} most recent of {total}{which} messages{matching}, newest first:"
    return "\n".join([head, *rows])


async def _read(args: dict[str, Any], ctx: SkillContext) -> str:
    server = _server(ctx.settings, "imap", "reading email")
    mailbox, uid = _mailbox_arg(args), args["uid"]
    if uid < 1:
        raise SkillError(f"'uid' must be a positive number from the list action, got {uid}")
    size, raw = await _in_thread(server, lambda conn: _read_sync(conn, mailbox, uid))
    ctx.audit.detail = f"read uid {uid} in {mailbox}"
    return _render(BytesParser(policy=email.policy.default).parsebytes(raw), uid, size, len(raw))


def _mailbox_arg(args: dict[str, Any]) -> str:
    mailbox = args.get("mailbox") or "INBOX"
    _refuse_control(mailbox, "the mailbox name")
    return mailbox


async def _in_thread(server: _Server, work: Callable[[imaplib.IMAP4], _T]) -> _T:
    """Run `work` on a logged-in connection in a thread, within the time limit."""
    def session() -> _T:
        with _imap(server) as conn:
            return work(conn)

    try:
        return await asyncio.wait_for(asyncio.to_thread(session), server.timeout_s)
    except SkillError:
        raise
    except (TimeoutError, imaplib.IMAP4.abort, OSError) as exc:
        detail = (f"no answer within {server.timeout_s:g} s" if isinstance(exc, TimeoutError)
                  else _said(exc) if isinstance(exc, imaplib.IMAP4.error) else str(exc))
        raise SkillError(server.scrub(f"could not talk to the {server.where}: {detail}; an admin should "
                                      "check imap_host, imap_port and imap_security (\"tls\" is usually "
                                      "port 993, \"starttls\" 143)")) from None
    except imaplib.IMAP4.error as exc:
        raise SkillError(server.scrub(f"the {server.where} answered: {_said(exc)}")) from None


@contextmanager
def _imap(server: _Server) -> Iterator[imaplib.IMAP4]:
    if server.security == "tls":
        conn: imaplib.IMAP4 = imaplib.IMAP4_SSL(server.host, server.port, ssl_context=_tls_context(),
                                                timeout=server.timeout_s)
    else:
        conn = imaplib.IMAP4(server.host, server.port, timeout=server.timeout_s)
    try:
        if server.security == "starttls":
            if "STARTTLS" not in conn.capabilities:
                raise SkillError(f"the {server.where} does not offer STARTTLS, so the password would travel "
                                 "in clear text; refused. An admin should set imap_security = \"tls\" "
                                 "(for port 993)")
            conn.starttls(_tls_context())
        _login(conn, server)
        yield conn
    finally:
        try:
            conn.logout()
        except (imaplib.IMAP4.error, OSError):
            pass


def _login(conn: imaplib.IMAP4, server: _Server) -> None:
    if not server.username or not server.password:
        raise SkillError("reading email is not set up: an admin must set imap_username and imap_password "
                         "(or smtp_username and smtp_password, used for both) in [skills.email]")
    try:
        if server.password.isascii() and server.username.isascii():
            conn.login(server.username, server.password)
        else:
            credentials = f"\0{server.username}\0{server.password}".encode()
            conn.authenticate("PLAIN", lambda _: credentials)
    except imaplib.IMAP4.error as exc:
        raise SkillError(server.scrub(
            f"the {server.where} refused the login of {server.username!r} ({_said(exc)}); an admin should "
            "check imap_username and imap_password in [skills.email]")) from None


def _select(conn: imaplib.IMAP4, mailbox: str) -> None:
    """Open `mailbox` read-only: nothing this skill does changes flags or contents."""
    status, _ = conn.select(_quote(_utf7_encode(mailbox)), readonly=True)
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
            parsed[int(uid.group(1))] = _row(int(uid.group(1)), header, seen)
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
            return (int(size.group(1)) if size else len(raw)), raw
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


def _row(uid: int, header: bytes, seen: bool) -> str:
    fields = BytesParser(policy=email.policy.default).parsebytes(header, headersonly=True)
    return (f"uid {uid} | {_date(fields)} | from {_header(fields, 'From')} | "
            f"subject: {_header(fields, 'Subject')[:200]}" + ("" if seen else " | unseen"))


def _render(message: Message, uid: int, size: int, fetched: int) -> str:
    lines = [f"uid: {uid}"]
    for name in ("From", "To", "Cc", "Date", "Subject"):
        if name in message:  # not message[name]: that parses the header, which may raise
            lines.append(f"{name.lower()}: {_header(message, name)}")
    text, body = _body_text(message)
    attachments = [p for p in message.walk() if p is not body and _is_attachment(p)]
    if attachments:
        lines.append("attachments (not included): " + ", ".join(
            f"{_visible(p.get_filename() or 'unnamed')} ({p.get_content_type()})" for p in attachments))
    if len(text) > READ_BODY_CHARS:
        text = text[:READ_BODY_CHARS] + f"\n[cut: {len(text)} characters in all]"
    lines += ["", text or "(no text)"]
    if size > fetched:
        lines.append(f"[only the first {fetched} of {size} bytes were read; later parts are not shown]")
    return "\n".join(lines)


def _is_attachment(part: Message) -> bool:
    if part.get_content_type() == "message/rfc822":
        return True
    return not part.is_multipart() and bool(part.get_content_disposition() == "attachment"
                                            or part.get_filename()
                                            or part.get_content_maintype() not in ("text", "message"))


def _body_text(message: Message) -> tuple[str, Message | None]:
    """The message's text: its text/plain part, else its HTML with the tags stripped."""
    body = message.get_body(preferencelist=("plain", "html"))  # type: ignore[attr-defined]
    if body is None:
        return "", None
    try:
        content = body.get_content()
    except (LookupError, ValueError):  # an unknown or lying charset
        payload = body.get_payload(decode=True) or b""
        content = payload.decode("utf-8", "replace")
    if body.get_content_subtype() == "html":
        content = _html_text(content)
    return content.strip(), body


class _TextOf(HTMLParser):
    """Visible text of an HTML document: scripts and styles dropped, blocks on their own lines."""

    _BLOCKS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "table", "blockquote"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style", "head"):
            self._hidden += 1
        elif tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "head"):
            self._hidden = max(0, self._hidden - 1)
        elif tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.parts.append(data)


def _html_text(html: str) -> str:
    parser = _TextOf()
    parser.feed(html)
    parser.close()
    lines = (re.sub(r"[ \t\r\f\v\xa0]+", " ", line).strip() for line in "".join(parser.parts).split("\n"))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines))


def _header(message: Message, name: str) -> str:
    try:
        value = str(message.get(name, ""))
    except (ValueError, IndexError, TypeError, AttributeError):
        # A header the parser refuses (an encoded CR/LF in an address raises): get_all would
        # parse it again, so it is decoded from its raw text; one hostile message must not make
        # the whole mailbox unlistable.
        value = _raw_header(message, name)
    return _visible(value)


def _raw_header(message: Message, name: str) -> str:
    raw = next((str(v) for k, v in message.raw_items() if k.lower() == name.lower()), "")
    try:
        return str(email.header.make_header(email.header.decode_header(raw)))
    except (ValueError, LookupError, email.errors.HeaderParseError):
        return raw


def _date(message: Message) -> str:
    raw = message.get("Date")
    try:
        return parsedate_to_datetime(str(raw)).strftime("%Y-%m-%d %H:%M %z") if raw else "no date"
    except (TypeError, ValueError):
        return _visible(str(raw))


def _mailboxes(conn: imaplib.IMAP4) -> list[str]:
    status, data = conn.list()
    names = []
    for line in data if status == "OK" else []:
        if isinstance(line, bytes):
            match = re.match(rb'\([^)]*\) (?:"[^"]*"|NIL) (.+)', line)
            if match:
                names.append(_utf7_decode(match.group(1).decode("ascii", "replace").strip('"')))
    return names or ["(none listed)"]


# --- small helpers -----------------------------------------------------------------------------


def _quote(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _utf7_encode(name: str) -> str:
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


def _utf7_decode(name: str) -> str:
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


def _visible(text: str) -> str:
    """One line: control characters (a line break in a header, say) shown as spaces."""
    return _CONTROL.sub(" ", text)


def _show_list(value: Any) -> str:
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else [value]
    return ", ".join(visible(str(i)) for i in items)
