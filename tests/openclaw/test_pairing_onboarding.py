"""A stranger's first hour, as the owner and the stranger see it: the owner is told of each new
request in their chat (once per code), the approved stranger is told they are in and their first
message is answered then. Through the real daemon, the fake Telegram Bot API and `openclaw`."""

from __future__ import annotations

import asyncio
import json
import re

from openclaw.config import load_config
from openclaw.daemon import Daemon
from openclaw.store import Store
from openclaw.store.users import KEPT_MESSAGE_CHARS
from tests.helpers import telegram_env
from tests.helpers.cli import run
from tests.helpers.daemon import RecordingConnector, msg, say, started
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.telegram_env import ADA
from tests.helpers.waiting import until

fake, env = telegram_env.fake, telegram_env.env
EVE = 2001


def code_in(text: str) -> str:
    return re.search(r"pairing code (?:is )?([A-Z0-9]{8})", text).group(1)


def answering() -> ScriptedModel:
    return ScriptedModel(lambda m: f"answer to: {m[-1]['content']}")


async def asked(tmp_path, text: str, user: str = "11"):
    """A daemon whose stranger `user` asked for access with `text` over Telegram: (daemon, its
    console, the Telegram connector, the model)."""
    model, tg = answering(), RecordingConnector("telegram")
    daemon, console = await started(tmp_path, model, also=(tg,))
    await tg.handler(msg(text, user=user, channel="telegram"))
    await daemon.gateway.wait_idle()
    return daemon, console, tg, model


# -- 1. the owner is told ------------------------------------------------------------------------

async def test_the_owner_is_told_in_their_chat_of_a_new_request_once_per_code(env, fake):
    model = ScriptedModel(lambda m: "hello")
    await env.start(model)
    fake.send("hi, I'm Eve", user=EVE, first_name="Eve\u202e")
    [to_eve] = await env.replies(EVE, 1)
    [to_ada] = await env.replies(ADA, 1)
    code = code_in(to_eve)
    assert f"/pairing approve {code}" in to_ada.splitlines()
    assert f"telegram user {EVE}" in to_ada and "Eve\\u202e" in to_ada and "\u202e" not in to_ada
    fake.send("hello?", user=EVE)  # asking again: the same code, and the owner is not told again
    assert code_in((await env.replies(EVE, 2))[1]) == code
    assert len(fake.texts(ADA)) == 1
    assert model.prompts == []


async def test_the_console_owner_is_told_only_while_their_console_is_connected(tmp_path):
    tg = RecordingConnector("telegram")
    daemon, console = await started(tmp_path, ScriptedModel(lambda m: "hello"), also=(tg,))
    await tg.handler(msg("hi", user="11", channel="telegram"))
    await daemon.gateway.wait_idle()
    await daemon.gateway.outbox.settled("terminal", "local")
    [told] = console.texts("local")
    assert "/pairing approve " + code_in(tg.texts("11")[0]) in told
    console.connected = False  # no console attached: nobody to tell there
    await tg.handler(msg("hi", user="12", channel="telegram"))
    await daemon.gateway.wait_idle()
    assert "pairing code" in tg.texts("12")[0]
    assert len(console.texts("local")) == 1
    await daemon.stop()


# -- 2. the approved stranger is told, and their first message answered ------------------------

async def test_approved_in_chat_the_stranger_is_told_and_their_first_message_is_answered(env, fake):
    model = answering()
    await env.start(model)
    fake.send("what is the capital of France?", user=EVE, first_name="Eve")
    code = code_in((await env.replies(EVE, 1))[0])
    await env.replies(ADA, 1)  # told
    fake.send(f"/pairing approve {code}", user=ADA)
    assert (await env.replies(ADA, 2))[1].startswith(f"Approved telegram:{EVE} (Eve)")
    await until(lambda: len(fake.texts(EVE)) >= 3)
    welcome, answer = (await env.replies(EVE, 3))[1:]
    assert welcome.startswith("Welcome!") and "first message" in welcome
    assert answer == "answer to: what is the capital of France?"
    fake.send("and of Italy?", user=EVE)  # and the conversation goes on from there
    assert (await env.replies(EVE, 4))[3] == "answer to: and of Italy?"
    assert len(model.prompts) == 2


async def test_approved_from_the_cli_while_the_daemon_runs_the_stranger_is_welcomed(tmp_path):
    model = answering()
    tg = RecordingConnector("telegram")
    daemon, _ = await started(tmp_path, model, also=(tg,))
    daemon.gateway.welcomes.poll_s = 0.05  # the poll that finds another process's approval
    daemon.gateway.welcomes.wake()  # (its current wait ends, the next one is short)
    long = "x" * 10_000
    await tg.handler(msg(long, user="11", channel="telegram"))
    await tg.handler(msg("second, not kept", user="11", channel="telegram"))
    await daemon.gateway.wait_idle()
    code = code_in(tg.texts("11")[0])
    approved = await asyncio.to_thread(
        run, ["--config", str(tmp_path / "openclaw.toml"), "pairing", "approve", code], tmp_path,
        timeout=60)
    assert approved.returncode == 0, approved.stderr
    await until(lambda: len(tg.texts("11")) >= 4, timeout=20)
    await daemon.gateway.wait_idle()
    assert tg.texts("11")[2].startswith("Welcome!")
    assert tg.texts("11")[3] == "answer to: " + "x" * KEPT_MESSAGE_CHARS  # cut, and only the first
    assert len(model.prompts) == 1
    assert await daemon.gateway.welcomes.take_up() == 0  # taken once
    await daemon.stop()


