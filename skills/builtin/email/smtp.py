"""Sending one plain-text message over SMTP (aiosmtplib) to recipients the caller's role allows. The
header block is checked as it will be written, so nothing the model wrote can add a header."""

from __future__ import annotations

import asyncio
import email.errors
import email.generator
import email.policy
import io
import logging
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime, localtime, make_msgid
from typing import Any

import aiosmtplib

from skills.base import SkillContext, SkillDenied, SkillError
from skills.builtin.email.addresses import one_line, parse_address, recipients, refuse_header_text
from skills.builtin.email.settings import Server, server, tls_context

log = logging.getLogger(__name__)

MAX_RECIPIENTS = 50
MAX_SUBJECT_CHARS = 300
MAX_BODY_CHARS = 100_000
# How aiosmtplib writes an EmailMessage with ASCII addresses (ours are), so the check below reads the
# header block as the server will; where Python has it (3.11.10+, 3.12.5+), the generator refuses to
# write a header that would read back as more than one.
_SMTP_POLICY = (email.policy.SMTP.clone(verify_generated_headers=True)
                if hasattr(email.policy.SMTP, "verify_generated_headers") else email.policy.SMTP)


async def send(args: dict[str, Any], ctx: SkillContext) -> str:
    to, cc = recipients(args["to"], "to"), recipients(args.get("cc", []), "cc")
    subject, body = args["subject"], args["body"]
    refuse_header_text(subject, "the subject")
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
    smtp = server(ctx.settings, "smtp", "sending email")
    if not ctx.settings.get("from_address"):
        raise SkillError("sending email is not set up: an admin must set from_address in [skills.email] "
                         "(the sender, e.g. \"bot@example.org\")")
    sender = parse_address(ctx.settings["from_address"], "from_address")
    assert sender is not None  # the settings were checked
    message = _message(sender, to, cc, subject, body)
    refused_by_server = await _deliver(smtp, message, sender.addr_spec, everyone)
    delivered = [a for a in everyone if a not in refused_by_server]
    ctx.audit.detail = f"sent to {', '.join(delivered)} (subject {one_line(subject)[:100]!r})"[:500]
    log.info("email from %s to %s sent via %s", sender.addr_spec, ", ".join(delivered), smtp.where)
    text = (f"sent to {', '.join(str(a) for a in to)}"
            + (f", cc {', '.join(str(a) for a in cc)}" if cc else "")
            + f" from {sender} (subject {subject!r}, {len(body)} characters; "
              f"Message-ID {message['Message-ID']})")
    if refused_by_server:
        text += "\nthe server refused: " + "; ".join(f"{a} ({r})" for a, r in refused_by_server.items())
    return text


def _refused_message(refused: list[str], ctx: SkillContext) -> str:
    role = ctx.principal.role
    allowed = sorted(role.email_recipients) + [f"anyone@{d}" for d in sorted(role.email_domains)]
    scope = (f"it may email only: {', '.join(allowed)}" if allowed else "it may not email anyone")
    return (f"the role {role.name!r} of {ctx.user} may not email {', '.join(refused)} ({scope}; an admin "
            f"can add addresses with email_recipients or email_domains in [roles.{role.name}]); "
            "nothing was sent")


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


async def _deliver(smtp: Server, message: EmailMessage, sender: str,
                   everyone: list[str]) -> dict[str, str]:
    """Send; return the recipients the server refused while accepting others (address -> reply)."""
    login = {"username": smtp.username, "password": smtp.password} if smtp.username else {}
    try:
        errors, _ = await asyncio.wait_for(aiosmtplib.send(
            message, sender=sender, recipients=everyone, hostname=smtp.host, port=smtp.port,
            use_tls=smtp.security == "tls", start_tls=smtp.security == "starttls",
            tls_context=tls_context() if smtp.security != "none" else None,
            timeout=smtp.timeout_s, **login), smtp.timeout_s)
    except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
        raise SkillError(smtp.scrub(_smtp_error(smtp, exc)) + "; nothing was sent") from None
    return {address: f"{reply.code} {reply.message}" for address, reply in errors.items()}


def _smtp_error(smtp: Server, exc: BaseException) -> str:
    where = f"the {smtp.where}"
    if isinstance(exc, aiosmtplib.SMTPAuthenticationError):
        return (f"{where} refused the login of {smtp.username!r} ({exc.code} {exc.message}); an admin "
                "should check smtp_username and smtp_password in [skills.email]")
    if isinstance(exc, aiosmtplib.SMTPRecipientsRefused):
        return f"{where} refused every recipient: " + "; ".join(
            f"{r.recipient} ({r.code} {r.message})" for r in exc.recipients)
    if isinstance(exc, aiosmtplib.SMTPSenderRefused):
        hint = (" (it wants a login: set smtp_username and smtp_password)" if exc.code == 530
                else "; check from_address")
        return f"{where} refused the sender {exc.sender} ({exc.code} {exc.message}){hint}"
    if isinstance(exc, TimeoutError):
        return f"{where} did not answer within {smtp.timeout_s:g} s (timeout_s in [skills.email])"
    if isinstance(exc, aiosmtplib.SMTPConnectError | OSError):
        return (f"could not connect to the {smtp.where}: {exc}; an admin should check smtp_host, "
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
