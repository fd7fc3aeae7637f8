"""A message fetched over IMAP as text for the model: each header on one line (nothing in a header
can forge another line), the text part or the visible text of its HTML, attachments only named."""

from __future__ import annotations

import email.errors
import email.header
import email.policy
import re
from email.message import Message
from email.parser import BytesParser
from email.utils import parsedate_to_datetime
from html.parser import HTMLParser

from skills.builtin.email.addresses import one_line

READ_BODY_CHARS = 8_000  # of a message's text, in what the model reads
MAX_NAMED_ATTACHMENTS = 50
# MIME parts parsed of one message: the email package makes an object of each and parses its
# headers again at every look, so thousands of tiny parts in the 2 MB fetched took a minute of
# CPU and 15 times the message's size in memory. The parts after these are not named.
MAX_PARTS = 200


def row(uid: int, header: bytes, seen: bool) -> str:
    """One message in a listing, from its From, Subject and Date header lines."""
    fields = BytesParser(policy=email.policy.default).parsebytes(header, headersonly=True)
    return (f"uid {uid} | {_date(fields)} | from {_header(fields, 'From')} | "
            f"subject: {_header(fields, 'Subject')[:200]}" + ("" if seen else " | unseen"))


def message_text(raw: bytes, uid: int, size: int) -> str:
    """The message whose first bytes are `raw` (of `size` in all), as the read action shows it."""
    raw = _first_parts(raw)
    message = BytesParser(policy=email.policy.default).parsebytes(raw)
    lines = [f"uid: {uid}"]
    for name in ("From", "To", "Cc", "Date", "Subject"):
        if name in message:  # not message[name]: that parses the header, which may raise
            lines.append(f"{name.lower()}: {_header(message, name)}")
    text, body = _body_text(message)
    attachments = [p for p in message.walk() if p is not body and _is_attachment(p)]
    if attachments:
        more = ", and more not named" if len(attachments) > MAX_NAMED_ATTACHMENTS else ""
        lines.append("attachments (not included): " + ", ".join(
            f"{one_line(p.get_filename() or 'unnamed')} ({p.get_content_type()})"
            for p in attachments[:MAX_NAMED_ATTACHMENTS]) + more)
    if len(text) > READ_BODY_CHARS:
        text = text[:READ_BODY_CHARS] + f"\n[cut: {len(text)} characters in all]"
    lines += ["", text or "(no text)"]
    if size > len(raw):
        lines.append(f"[only the first {len(raw)} of {size} bytes were read; later parts are not shown]")
    return "\n".join(lines)


def _first_parts(raw: bytes) -> bytes:
    """`raw` cut before its line that would start part MAX_PARTS + 1. Every MIME boundary line
    starts with "--"; counting every such line may cut a little early, never late."""
    at = -1
    for _ in range(MAX_PARTS + 1):
        at = raw.find(b"\n--", at + 1)
        if at == -1:
            return raw
    return raw[:at + 1]


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
        # A header the parser refuses (an encoded CR/LF in an address raises): get_all would parse
        # it again, so it is decoded from its raw text; one hostile message must not make the
        # whole mailbox unlistable.
        value = _raw_header(message, name)
    return one_line(value)


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
        return one_line(str(raw))
