"""The `reminders` skill: what it reads from the words a model writes for a time, and its calls
through the executor into the daemon's real reminder book (a SQLite store with a fixed clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from openclaw.reminders import Reminders
from openclaw.store import Store
from sandbox.policy import Policy
from skills import Skill, SkillError
from skills.builtin import spoken_time
from skills.builtin.reminders import REMIND_USAGE, REMINDERS_USAGE, RemindersSkill
from skills.builtin.spoken_time import local_time, parse_when, split_repeat, split_request
from skills.executor import Executor
from skills.registry import SkillRegistry

PARIS = ZoneInfo("Europe/Paris")
NOW = datetime(2026, 11, 30, 9, 15, tzinfo=UTC)  # a Monday; 10:15 in Paris


def at(when: str, now: datetime = NOW, zone: ZoneInfo = PARIS) -> datetime:
    # In UTC: a time in a repeated DST hour never compares equal to another zone's (PEP 495).
    return parse_when(when, now, zone).astimezone(UTC)


@pytest.mark.parametrize(("when", "after"), [
    ("in 20 minutes", timedelta(minutes=20)),
    ("20m", timedelta(minutes=20)),
    ("2h30m", timedelta(hours=2, minutes=30)),
    ("in 1 hour and 15 minutes", timedelta(hours=1, minutes=15)),
    ("1 day, 2 hours", timedelta(days=1, hours=2)),
    ("90 seconds from now", timedelta(seconds=90)),
    ("1.5 hours", timedelta(minutes=90)),
    ("In 2 Weeks", timedelta(weeks=2)),
    ("in an hour", timedelta(hours=1)),
    ("in half an hour", timedelta(minutes=30)),
])
def test_delays_count_from_now(when, after):
    assert at(when) == NOW + after


@pytest.mark.parametrize(("when", "local"), [
    ("17:30", datetime(2026, 11, 30, 17, 30)),  # later today
    ("at 10:00", datetime(2026, 12, 1, 10, 0)),  # already past today (10:15): tomorrow
    ("5pm", datetime(2026, 11, 30, 17, 0)),
    ("9:45 am", datetime(2026, 12, 1, 9, 45)),
    ("12am", datetime(2026, 12, 1, 0, 0)),  # midnight
    ("12pm", datetime(2026, 11, 30, 12, 0)),  # noon
    ("tomorrow 9:00", datetime(2026, 12, 1, 9, 0)),
    ("tomorrow at 11pm", datetime(2026, 12, 1, 23, 0)),
    ("today at 18:00", datetime(2026, 11, 30, 18, 0)),
    ("friday at 8am", datetime(2026, 12, 4, 8, 0)),
    ("noon", datetime(2026, 11, 30, 12, 0)),
    ("on Monday 11:00", datetime(2026, 11, 30, 11, 0)),  # today, still ahead
    ("monday 9:00", datetime(2026, 12, 7, 9, 0)),  # today's has passed: next week's
    ("next monday 11:00", datetime(2026, 12, 7, 11, 0)),  # "next": never today's
    ("next wednesday at 7pm", datetime(2026, 12, 2, 19, 0)),
    ("2026-12-24 09:00", datetime(2026, 12, 24, 9, 0)),
    ("2026-12-24T09:00:30", datetime(2026, 12, 24, 9, 0, 30)),
    # The day said after the time, as people say it.
    ("9am tomorrow", datetime(2026, 12, 1, 9, 0)),
    ("at 17:30 tomorrow", datetime(2026, 12, 1, 17, 30)),
    ("8:00 on friday", datetime(2026, 12, 4, 8, 0)),
    ("7pm next wednesday", datetime(2026, 12, 2, 19, 0)),
    ("17.30", datetime(2026, 11, 30, 17, 30)),  # as written in much of Europe
    ("at 13", datetime(2026, 11, 30, 13, 0)),  # a bare hour past 12 is no riddle
    # Calendar dates, with the time before or after, the year named or the next one to come.
    ("december 24 at 9am", datetime(2026, 12, 24, 9, 0)),
    ("Dec 24th, 2027 at 17:30", datetime(2027, 12, 24, 17, 30)),
    ("24 december 18:00", datetime(2026, 12, 24, 18, 0)),
    ("on the 3rd of jan at 8am", datetime(2027, 1, 3, 8, 0)),  # January has passed this year
    ("22:00 on 30 november", datetime(2026, 11, 30, 22, 0)),  # today, still ahead
    ("2026-12-24 9:00", datetime(2026, 12, 24, 9, 0)),
    ("2026-12-24 at 9pm", datetime(2026, 12, 24, 21, 0)),
    ("feb 29 at noon", datetime(2028, 2, 29, 12, 0)),  # the next leap year's
])
def test_clock_times_and_dates_are_wall_clock_time_in_the_users_zone(when, local):
    assert at(when) == local.replace(tzinfo=PARIS).astimezone(UTC)


@pytest.mark.parametrize(("when", "local"), [
    # Midnight with no day named, or on a day whose start is gone: the coming one, tonight's.
    ("midnight", datetime(2026, 12, 1, 0, 0)),
    ("at midnight", datetime(2026, 12, 1, 0, 0)),
    ("today at midnight", datetime(2026, 12, 1, 0, 0)),
    ("monday at midnight", datetime(2026, 12, 1, 0, 0)),  # said on a Monday: tonight
    ("november 30 at midnight", datetime(2026, 12, 1, 0, 0)),  # today's date: tonight
    # A clock time is read as a calendar reads it: 00:00 and 12am start the day they are on.
    ("december 31 at 00:00", datetime(2026, 12, 31, 0, 0)),
    ("december 31 at 12am", datetime(2026, 12, 31, 0, 0)),
])
def test_midnight_is_the_coming_one_unless_a_later_day_is_named(when, local):
    assert at(when) == local.replace(tzinfo=PARIS).astimezone(UTC)


@pytest.mark.parametrize("when", [
    "december 31 at midnight", "midnight on december 31", "friday midnight",
    "at midnight on friday", "tomorrow at midnight", "next monday at midnight",
    split_repeat("every friday at midnight")[1],
])
def test_midnight_on_a_later_day_is_asked_about_start_or_end(when):
    # "December 31 at midnight" is New Year's to most people and Dec 31 00:00 to a calendar: a
    # wrong guess is a reminder a day early or late, so the model asks, as for "at 9".
    with pytest.raises(SkillError, match="could be the start of .* or its end") as refused:
        at(when)
    if when.startswith("december 31"):
        assert "'2026-12-31 00:00' or '2027-01-01 00:00'" in str(refused.value)


def test_in_the_hour_a_dst_change_repeats_a_time_still_ahead_is_its_second_pass():
    second_pass_0215 = datetime(2026, 10, 25, 1, 15, tzinfo=UTC)  # Paris: 02:15 CET, again
    assert at("02:30", second_pass_0215) == datetime(2026, 10, 25, 1, 30, tzinfo=UTC)
    first_pass_0215 = datetime(2026, 10, 25, 0, 15, tzinfo=UTC)  # 02:15 CEST
    assert at("02:30", first_pass_0215) == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    assert at("02:00", second_pass_0215) == datetime(2026, 10, 26, 1, 0, tzinfo=UTC)  # tomorrow


@pytest.mark.parametrize(("when", "split"), [
    ("every day at 8:00", ("daily", "at 8:00")),
    ("Every weekday at 7am", ("weekdays", "at 7am")),
    ("every monday at 9:00", ("weekly", "monday at 9:00")),  # first: the next Monday
    ("every day at 9", ("daily", "at 9")),  # "at" kept: a bare hour said as a time, to be asked
    ("daily 18:30", ("daily", "18:30")),
    ("in 20 minutes", (None, "in 20 minutes")),
    ("every now and then", (None, "every now and then")),
])
def test_a_repeat_said_in_when_is_read_off_its_front(when, split):
    assert split_repeat(when) == split


def test_a_bare_hour_in_a_repeat_is_asked_about_like_any_other():
    with pytest.raises(SkillError, match="could be 9am or 9pm"):
        at(split_repeat("every day at 9")[1])


@pytest.mark.parametrize(("request_", "split"), [
    ("in 20 minutes to stretch", ("in 20 minutes", "stretch")),
    ("me in 5 minutes to call Bob", ("in 5 minutes", "call Bob")),
    ("every weekday at 8:00 pills", ("every weekday at 8:00", "pills")),
    ("call mum at 17:30", ("at 17:30", "call mum")),  # the time last
    ("water the plants in 2 hours", ("in 2 hours", "water the plants")),
    ("2020-01-01 09:00 old news", ("2020-01-01 09:00", "old news")),  # past: refused later
    ("in 10 minutes to turn the oven on", ("in 10 minutes", "turn the oven on")),
    ("5 min break at 3pm", ("at 3pm", "5 min break")),  # a bare duration may be the text's
    ("me to call 5pm bob at 6pm", ("at 6pm", "call 5pm bob")),
    ("9am tomorrow call the dentist", ("9am tomorrow", "call the dentist")),
    ("call mum on december 24 at 6pm", ("on december 24 at 6pm", "call mum")),
    ("water the plants at 8", ("at 8", "water the plants")),  # then refused: which 8?
    ("take pills every day at 9", ("every day at 9", "take pills")),  # the repeat kept, 9 asked
    # A number before a day is the text's ("order 3"), not a bare hour to ask about.
    ("me at 5pm to order 3 on monday", ("at 5pm", "order 3 on monday")),
    ("in 10 minutes to pay 2 on december 24", ("in 10 minutes", "pay 2 on december 24")),
    # Without "at", a dotted number ending a line is a price or a version, not "17.30".
    ("buy milk 2.50", None),
    ("me to upgrade to python 3.12", None),
    # A repeat word that is what the reminder is about stays in the text.
    ("weekly report at 5pm", ("at 5pm", "weekly report")),
    ("daily standup at 9am", ("at 9am", "daily standup")),
    ("every monday standup at 9am", ("every monday at 9am", "standup")),
    # A day said first and the time last belong together (not 10am today with "friday" as text).
    ("friday call bob at 10am", ("friday at 10am", "call bob")),
    ("me on friday to call bob at 10am", ("on friday at 10am", "call bob")),
    ("next friday call bob at 10am", ("next friday at 10am", "call bob")),
    ("tomorrow call bob at 10am", ("tomorrow at 10am", "call bob")),
    ("December 31 call bob at 9am", ("December 31 at 9am", "call bob")),
    ("every monday call bob at 10am", ("every monday at 10am", "call bob")),
    ("friday call bob at 8", ("friday at 8", "call bob")),  # then asked: which 8?
    ("friday call bob tomorrow at 10am", ("tomorrow at 10am", "friday call bob")),  # a day each
    ("call mum at 17.30", ("at 17.30", "call mum")),
    ("in 20 minutes", None),  # no text
    ("stretch", None),  # no time
])
def test_a_one_line_request_splits_into_when_and_what(request_, split):
    assert split_request(request_) == split


def test_a_day_said_before_the_text_sets_the_day_of_the_time_after_it():
    when, text = split_request("friday call bob at 10am")
    assert at(when) == datetime(2026, 12, 4, 9, 0, tzinfo=UTC)  # Friday 10:00 in Paris
    assert text == "call bob"


def test_a_long_request_is_split_in_linear_time(monkeypatch):
    # A time is a few words: only the ends of a long line are tried, not every split of it.
    calls = []
    monkeypatch.setattr(spoken_time, "_readable", lambda when: calls.append(when) or False)
    assert split_request("buy 3 eggs " * 2000) is None
    assert len(calls) <= 2 * spoken_time.MAX_WHEN_WORDS


def test_an_explicit_offset_wins_over_the_zone():
    assert at("2026-12-24T09:00+05:00") == datetime(2026, 12, 24, 4, 0, tzinfo=UTC)
    assert at("2026-12-24T09:00Z") == datetime(2026, 12, 24, 9, 0, tzinfo=UTC)


def test_tomorrow_across_a_dst_change_keeps_the_wall_clock_time():
    before_change = datetime(2026, 3, 28, 12, 0, tzinfo=UTC)  # Saturday; Sunday is summer time
    assert at("tomorrow 9:00", before_change) == datetime(2026, 3, 29, 7, 0, tzinfo=UTC)
    # 10:00 EST on the eve of the US change: 9:00 is tomorrow, in summer time (13:00 UTC, not 14:00).
    eve = datetime(2026, 3, 7, 15, 0, tzinfo=UTC)
    assert at("9:00", eve, ZoneInfo("America/New_York")) == datetime(2026, 3, 8, 13, 0, tzinfo=UTC)


def test_a_time_the_clock_skips_is_said_back_as_the_time_it_rings():
    saturday = datetime(2026, 3, 28, 12, 0, tzinfo=UTC)  # Paris skips 02:00-03:00 on Sunday
    due = parse_when("tomorrow 2:30", saturday, PARIS)
    assert due.astimezone(UTC) == datetime(2026, 3, 29, 1, 30, tzinfo=UTC)  # 03:30 summer time
    assert local_time(due, PARIS) == "Sun 29 Mar 2026 03:30"  # not 02:30, which never shows


@pytest.mark.parametrize(("when", "error"), [
    ("", "needs when"),
    ("next tuesday", "cannot read"),
    ("5", "cannot read"),  # a bare number is neither a time nor a delay
    ("25:00", "cannot read"),
    ("13pm", "cannot read"),
    ("in 3 fortnights", "cannot read"),
    ("2026-12-24", "no time of day"),
    ("today at 8:00", "in the past"),
    ("2026-11-30 10:00", "in the past"),
    ("0 minutes", "in the past"),
    ("in 3700 days", "ten years"),
    ("999999999 weeks", "ten years"),
    ("in 9999999999 days", "ten years"),
    ("1" * 400 + " seconds", "ten years"),
    ("0001-01-01T00:00", "in the past"),
    ("9999-12-31T23:59-14:00", "ten years"),
    ("friday", "cannot read"),  # a day without a time
    ("next tomorrow 9:00", "cannot read"),
    # A bare hour said as a time: morning or evening is the user's to say, not ours to guess.
    ("at 9", "could be 9am or 9pm"),
    ("tomorrow at 7", "could be 7am or 7pm"),
    ("at 8 tomorrow", "could be 8am or 8pm"),
    ("december 24 at 9", "could be 9am or 9pm"),
    ("at 3 on monday", "could be 3am or 3pm"),
    ("3 on monday", "cannot read"),  # no "at": a number, as in "order 3 on monday"
    ("9 tomorrow", "cannot read"),
    ("2 on december 24", "cannot read"),
    ("december 24", "no time of day"),
    ("february 30 at 9am", "not a day of the calendar"),
    ("2026-13-01 9:00", "not a day of the calendar"),
    ("november 30 at 9am", "in the past"),  # today's, already gone: not next year's
])
def test_what_cannot_be_a_time_ahead_is_refused_with_how_to_write_it(when, error):
    with pytest.raises(SkillError, match=error):
        at(when)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
async def book(tmp_path):
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}", clock=Clock())
    yield Reminders(store, max_active=3)
    await store.close()


def executor(book, tmp_path, settings=None) -> tuple[Executor, Policy]:
    registry = SkillRegistry()
    registry.add(RemindersSkill(), "built-in", settings or {"timezone": "Europe/Paris"})
    return Executor(registry, sandbox=None, reminders=book), Policy({}, tmp_path, lambda u: "user")


async def test_add_list_and_cancel_through_the_executor(book, tmp_path):
    run, policy = executor(book, tmp_path)
    ada, bob = policy.principal("telegram:1"), policy.principal("telegram:2")

    added = await run.call("reminders", {"action": "add", "text": "call mum", "when": "17:30",
                                         "repeat": "weekdays"}, ada, chat_id="1")
    assert added.ok, added.text
    assert added.text == ("Reminder #1 set for Mon 30 Nov 2026 17:30 Europe/Paris (in 7 h 15 min), "
                          "then weekdays: call mum")
    [kept] = await book.pending("telegram:1")
    assert (kept.chat_id, kept.channel, kept.repeat, kept.timezone, kept.due_at) == (
        "1", "telegram", "weekdays", "Europe/Paris", datetime(2026, 11, 30, 16, 30, tzinfo=UTC))
    tokyo = await run.call("reminders", {"action": "add", "text": "standup", "when": "tomorrow 9:00",
                                         "timezone": "Asia/Tokyo"}, ada, chat_id="1")
    assert "Tue 01 Dec 2026 09:00 Asia/Tokyo" in tokyo.text
    # 'tomorrow' is Tokyo's (where it is already 18:15): 00:00 UTC, after the 16:30 UTC one.
    assert [r.text for r in await book.pending("telegram:1")] == ["call mum", "standup"]

    listed = await run.call("reminders", {"action": "list"}, ada, chat_id="1")
    assert listed.text.splitlines() == [
        "Now: Mon 30 Nov 2026 10:15 Europe/Paris.",
        "#1 Mon 30 Nov 2026 17:30 Europe/Paris (repeats weekdays): call mum",
        "#2 Tue 01 Dec 2026 09:00 Asia/Tokyo: standup"]
    theirs = await run.call("reminders", {"action": "list"}, bob, chat_id="2")
    assert theirs.text.endswith("You have no reminders in this chat.")
    # In another chat (a group, say) Ada's reminders are counted, never shown.
    group = await run.call("reminders", {"action": "list"}, ada, chat_id="group-9")
    assert group.text.splitlines()[1:] == ["(2 more in other chats: ask there to see them.)"]
    assert "call mum" not in group.text
    from_group = await run.call("reminders", {"action": "cancel", "number": 2}, ada, chat_id="group-9")
    assert from_group.text == "Cancelled reminder #2 (set in another chat)."

    denied = await run.call("reminders", {"action": "cancel", "number": 1}, bob, chat_id="2")
    assert not denied.ok and "no active reminder #1" in denied.text
    done = await run.call("reminders", {"action": "cancel", "number": 1}, ada, chat_id="1")
    assert done.ok and done.text == "Cancelled reminder #1: call mum"
    assert await book.pending("telegram:1") == []


async def test_every_user_counts_their_own_reminders_from_one(book, tmp_path):
    run, policy = executor(book, tmp_path)
    ada, bob = policy.principal("telegram:1"), policy.principal("telegram:2")

    async def add(who, text: str) -> str:
        return (await run.call("reminders", {"action": "add", "text": text, "when": "17:30"}, who,
                               chat_id=who.user.split(":")[1])).text

    assert (await add(ada, "call mum")).startswith("Reminder #1 set")
    assert (await add(bob, "buy bread")).startswith("Reminder #1 set")
    cancelled = await run.call("reminders", {"action": "cancel", "number": 1}, bob, chat_id="2")
    assert cancelled.text == "Cancelled reminder #1: buy bread"
    listed = await run.call("reminders", {"action": "list"}, ada, chat_id="1")
    assert listed.text.splitlines()[1:] == ["#1 Mon 30 Nov 2026 17:30 Europe/Paris: call mum"]
    assert (await add(bob, "buy milk")).startswith("Reminder #2 set")  # #1 is not given again


async def test_a_weekday_reminder_set_for_a_weekend_starts_on_monday(book, tmp_path):
    run, policy = executor(book, tmp_path)
    book.store._clock.now = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)  # a Friday
    added = await run.call("reminders", {"action": "add", "text": "standup", "when": "tomorrow 9:00",
                                         "repeat": "weekdays"}, policy.principal("telegram:1"),
                           chat_id="1")
    assert "Mon 07 Dec 2026 09:00 Europe/Paris (moved to Monday: it repeats on weekdays)" in added.text
    [kept] = await book.pending("telegram:1")
    assert (kept.due_at, kept.local_time) == (datetime(2026, 12, 7, 8, 0, tzinfo=UTC), "09:00:00")


async def test_the_users_words_for_a_repeat_set_it(book, tmp_path):
    run, policy = executor(book, tmp_path)
    added = await run.call("reminders", {"action": "add", "text": "pills",
                                         "when": "every weekday at 8:00"},
                           policy.principal("telegram:1"), chat_id="1")
    assert added.text.endswith("(in 21 h 45 min), then weekdays: pills"), added.text
    [kept] = await book.pending("telegram:1")
    assert (kept.repeat, kept.local_time) == ("weekdays", "08:00:00")


async def test_a_number_no_reminder_can_have_is_no_active_reminder(book, tmp_path):
    # "/reminders cancel 99999999999999999999" reached SQLite, which cannot hold it: OverflowError.
    run, policy = executor(book, tmp_path)
    ada = policy.principal("telegram:1")
    assert (await run.call("reminders", {"action": "add", "text": "tea", "when": "5pm"}, ada,
                           chat_id="1")).ok
    for number in (10**20, 2**63, -(2**63) - 1, 0, -1):
        outcome = await run.call("reminders", {"action": "cancel", "number": number}, ada, chat_id="1")
        assert not outcome.ok and f"no active reminder #{number}" in outcome.text, outcome.text
    assert [r.text for r in await book.pending("telegram:1")] == ["tea"]


@pytest.mark.parametrize(("when", "repeat"), [
    ("every monday at 9am", "daily"),
    ("every day at 8:00", "weekdays"),
    ("every weekday at 7am", "weekly"),
])
async def test_a_repeat_in_the_users_words_that_the_model_contradicts_is_refused(book, tmp_path,
                                                                                when, repeat):
    # The user said "every monday"; a model that also sent repeat=daily set a daily reminder.
    run, policy = executor(book, tmp_path)
    outcome = await run.call("reminders", {"action": "add", "text": "x", "when": when,
                                           "repeat": repeat}, policy.principal("telegram:1"),
                             chat_id="1")
    assert not outcome.ok and f"but repeat={repeat}" in outcome.text, outcome.text
    assert await book.pending("telegram:1") == []


async def test_a_repeat_said_both_ways_alike_is_set_once(book, tmp_path):
    run, policy = executor(book, tmp_path)
    outcome = await run.call("reminders", {"action": "add", "text": "x", "when": "every monday at 9am",
                                           "repeat": "weekly"}, policy.principal("telegram:1"),
                             chat_id="1")
    assert outcome.ok and outcome.text.endswith(", then weekly: x"), outcome.text


async def test_mistakes_come_back_to_the_model_and_store_nothing(book, tmp_path):
    run, policy = executor(book, tmp_path)
    ada = policy.principal("telegram:1")

    async def error(args, chat_id="1") -> str:
        outcome = await run.call("reminders", args, ada, chat_id=chat_id)
        assert not outcome.ok
        return outcome.text

    assert "cannot read when='someday'" in await error({"action": "add", "text": "x", "when": "someday"})
    assert "needs the text" in await error({"action": "add", "when": "5pm"})
    assert "needs a chat" in await error({"action": "add", "text": "x", "when": "5pm"}, chat_id="")
    assert "unknown time zone 'Mars/Base'" in await error(
        {"action": "add", "text": "x", "when": "5pm", "timezone": "Mars/Base"})
    assert "must be one of" in await error({"action": "add", "text": "x", "when": "5pm", "repeat": "hourly"})
    assert "needs the reminder's number" in await error({"action": "cancel"})
    assert "at most 1000" in await error({"action": "add", "text": "x" * 1001, "when": "5pm"})
    assert await book.pending("telegram:1") == []

    for n in range(3):
        assert (await run.call("reminders", {"action": "add", "text": f"r{n}", "when": "5pm"}, ada,
                               chat_id="1")).ok
    assert "too many active reminders" in await error({"action": "add", "text": "r4", "when": "5pm"})


async def test_without_a_daemon_to_deliver_them_reminders_say_so(tmp_path):
    run, policy = executor(None, tmp_path)
    outcome = await run.call("reminders", {"action": "list"}, policy.principal("telegram:1"), chat_id="1")
    assert not outcome.ok and "need the running daemon" in outcome.text


def test_a_bad_timezone_setting_names_the_key():
    assert RemindersSkill.check_settings({"timezone": "Nowhere/Else"}) == [
        "timezone: unknown time zone 'Nowhere/Else'; use an IANA name such as 'Europe/Paris'"]
    assert RemindersSkill.check_settings({"timezone": "Asia/Tokyo"}) == []
    # A typo is said, not left to set every reminder in the machine's zone instead.
    assert RemindersSkill.check_settings({"timzone": "Asia/Tokyo"}) == [
        "timzone: unknown setting (reminders takes only timezone)"]


def test_the_approval_prompt_shows_the_text_on_one_line_as_written():
    shown = RemindersSkill().describe(
        {"action": "add", "when": "in 5\u202e minutes", "text": "stretch\nReply /deny 000000 if unsure"})
    assert "\n" not in shown and "\u202e" not in shown
    assert shown == "remind you in 5\\u202e minutes: stretch\\u000aReply /deny 000000 if unsure"


@pytest.mark.parametrize(("command", "argument", "call"), [
    ("/remind", "me in 2 hours to water the plants",
     {"action": "add", "when": "in 2 hours", "text": "water the plants"}),
    ("/remind", "call mum at 17:30", {"action": "add", "when": "at 17:30", "text": "call mum"}),
    ("/remind", "stretch", REMIND_USAGE),
    ("/remind", "", REMIND_USAGE),
    ("/reminders", "", {"action": "list"}),
    ("/reminders", "cancel #2", {"action": "cancel", "number": 2}),
    ("/reminders", "CANCEL 3", {"action": "cancel", "number": 3}),
    ("/reminders", "cancel", REMINDERS_USAGE),
    ("/reminders", "delete 1", REMINDERS_USAGE),
])
def test_a_typed_command_is_the_skills_call_or_how_to_write_it(command, argument, call):
    assert RemindersSkill().typed_command(command, argument) == call


def test_a_skill_without_typed_commands_says_so():
    class Quiet(Skill):
        name, description = "quiet", "says nothing"

        async def run(self, args, ctx) -> str:
            return ""

    assert Quiet().typed_command("/quiet", "now") == \
        "The quiet skill takes no typed commands: ask me in a message instead."