async def test_a_denied_strangers_kept_message_is_deleted_and_never_answered(tmp_path):
    daemon, conn, tg, model = await asked(tmp_path, "my secret question")
    [code] = await daemon.store.list_pairing_codes()
    assert (code.chat_id, code.message) == ("11", "my secret question")
    assert "Denied" in await say(daemon, conn, f"/pairing deny {code.code}")
    [used] = await daemon.store.list_pairing_codes(include_expired=True)
    assert (used.chat_id, used.message) == (None, None)
    assert await daemon.gateway.welcomes.take_up() == 0
    assert len(tg.texts("11")) == 1 and model.prompts == []
    await daemon.stop()


async def test_approved_while_the_daemon_was_down_the_welcome_comes_at_the_next_start(tmp_path):
    daemon, _, _, model = await asked(tmp_path, "hello there")
    [code] = await daemon.store.list_pairing_codes()
    await daemon.stop()
    store = await Store.open(daemon.config.store.url)
    try:
        assert (await store.approve_pairing(code.code)).key == "telegram:11"
    finally:
        await store.close()
    tg2 = RecordingConnector("telegram")
    daemon, _ = await started(tmp_path, model, also=(tg2,))
    await until(lambda: len(tg2.texts("11")) >= 2, timeout=20)
    assert tg2.texts("11")[0].startswith("Welcome!") and tg2.texts("11")[1] == "answer to: hello there"
    await daemon.stop()


# -- 4. a code the config made pointless is not listed --------------------------------------------

async def test_the_owners_own_code_from_before_they_were_listed_is_gone_after_the_reload(tmp_path):
    """The first steps of docs/channels.md: the owner writes to the bot, gets a code, puts
    themselves in `admins` and reloads. Their own code no longer waits in /pairing."""
    model = ScriptedModel(lambda m: "hello")
    tg = RecordingConnector("telegram")
    daemon, _ = await started(tmp_path, model, also=(tg,))
    for user in ("1001", "1002", "1003"):  # the owner-to-be, someone later allowed, a stranger
        await tg.handler(msg("hi", user=user, channel="telegram"))
    await daemon.gateway.wait_idle()
    assert len(await daemon.store.list_pairing_codes()) == 3
    path = tmp_path / "openclaw.toml"
    path.write_text(path.read_text().replace(
        'admins = ["terminal:local"]',
        'admins = ["terminal:local", "telegram:1001"]\nallow = ["telegram:1002"]'))
    assert (await daemon.reload(notify=False)).ok
    listing = await say(daemon, tg, "/pairing", user="1001")
    assert "telegram:1003" in listing and "telegram:1001" not in listing and "1002" not in listing
    assert [c.user for c in await daemon.store.list_pairing_codes()] == ["telegram:1003"]
    assert await daemon.store.take_welcomes(lambda kept: "") == []  # retired, not approved
    await daemon.stop()
    listed = await asyncio.to_thread(run, ["--config", str(path), "pairing", "list"], tmp_path,
                                     timeout=60)
    assert "telegram:1003" in listed.stdout and "telegram:1002" not in listed.stdout


async def test_a_code_of_a_user_listed_before_the_start_is_gone_at_the_start(tmp_path):
    daemon, *_ = await asked(tmp_path, "hi", user="1002")
    await daemon.stop()
    tg = RecordingConnector("telegram")
    daemon, _ = await started(tmp_path, ScriptedModel(lambda m: "hello"),
                              '[access.roles]\n"telegram:9" = "user"\n', also=(tg,))
    assert len(await daemon.store.list_pairing_codes()) == 1  # not named: still waiting
    await daemon.stop()
    path = tmp_path / "openclaw.toml"
    path.write_text(path.read_text().replace('dm_policy = "pairing"',
                                             'dm_policy = "pairing"\nblocked = ["telegram:1002"]'))
    daemon = Daemon(load_config(path), model=ScriptedModel(lambda m: "hello"),
                    connectors=[RecordingConnector(), RecordingConnector("telegram")])
    await daemon.start()
    assert await daemon.store.list_pairing_codes() == []
    await daemon.stop()


