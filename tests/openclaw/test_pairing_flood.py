"""Pairing under a flood of strangers: a few of them renewing their codes cannot keep a newcomer
out, codes are issued at a bounded rate (per stranger and overall), and the owner sees who was
refused (`openclaw pairing list`). Through the real store (SQLite, and PostgreSQL when one can be
started), the daemon's gateway, the fake Telegram Bot API and the `openclaw` command."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from openclaw.config import ConfigError, load_config
from openclaw.gateway.access import pairing_limits
from openclaw.store import PairingLimits, PairingRefusalReason, Store
from tests.helpers import telegram_env
from tests.helpers.cli import run
from tests.helpers.clock import FakeClock
from tests.helpers.daemon import RecordingConnector, msg, started
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.store import fresh_store

HOUR, DAY = 3600, 86400
fake, env = telegram_env.fake, telegram_env.env


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> AsyncIterator[Store]:
    async with fresh_store(request, tmp_path, clock=clock) as opened:
        yield opened


async def stranger(store: Store, number: int, name: str | None = None) -> str:
    return (await store.ensure_user("telegram", number, name)).key


async def live_holders(store: Store) -> list[str]:
    return [c.user for c in await store.list_pairing_codes()]


# -- the store ------------------------------------------------------------------------------------

async def test_three_strangers_renewing_hourly_cannot_keep_newcomers_out(store: Store, clock: FakeClock):
    """The attack: three strangers hold the three pending codes and ask again each time theirs
    expires. Every newcomer, in any hour of the day, still gets a code."""
    attackers = [await stranger(store, n) for n in (1, 2, 3)]
    for hour in range(24):
        for attacker in attackers:
            await store.create_pairing_code(attacker)
        newcomer = await stranger(store, 100 + hour)
        code = await store.create_pairing_code(newcomer)
        assert code is not None, f"hour {hour}: a newcomer got no code"
        assert newcomer in await live_holders(store)
        assert await store.create_pairing_code(newcomer) == code  # asking again: the same code
        clock.advance(HOUR + 1)
    # Three codes a day each, then they were refused, and the owner sees it.
    refused = {r.user: r for r in await store.list_pairing_refusals()}
    assert set(refused) == set(attackers)
    assert all(r.reason is PairingRefusalReason.USER_RATE and r.count == 21 for r in refused.values())


async def test_a_full_pending_set_drops_the_code_of_whoever_had_the_most_then_the_oldest(
        store: Store, clock: FakeClock):
    a, b, c, d = [await stranger(store, n) for n in (1, 2, 3, 4)]
    codes = {u: await store.create_pairing_code(u) for u in (a, b, c)}
    clock.advance(1)
    assert await store.create_pairing_code(d) is not None
    assert await live_holders(store) == [b, c, d]  # a's, the oldest, went
    assert await store.approve_pairing(codes[a]) is None  # and can no longer be approved
    assert await store.create_pairing_code(a) not in (None, codes[a])  # a second code for a
    assert await live_holders(store) == [c, d, a]  # b's went: everyone had one code
    # b asks again: a had two codes today, so a's goes, not c's (older, but c's first).
    assert await store.create_pairing_code(b) is not None
    assert await live_holders(store) == [c, d, b]
    assert (await store.approve_pairing(codes[c])).key == c


async def test_a_stranger_gets_at_most_three_codes_a_day_then_is_refused_and_counted(
        store: Store, clock: FakeClock):
    user = await stranger(store, 1, "Eve")
    first = await store.create_pairing_code(user)
    assert await store.create_pairing_code(user) == first  # no fresh code while one lives
    issued = {first}
    for _ in range(2):
        clock.advance(HOUR + 1)
        issued.add(await store.create_pairing_code(user))
    assert None not in issued and len(issued) == 3
    clock.advance(HOUR + 1)
    assert await store.create_pairing_code(user) is None
    clock.advance(60)
    assert await store.create_pairing_code(user) is None
    [refusal] = await store.list_pairing_refusals()
    assert (refusal.user, refusal.channel, refusal.display_name) == (user, "telegram", "Eve")
    assert refusal.reason is PairingRefusalReason.USER_RATE and refusal.count == 2
    assert refusal.last_at - refusal.first_at == (clock.now - refusal.first_at)
    clock.advance(DAY - 3 * HOUR)  # a day after the first code: one more is allowed
    assert await store.create_pairing_code(user) not in (None, *issued)


async def test_codes_per_hour_overall_are_bounded(store: Store, clock: FakeClock):
    limits = replace(PairingLimits(), overall=2)
    users = [await stranger(store, n) for n in range(4)]
    assert None not in [await store.create_pairing_code(u, limits) for u in users[:2]]
    assert await store.create_pairing_code(users[2], limits) is None
    [refusal] = await store.list_pairing_refusals()
    assert (refusal.user, refusal.reason) == (users[2], PairingRefusalReason.OVERALL_RATE)
    clock.advance(HOUR)
    assert await store.create_pairing_code(users[2], limits) is not None


async def test_refused_requests_are_counted_per_stranger_and_kept_bounded(store: Store, clock: FakeClock):
    never = replace(PairingLimits(), per_user=0)
    flooder = await stranger(store, 1)
    for _ in range(30):
        await store.create_pairing_code(flooder, never)
        clock.advance(1)
    [row] = await store.list_pairing_refusals()
    assert row.count == 30
    many = [await stranger(store, 1000 + n) for n in range(PairingLimits.keep_refused + 20)]
    for user in many:
        await store.create_pairing_code(user, never)
        clock.advance(1)
    kept = await store.list_pairing_refusals()
    assert len(kept) == PairingLimits.keep_refused
    assert [r.user for r in kept] == many[::-1][:PairingLimits.keep_refused]  # newest first
    clock.advance(PairingLimits.keep_refused_s + 1)
    await store.create_pairing_code(flooder, never)
    assert [r.user for r in await store.list_pairing_refusals()] == [flooder]  # the old ones went


# -- the daemon, the fake Telegram API and the CLI --------------------------------------------------

async def test_a_newcomer_gets_a_code_through_the_gateway_and_a_refusal_shows_in_pairing_list(tmp_path):
    model = ScriptedModel(lambda m: "hello friend")
    tg = RecordingConnector("telegram")
    daemon, _ = await started(tmp_path, model, "[access.pairing]\ncodes_per_user_per_day = 1\n",
                              also=(tg,))
    for user in ("11", "12", "13", "14"):
        await tg.handler(msg("hi", user=user, channel="telegram"))
        await daemon.gateway.wait_idle()
        assert "pairing code" in tg.texts(user)[-1], tg.texts(user)
    assert [c.user for c in await daemon.store.list_pairing_codes()] == \
        ["telegram:12", "telegram:13", "telegram:14"]
    await tg.handler(msg("again", user="11", channel="telegram"))  # dropped, and had its one code
    await daemon.gateway.wait_idle()
    assert "try again later" in tg.texts("11")[-1] and "pairing code is" not in tg.texts("11")[-1]
    assert model.prompts == []
    await daemon.stop()

    config = tmp_path / "openclaw.toml"
    listing = await asyncio.to_thread(run, ["--config", str(config), "pairing", "list"], tmp_path,
                                      timeout=60)
    assert listing.returncode == 0, listing.stderr
    pending, _, refused = listing.stdout.partition("Refused")
    assert all(f"telegram:{u}" in pending for u in ("12", "13", "14"))
    assert "telegram:11" in refused and "1 time" in refused and "codes_per_user_per_day" in refused


async def test_over_telegram_three_waiting_strangers_do_not_keep_a_fourth_out(env, fake):
    daemon = await env.start(ScriptedModel(lambda m: "hello"))
    for user in (2001, 2002, 2003, 2004):
        fake.send("hi", user=user, first_name=f"S{user}")
        [reply] = await env.replies(user, 1)
        assert "pairing code" in reply
    [newest] = [c for c in await daemon.store.list_pairing_codes() if c.user == "telegram:2004"]
    assert newest.code in fake.texts(2004)[0]
    assert (await daemon.store.approve_pairing(newest.code)).key == "telegram:2004"


def test_pairing_limits_are_checked_when_the_config_is_read(tmp_path):
    path = tmp_path / "openclaw.toml"
    path.write_text("[access.pairing]\npending = 0\ncodes_per_hour = 5\n")
    with pytest.raises(ConfigError, match=r"access\.pairing\.pending"):
        load_config(path)
    path.write_text("[access.pairing]\ncodes_per_hour = 5\n")
    assert pairing_limits(load_config(path)) == PairingLimits(overall=5)
