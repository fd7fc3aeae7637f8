"""The [skills.email] settings: their checks (each problem names its key and what to write) and the
server each protocol connects to. The daemon resolves "env:NAME" / "file:PATH" passwords before
they arrive here; a password never appears in a result, a log line or an audit row."""

from __future__ import annotations

import ipaddress
import re
import ssl
from dataclasses import dataclass
from typing import Any

from skills.base import SkillError
from skills.builtin.email.addresses import CONTROL, LINE_BREAK, is_address

SECURITY = ("starttls", "tls", "none")
DEFAULT_PORTS = {"smtp": {"starttls": 587, "tls": 465, "none": 25},
                 "imap": {"starttls": 143, "tls": 993, "none": 143}}
DEFAULT_SECURITY = {"smtp": "starttls", "imap": "tls"}
DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 300.0
SETTINGS = ("smtp_host", "smtp_port", "smtp_security", "smtp_username", "smtp_password", "from_address",
            "imap_host", "imap_port", "imap_security", "imap_username", "imap_password", "timeout_s")


@dataclass(frozen=True)
class Server:
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


def problems(settings: dict[str, Any]) -> list[str]:
    """What is wrong with the [skills.email] table, one line per problem (none: usable)."""
    found = [f"{key}: unknown key (known: {', '.join(SETTINGS)})" for key in settings
             if key not in SETTINGS]
    for protocol in ("smtp", "imap"):
        found += _server_problems(settings, protocol)
    if "from_address" in settings and not is_address(value := settings["from_address"]):
        found.append(f"from_address: not an email address: {value!r}; "
                     "use e.g. \"bot@example.org\" or \"OpenClaw <bot@example.org>\"")
    if "timeout_s" in settings:
        value = settings["timeout_s"]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not 0 < value <= MAX_TIMEOUT_S:
            found.append(f"timeout_s: must be a number of seconds above 0 and at most "
                         f"{MAX_TIMEOUT_S:g}, got {value!r}")
    return found


def _server_problems(settings: dict[str, Any], protocol: str) -> list[str]:
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
    if user is not None and (not isinstance(user, str) or not user or CONTROL.search(user)):
        problems.append(f"{protocol}_username: must be a non-empty string on one line")
    if password is not None and (not isinstance(password, str) or not password
                                 or LINE_BREAK.search(password)):
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


def server(settings: dict[str, Any], protocol: str, action: str) -> Server:
    """The server `action` ("sending email", "reading email") uses, or a SkillError saying which
    setting an admin must add."""
    host = settings.get(f"{protocol}_host")
    if not host:
        raise SkillError(f"{action} is not set up: an admin must set {protocol}_host in [skills.email] "
                         f"(the {protocol.upper()} server, e.g. \"{protocol}.example.org\")")
    security = settings.get(f"{protocol}_security", DEFAULT_SECURITY[protocol])
    user, password = settings.get(f"{protocol}_username"), settings.get(f"{protocol}_password")
    if protocol == "imap" and user is None:  # the common case: one account for sending and reading
        user, password = settings.get("smtp_username"), settings.get("smtp_password")
    return Server(protocol, host, settings.get(f"{protocol}_port", DEFAULT_PORTS[protocol][security]),
                  security, user, password, float(settings.get("timeout_s", DEFAULT_TIMEOUT_S)))


def tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()
