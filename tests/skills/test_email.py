"""The email skill as the model calls it: roles with email_recipients / email_domains, the executor
(policy, arguments, audit) and real SMTP and IMAP servers on 127.0.0.1 (tests/fakes/mail.py).
Nothing leaves the machine; a refused recipient means nothing reaches the server."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from sandbox.policy import Policy, Role
from sandbox.runner import Sandbox
from skills.builtin.email import EmailSkill
from skills.builtin.email.imap import utf7_decode, utf7_encode
from skills.executor import Executor, Outcome
from skills.registry import SkillLoadError, load_skills
from tests.fakes.mail import FakeIMAPServer, FakeSMTPServer, make_message

SMTP_PASSWORD = "smtp-Pa55word!"
IMAP_PASSWORD = "imap-Pa55word!"

ROLES = {
    "friends": Role("friends", skills=frozenset({"email"}), email_recipients=frozenset({"ann@friends.org"}),
                    email_domains=frozenset({"example.org"}), email_read=True),
    "nobody": Role("nobody", skills=frozenset({"email"})),
    "clock-only": Role("clock-only", skills=frozenset({"clock"})),
}
USERS = {"telegram:1": "friends", "telegram:2": "nobody", "telegram:3": "clock-only"}


@dataclass
class Harness:
    executor: Executor
    policy: Policy
    audit: list[dict[str, Any]] = field(default_factory=list)

    async def call(self, args: dict[str, Any], user: str = "telegram:1") -> Outcome:
        return await self.executor.call("email", args, self.policy.principal(user))


def harness(tmp_path, settings: dict[str, Any]) -> Harness:
    audit: list[dict[str, Any]] = []

    async def sink(user, skill, args, decision, **extra):
        audit.append({"user": user, "skill": skill, "args": args, "decision": decision, **extra})

    registry = load_skills(["email"], [], {"email": settings})
    policy = Policy(ROLES, tmp_path, USERS.__getitem__)
    return Harness(Executor(registry, Sandbox(), audit=sink, timeout_s=10), policy, audit)


@pytest.fixture
async def smtp():
    async with FakeSMTPServer(users={"bot": SMTP_PASSWORD}) as server:
        yield server


@pytest.fixture
async def imap():
    async with FakeIMAPServer(user="bob@example.org", password=IMAP_PASSWORD) as server:
        yield server


def smtp_settings(server: FakeSMTPServer, **extra: Any) -> dict[str, Any]:
    login = {"smtp_username": "bot", "smtp_password": SMTP_PASSWORD} if server.users else {}
    return {"smtp_host": server.host, "smtp_port": server.port, "smtp_security": "none",
            "from_address": "OpenClaw <bot@example.org>", "timeout_s": 5, **login, **extra}


def imap_settings(server: FakeIMAPServer, **extra: Any) -> dict[str, Any]:
    return {"imap_host": server.host, "imap_port": server.port, "imap_security": "none",
            "imap_username": server.user, "imap_password": IMAP_PASSWORD, "timeout_s": 5, **extra}


def send(to: Any, subject: str = "Lunch", body: str = "See you at noon.", **extra: Any) -> dict[str, Any]:
    return {"action": "send", "to": to, "subject": subject, "body": body, **extra}


# --- send --------------------------------------------------------------------------------------


async def test_send_to_an_allowed_address_arrives_with_from_to_subject_body_over_auth(tmp_path, smtp):
    h = harness(tmp_path, smtp_settings(smtp))
    out = await h.call(send("ann@friends.org", subject="Lunch on Friday", body="Grüße,\nsee you at noon."))
    assert out.ok and out.decision == "allowed", out.text
    [mail] = smtp.messages
    assert mail.login == "bot"
    assert mail.mail_from == "bot@example.org" and mail.rcpt_tos == ["ann@friends.org"]
    message = mail.message
    assert message["From"] == "OpenClaw <bot@example.org>" and message["To"] == "ann@friends.org"
    assert message["Subject"] == "Lunch on Friday" and message["Message-ID"] and message["Date"]
    assert message.get_content_type() == "text/plain"
    assert message.get_content().replace("\r\n", "\n") == "Grüße,\nsee you at noon.\n"
    assert "sent to ann@friends.org" in out.text
    [row] = h.audit
    assert row["decision"] == "allowed"
    assert row["detail"] == "sent to ann@friends.org (subject 'Lunch on Friday')"


async def test_send_to_a_domain_allowed_address_with_cc_and_no_login(tmp_path):
    async with FakeSMTPServer() as open_relay:
        h = harness(tmp_path, smtp_settings(open_relay))
        out = await h.call(send(["Carl <carl@Example.org>"], cc="dora@example.org, ann@friends.org"))
        assert out.ok, out.text
        [mail] = open_relay.messages
    assert mail.login is None
    assert mail.rcpt_tos == ["carl@example.org", "dora@example.org", "ann@friends.org"]
    assert mail.message["To"] == "Carl <carl@example.org>"
    assert mail.message["Cc"] == "dora@example.org, ann@friends.org"


async def test_a_recipient_not_allowed_is_denied_and_nothing_reaches_the_server(tmp_path, smtp):
    h = harness(tmp_path, smtp_settings(smtp))
    out = await h.call(send("mallory@evil.test"))
    assert not out.ok and out.decision == "denied"
    assert "mallory@evil.test" in out.text
    assert "ann@friends.org" in out.text and "anyone@example.org" in out.text  # what the role allows
    assert smtp.messages == [] and smtp.failed_logins == []
    [row] = h.audit
    assert row["decision"] == "denied" and "mallory@evil.test" in row["detail"]


async def test_a_display_name_cannot_smuggle_in_an_allowed_address(tmp_path, smtp):
    h = harness(tmp_path, smtp_settings(smtp))
    out = await h.call(send("ann@friends.org <mallory@evil.test>"))
    assert out.decision == "denied" and "may not email mallory@evil.test" in out.text
    assert smtp.messages == []


async def test_a_role_with_no_recipients_may_email_no_one(tmp_path, smtp):
    h = harness(tmp_path, smtp_settings(smtp))
    out = await h.call(send("ann@friends.org"), user="telegram:2")
    assert out.decision == "denied" and "may not email anyone" in out.text and "[roles.nobody]" in out.text
    assert smtp.messages == []


async def test_one_refused_address_in_a_mixed_list_sends_nothing(tmp_path, smtp):
    h = harness(tmp_path, smtp_settings(smtp))
    out = await h.call(send(["ann@friends.org", "carl@example.org"], cc=["eve@example.org.evil.test"]))
    assert out.decision == "denied" and "eve@example.org.evil.test" in out.text
    assert "ann@friends.org," not in out.text.split("may not email")[1].split("(")[0]  # only the refused
    assert smtp.messages == []


@pytest.mark.parametrize("args, what", [
    (send("ann@friends.org", subject="Hi\r\nBcc: mallory@evil.test"), "the subject"),
    (send("ann@friends.org\nBcc: mallory@evil.test"), "the recipient"),
    (send("ann@friends.org", cc=["Ann\r\n <carl@example.org>"]), "the recipient"),
])
async def test_header_injection_is_refused_and_nothing_is_sent(tmp_path, smtp, args, what):
    h = harness(tmp_path, smtp_settings(smtp))
    out = await h.call(args)
    assert not out.ok and what in out.text and "line break" in out.text and "nothing was sent" in out.text
    assert smtp.messages == []


# RFC 2047 encoded words that decode to CR/LF: Python's email package decodes them when a header is
# set, and Python before 3.11.10 / 3.12.5 writes the CR/LF out raw (CVE-2024-6923).
INJECTED = "=?utf-8?q?Ann=0D=0AReply-To:_mallory@evil.test=0D=0AX-Injected:_yes?="


@pytest.mark.parametrize("args, what", [
    (send("ann@friends.org", subject="=?utf-8?q?Hi=0D=0AReply-To:_mallory@evil.test?="), "the subject"),
    (send(f"{INJECTED} <ann@friends.org>"), "the recipient"),
    (send(f"Ann {INJECTED} Smith <ann@friends.org>"), "the recipient"),
    (send("ann@friends.org", cc=[f"{INJECTED} <carl@example.org>"]), "the recipient"),
    # a local part may hold = and ?; the role allows anyone@example.org, so only this refusal stops it
    (send("=?utf-8?q?x=0D=0AReply-To=3A=20mallory=40evil.test?=@example.org"), "the recipient"),
])
async def test_an_encoded_word_in_a_header_is_refused_and_nothing_is_sent(tmp_path, smtp, args, what):
    h = harness(tmp_path, smtp_settings(smtp))
    out = await h.call(args)
    assert not out.ok and what in out.text and "encoded word" in out.text, out.text
    assert "nothing was sent" in out.text
    assert smtp.messages == []


async def test_a_line_break_the_email_package_would_write_out_raw_never_reaches_the_server(
        tmp_path, smtp, monkeypatch):
    """The second layer alone: with encoded words let through, the header block as it would be sent
    is checked (and, where Python has it, the generator refuses too), so nothing goes out."""
    from skills.builtin.email import addresses

    monkeypatch.setattr(addresses, "ENCODED_WORD", re.compile(r"(?!)"))  # matches nothing
    h = harness(tmp_path, smtp_settings(smtp))
    for args in (send(f"{INJECTED} <ann@friends.org>"),
                 send("ann@friends.org", subject="=?utf-8?q?Hi=0D=0AReply-To:_mallory@evil.test?="),
                 send("ann@friends.org", subject="=?utf-8?q?Hi=0D=0A=0D=0AForged_body?=")):
        out = await h.call(args)
        assert not out.ok and "refused, nothing was sent" in out.text, out.text
    assert smtp.messages == []


async def test_a_non_ascii_subject_and_display_names_arrive_intact(tmp_path, smtp):
    h = harness(tmp_path, smtp_settings(smtp, from_address="Café – Bot <bot@example.org>"))
    out = await h.call(send("Zoë Ünïcode <ann@friends.org>", subject="Café – ünïcode, 10 = 5 × 2?",
                            cc=["Åsa Öberg <carl@example.org>"]))
    assert out.ok, out.text
    [mail] = smtp.messages
    message = mail.message
    assert message["Subject"] == "Café – ünïcode, 10 = 5 × 2?"
    assert [a.display_name for a in message["From"].addresses] == ["Café – Bot"]
    assert [a.display_name for a in message["To"].addresses] == ["Zoë Ünïcode"]
    assert [a.display_name for a in message["Cc"].addresses] == ["Åsa Öberg"]
    assert message.keys() == ["From", "To", "Cc", "Subject", "Date", "Message-ID", "Content-Type",
                              "Content-Transfer-Encoding", "MIME-Version"]


async def test_a_display_name_with_a_comma_is_one_recipient(tmp_path, smtp):
    # As mail clients write them, and as read shows a sender to reply to: the comma inside the
    # quotes (or before "Name <addr>") is part of the name, not a list separator.
    h = harness(tmp_path, smtp_settings(smtp))
    out = await h.call(send('"Doe, John" <john@example.org>', cc="Roe, Jane <jane@example.org>; "
                                                                   "ann@friends.org"))
    assert out.ok, out.text
    [mail] = smtp.messages
    assert mail.rcpt_tos == ["john@example.org", "jane@example.org", "ann@friends.org"]
    assert mail.message["To"].addresses[0].display_name == "Doe, John"
    assert mail.message["Cc"].addresses[0].display_name == "Roe, Jane"
    out = await h.call(send("Doe, mallory@evil.test"))  # a bare word before an address stays refused
    assert not out.ok and "'Doe'" in out.text and len(smtp.messages) == 1


@pytest.mark.parametrize("to", ["ann", "ann@", "@friends.org", "ann@@friends.org", "ann@friends..org",
                                ["ann@friends.org", 7]])
async def test_malformed_addresses_are_refused(tmp_path, smtp, to):
    h = harness(tmp_path, smtp_settings(smtp))
    out = await h.call(send(to))
    assert not out.ok and "address" in out.text, out.text
    assert smtp.messages == []


async def test_a_wrong_smtp_password_is_a_clear_error_that_never_shows_the_password(tmp_path, smtp, caplog):
    caplog.set_level(logging.DEBUG)
    h = harness(tmp_path, smtp_settings(smtp, smtp_password="wrong-Secret-123"))
    out = await h.call(send("ann@friends.org"))
    assert not out.ok
    assert "refused the login of 'bot'" in out.text and "smtp_password" in out.text, out.text
    assert smtp.messages == [] and smtp.failed_logins[0] == "bot"
    everything = out.text + repr(h.audit) + caplog.text
    assert "wrong-Secret-123" not in everything and SMTP_PASSWORD not in everything


async def test_starttls_is_never_downgraded_to_clear_text(tmp_path, smtp):
    h = harness(tmp_path, smtp_settings(smtp, smtp_security="starttls"))
    out = await h.call(send("ann@friends.org"))
    assert not out.ok and "does not offer STARTTLS" in out.text and "smtp_security" in out.text
    assert smtp.messages == [] and smtp.failed_logins == []


async def test_a_login_set_for_a_server_that_offers_none_is_said_to_be_the_problem(tmp_path):
    # aiosmtplib's message for it ends "Try connecting via TLS (or STARTTLS)", which was read as
    # a server without STARTTLS, and the admin told to change smtp_security from "none" to "none".
    async with FakeSMTPServer() as open_relay:
        settings = smtp_settings(open_relay, smtp_username="bot", smtp_password=SMTP_PASSWORD)
        out = await harness(tmp_path, settings).call(send("ann@friends.org"))
        assert open_relay.messages == []
    assert not out.ok and "does not offer a login (AUTH)" in out.text, out.text
    assert "remove smtp_username and smtp_password" in out.text and "STARTTLS," not in out.text


async def test_an_unreachable_smtp_server_names_the_keys_to_check(tmp_path, smtp):
    port = smtp.port
    await smtp.__aexit__(None, None, None)
    h = harness(tmp_path, smtp_settings(smtp, smtp_port=port))
    out = await h.call(send("ann@friends.org"))
    assert not out.ok and "could not connect" in out.text and "smtp_port" in out.text


def test_describe_shows_exactly_what_will_be_sent():
    body = "x" * 150 + "y" * 100
    text = EmailSkill().describe(send(["ann@friends.org"], cc="carl@example.org", subject="Hi\nBcc: x",
                                      body=body))
    assert "to: ann@friends.org" in text and "cc: carl@example.org" in text
    assert "subject: Hi\\u000aBcc: x" in text  # a line break is shown, not obeyed
    assert "x" * 150 + "y" * 50 in text and "y" * 51 not in text
    assert "body (first 200 of 250 characters) >>>" in text
    assert text.endswith("<<< end of body (250 characters)")


def test_describe_cannot_be_made_to_read_as_something_else():
    """What the model writes cannot add lines outside the body, reorder text (bidi overrides),
    or end the body early in a way that matches the real closing marker."""
    forged = "hi\n<<< end of body (2 characters)\n(nothing will be sent)"
    text = EmailSkill().describe(send(["\u202eAnn <ann@example.org>"], subject="x\u202ey", body=forged))
    assert "\u202e" not in text and "\\u202e" in text
    lines = text.split("\n")
    assert lines[-1] == f"<<< end of body ({len(forged)} characters)"
    assert lines.count(f"<<< end of body ({len(forged)} characters)") == 1
    assert lines[:4] == ["send an email", "to: \\u202eAnn <ann@example.org>", "subject: x\\u202ey",
                         f"body ({len(forged)} characters) >>>"]
    body = EmailSkill().describe(send(["ann@example.org"], body="a\tb\x1b[2Jc"))
    assert "\x1b" not in body and "\\u001b" in body and "\\u0009" in body


# --- list and read -----------------------------------------------------------------------------


async def test_a_role_that_may_send_may_not_read_the_shared_mailbox_unless_granted(tmp_path, imap):
    uid = await imap.add_message(subject="Bank code", body="Your code is 4242.")
    h = harness(tmp_path, imap_settings(imap))
    for args in ({"action": "list"}, {"action": "read", "uid": uid}):
        out = await h.call(args, user="telegram:2")
        assert out.decision == "denied" and "4242" not in out.text and "Bank" not in out.text
        assert "email_read = true in [roles.nobody]" in out.text, out.text
    assert "4242" in (await h.call({"action": "read", "uid": uid})).text  # a role granted it


async def test_list_shows_recent_messages_newest_first_with_unseen_and_search(tmp_path, imap):
    old = await imap.add_message(subject="Invoice March", sender="Shop <shop@example.com>", seen=True)
    mid = await imap.add_message(subject="Grüße aus Köln", body="Wir sehen uns im Mai.")
    new = await imap.add_message(subject="Meeting moved", body="Now at 3pm.")
    h = harness(tmp_path, imap_settings(imap))

    out = await h.call({"action": "list", "count": 2})
    assert out.ok, out.text
    lines = out.text.splitlines()
    assert "2 most recent of 3" in lines[0]
    assert lines[1].startswith(f"uid {new} | 2024-03-01 09:30 +0000 | from Alice Example <alice@example.org>")
    assert lines[1].endswith("subject: Meeting moved | unseen")
    assert lines[2].startswith(f"uid {mid} ") and "Grüße aus Köln" in lines[2]

    out = await h.call({"action": "list", "search": "invoice"})
    assert [line.split(" |")[0] for line in out.text.splitlines()[1:]] == [f"uid {old}"]
    assert "from Shop <shop@example.com>" in out.text and "unseen" not in out.text.splitlines()[1]

    out = await h.call({"action": "list", "unseen_only": True, "search": "Köln"})
    assert [line.split(" |")[0] for line in out.text.splitlines()[1:]] == [f"uid {mid}"]

    out = await h.call({"action": "list", "search": "nothing like this"})
    assert out.ok and "no messages" in out.text
    assert h.audit[0]["detail"] == "listed 2 of 3 in INBOX"


async def test_read_gives_headers_and_text_names_attachments_and_leaves_the_message_unseen(tmp_path, imap):
    message = make_message(subject="Report", body="The numbers are in.\n" + "z" * 20_000,
                           html="<p>The numbers</p>", attachments={"q1.pdf": b"%PDF-1.4 ..."})
    uid = await imap.add_message(message)
    h = harness(tmp_path, imap_settings(imap))
    out = await h.call({"action": "read", "uid": uid})
    assert out.ok, out.text
    assert f"uid: {uid}" in out.text and "from: Alice Example <alice@example.org>" in out.text
    assert "subject: Report" in out.text and "to: bob@example.org" in out.text
    assert "The numbers are in." in out.text and "<p>" not in out.text
    assert "attachments (not included): q1.pdf (application/octet-stream)" in out.text
    assert "%PDF" not in out.text
    assert "[cut:" in out.text and len(out.text) < 9_000
    assert h.audit[0]["detail"] == f"read uid {uid} in INBOX"
    listed = await h.call({"action": "list"})
    assert listed.text.splitlines()[1].endswith("| unseen")  # reading did not set \Seen


async def test_read_an_html_only_message_gives_its_text_without_tags(tmp_path, imap):
    html = ("<html><head><style>p {color: red}</style></head><body><h1>Hello &amp; welcome</h1>"
            "<p>First <b>bold</b> line.</p><script>alert(1)</script><p>Second line.</p></body></html>")
    uid = await imap.add_message(subject="Newsletter", body="", html=html)
    h = harness(tmp_path, imap_settings(imap))
    out = await h.call({"action": "read", "uid": uid})
    body = out.text.split("\n\n", 1)[1]
    assert body == "Hello & welcome\n\nFirst bold line.\n\nSecond line.", body


async def test_a_hostile_address_header_does_not_break_list_or_read(tmp_path, imap):
    # A From whose encoded display name hides a CR/LF: Python's address parser raises on it. One
    # such message (spam) must not make the whole mailbox unlistable, nor itself unreadable.
    raw = (b"From: =?utf-8?q?Bank=0D=0ABcc:_x@evil.test?= <spam@evil.test>\r\n"
           b"To: =?utf-8?q?a=0Ab?= <bob@example.org>\r\nSubject: You won\r\n"
           b"Date: Fri, 01 Mar 2024 09:30:00 +0000\r\n\r\nClaim it now.\r\n")
    bad = await imap.add_message(raw)
    good = await imap.add_message(subject="Meeting moved")
    h = harness(tmp_path, imap_settings(imap))
    out = await h.call({"action": "list"})
    assert out.ok, out.text
    rows = out.text.splitlines()[1:]
    assert rows[0].startswith(f"uid {good} ") and rows[1].startswith(f"uid {bad} ")
    assert "spam@evil.test" in rows[1] and "subject: You won" in rows[1]
    out = await h.call({"action": "read", "uid": bad})
    assert out.ok, out.text
    head = out.text.split("\n\n", 1)[0].splitlines()
    assert any(line.startswith("from: ") and "spam@evil.test" in line for line in head), head
    assert not any(line.lower().startswith("bcc") for line in head), head  # still one line each
    assert "Claim it now." in out.text


async def test_read_another_mailbox_and_unknown_uid_or_mailbox_errors(tmp_path, imap):
    await imap.add_mailbox("Entwürfe")
    uid = await imap.add_message(subject="Draft", mailbox="Entwürfe")
    h = harness(tmp_path, imap_settings(imap))
    out = await h.call({"action": "read", "uid": uid, "mailbox": "Entwürfe"})
    assert out.ok and "subject: Draft" in out.text, out.text
    out = await h.call({"action": "read", "uid": 999})
    assert not out.ok and "no message with uid 999" in out.text
    out = await h.call({"action": "list", "mailbox": "Archive"})
    assert not out.ok and "no mailbox 'Archive'" in out.text
    assert "mailboxes: INBOX, Entwürfe" in out.text


async def test_a_wrong_imap_password_is_a_clear_error_without_the_password(tmp_path, imap):
    h = harness(tmp_path, imap_settings(imap, imap_password="not-the-Imap-pw"))
    out = await h.call({"action": "list"})
    assert not out.ok and "refused the login of 'bob@example.org'" in out.text and "imap_password" in out.text
    assert "(b'" not in out.text  # the server's words, not a bytes repr
    assert "not-the-Imap-pw" not in out.text + repr(h.audit)


# --- settings and roles ------------------------------------------------------------------------


def test_settings_errors_name_each_bad_key():
    with pytest.raises(SkillLoadError) as caught:
        load_skills(["email"], [], {"email": {
            "smtp_host": "smtp example", "smtp_port": "587", "smtp_security": "ssl",
            "smtp_username": "bot", "from_address": "not an address", "imap_port": 0,
            "imap_host": "imap.example.org", "imap_security": "none", "imap_username": "bob",
            "imap_password": "Imap-Secret-9", "timeout_s": -1, "smtp_pasword": "typo"}})
    problems = caught.value.problems
    for key in ("smtp_host", "smtp_port", "smtp_security", "smtp_password", "from_address", "imap_port",
                "imap_security", "timeout_s", "smtp_pasword"):
        assert any(p.startswith(f"skills.email.{key}:") for p in problems), (key, problems)
    assert "Imap-Secret-9" not in str(caught.value)
    assert any("clear text" in p for p in problems)  # a password over an unencrypted connection


def test_an_encoded_word_in_from_address_is_a_settings_problem():
    sender = "=?utf-8?q?Bot=0D=0ABcc:_x@evil.test?= <bot@x.org>"
    problems = EmailSkill.check_settings({"from_address": sender})
    assert [p.split(":")[0] for p in problems] == ["from_address"], problems


def test_good_settings_have_no_problems():
    assert EmailSkill.check_settings({
        "smtp_host": "smtp.example.org", "smtp_port": 465, "smtp_security": "tls", "smtp_username": "bot",
        "smtp_password": "pw", "from_address": "Bot <bot@example.org>", "imap_host": "localhost",
        "imap_security": "none", "timeout_s": 12.5}) == []


async def test_missing_server_settings_tell_the_admin_which_key_to_set(tmp_path):
    h = harness(tmp_path, {})
    out = await h.call(send("ann@friends.org"))
    assert not out.ok and "smtp_host in [skills.email]" in out.text
    out = await h.call({"action": "read", "uid": 1})
    assert not out.ok and "imap_host in [skills.email]" in out.text
    h = harness(tmp_path, {"smtp_host": "127.0.0.1"})
    out = await h.call(send("ann@friends.org"))
    assert not out.ok and "from_address in [skills.email]" in out.text


async def test_a_role_without_the_email_skill_is_denied(tmp_path, smtp):
    h = harness(tmp_path, smtp_settings(smtp))
    out = await h.call(send("ann@friends.org"), user="telegram:3")
    assert out.decision == "denied" and "may not use 'email'" in out.text
    assert smtp.messages == [] and h.audit[0]["decision"] == "denied"


async def test_arguments_that_do_not_fit_the_action_are_explained(tmp_path, smtp):
    h = harness(tmp_path, smtp_settings(smtp))
    out = await h.call({"action": "send", "to": "ann@friends.org", "subject": "x"})
    assert not out.ok and "needs 'body'" in out.text
    out = await h.call({"action": "list", "to": "ann@friends.org"})
    assert not out.ok and "does not take 'to'" in out.text
    out = await h.call({"action": "delete"})
    assert out.decision == "invalid"


def test_mailbox_names_use_modified_utf7():
    assert utf7_encode("Entwürfe") == "Entw&APw-rfe" and utf7_encode("A&B") == "A&-B"
    assert utf7_decode("Entw&APw-rfe") == "Entwürfe" and utf7_decode("A&-B") == "A&B"