async def test_a_user_let_in_by_users_allow_after_asking_is_welcomed_and_not_listed(tmp_path):
    daemon, conn, tg, _ = await asked(tmp_path, "may I?")
    done = await asyncio.to_thread(run, ["--config", str(tmp_path / "openclaw.toml"), "users",
                                         "allow", "telegram:11"], tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Nobody is waiting" in await say(daemon, conn, "/pairing")
    daemon.gateway.welcomes.wake()  # as its poll finds it
    await until(lambda: len(tg.texts("11")) >= 3)
    assert tg.texts("11")[1].startswith("Welcome!") and tg.texts("11")[2] == "answer to: may I?"
    await daemon.stop()


# -- 5. /pairing shows the refused requests too -----------------------------------------------------

async def test_pairing_in_chat_shows_the_requests_refused_lately(tmp_path):
    tg = RecordingConnector("telegram")
    daemon, conn = await started(tmp_path, ScriptedModel(lambda m: "hello"),
                                 "[access.pairing]\ncodes_per_user_per_day = 1\ncodes_per_hour = 2\n",
                                 also=(tg,))
    for user in ("11", "12", "13"):
        await tg.handler(msg("hi", user=user, channel="telegram"))
    await daemon.gateway.wait_idle()
    listing = await say(daemon, conn, "/pairing")
    waiting, _, refused = listing.partition("Refused lately")
    assert "telegram:11" in waiting and "telegram:12" in waiting and "telegram:13" not in waiting
    assert "telegram:13" in refused and "1 time" in refused and "codes_per_hour" in refused
    await daemon.stop()


# -- 3. pairing approve --role and --admin ------------------------------------------------------------

HELPER_ROLE = '[roles.helper]\nskills = []\ndaily_tokens = 777\n[access.roles]\n"telegram:13" = "user"\n'


def approve(tmp_path, code: str, *options: str):
    return run(["--config", str(tmp_path / "openclaw.toml"), "pairing", "approve", code, *options],
               tmp_path, timeout=60)


async def test_pairing_approve_stores_the_role_and_the_owner_flag_and_the_config_still_wins(tmp_path):
    tg = RecordingConnector("telegram")
    daemon, _ = await started(tmp_path, ScriptedModel(lambda m: "hello"), HELPER_ROLE, also=(tg,))
    daemon.gateway.welcomes.poll_s = 3600  # no welcome among the answers this test reads
    daemon.gateway.welcomes.wake()
    for user in ("11", "12", "13"):
        await tg.handler(msg("hi", user=user, channel="telegram"))
    await daemon.gateway.wait_idle()
    codes = {c.user: c.code for c in await daemon.store.list_pairing_codes()}

    typo = await asyncio.to_thread(approve, tmp_path, codes["telegram:11"], "--role", "helpr")
    assert typo.returncode == 2 and "no role 'helpr'" in typo.stderr and "helper" in typo.stderr
    assert len(await daemon.store.list_pairing_codes()) == 3  # the code was not spent

    done = await asyncio.to_thread(approve, tmp_path, codes["telegram:11"], "--role", "helper")
    assert done.returncode == 0 and "role helper" in done.stdout and "owner" not in done.stdout
    done = await asyncio.to_thread(approve, tmp_path, codes["telegram:12"], "--admin")
    assert done.returncode == 0 and "role admin, an owner" in done.stdout
    done = await asyncio.to_thread(approve, tmp_path, codes["telegram:13"], "--role", "helper")
    assert done.returncode == 0 and "role user" in done.stdout
    assert "access.roles in the config names telegram:13" in done.stderr
    stored = {u: await daemon.store.get_user("telegram", u) for u in ("11", "12", "13")}
    assert (stored["11"].role, stored["11"].admin) == ("helper", False)
    assert (stored["12"].role, stored["12"].admin) == (None, True)
    # An admin's test run acts with the role the daemon gives them.
    ran = await asyncio.to_thread(run, ["--config", str(tmp_path / "openclaw.toml"), "skills", "run",
                                        "clock", "--as", "telegram:11"], tmp_path, timeout=60)
    assert json.loads(ran.stdout)["role"] == "helper", ran.stdout + ran.stderr

    async def status(user: str) -> str:
        return await say(daemon, tg, "/status", user=user)

    assert "of 777 a day" in await status("11")  # the helper role's cap
    assert "everyone" in await status("12")  # what an owner sees
    assert "Nobody is waiting" in await say(daemon, tg, "/pairing", user="12")  # and may answer
    assert "of 777" not in await status("13")  # the config's role, not the stored one
    assert (await say(daemon, tg, "/pairing", user="11")).startswith("Only the owner")
    await daemon.stop()


async def test_an_owner_made_by_pairing_approve_admin_is_told_of_requests(tmp_path):
    daemon, _, tg, _ = await asked(tmp_path, "hi", user="12")
    [code] = await daemon.store.list_pairing_codes()
    assert (await daemon.store.approve_pairing(code.code, admin=True)).admin
    await tg.handler(msg("hello", user="14", channel="telegram"))
    await daemon.gateway.wait_idle()
    await until(lambda: any("telegram user 14" in t and "asks for access" in t
                            for t in tg.texts("12")))
    await daemon.stop()
