"""The rates that bound pairing, inside the Store's transaction that gives out a code: how many
codes a stranger and everyone had lately, whose waiting code makes room for a newcomer's, and the
record of refused requests the owner is shown. Store.create_pairing_code is the one caller."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from openclaw.store.models import PairingCodeRow, PairingIssuedRow, PairingRefusalRow, UserRow
from openclaw.store.records import PairingLimits, PairingRefusalReason, user_key


async def why_refused(session: AsyncSession, user: str, limits: PairingLimits,
                      now: datetime) -> PairingRefusalReason | None:
    """Why `user` may not have a new code now, or None if they may."""
    mine = await session.scalar(
        select(func.count()).select_from(PairingIssuedRow)
        .where(PairingIssuedRow.user == user,
               PairingIssuedRow.at > now - timedelta(seconds=limits.per_user_window_s)))
    if (mine or 0) >= limits.per_user:
        return PairingRefusalReason.USER_RATE
    everyone = await session.scalar(
        select(func.count()).select_from(PairingIssuedRow)
        .where(PairingIssuedRow.at > now - timedelta(seconds=limits.overall_window_s)))
    if (everyone or 0) >= limits.overall:
        return PairingRefusalReason.OVERALL_RATE
    return None


async def make_room(session: AsyncSession, user_id: int, limits: PairingLimits, now: datetime) -> None:
    """Expire waiting codes of others until one more fits under `limits.pending`: first those of
    whoever had the most codes today, then the oldest. So strangers who keep asking again lose
    their codes to each other before a newcomer's, and a newcomer always gets one."""
    waiting = (await session.execute(
        select(PairingCodeRow.id, UserRow.channel, UserRow.external_id)
        .join(UserRow, PairingCodeRow.user_id == UserRow.id)
        .where(PairingCodeRow.user_id != user_id, PairingCodeRow.used_at.is_(None),
               PairingCodeRow.expires_at > now)
        .order_by(PairingCodeRow.id))).all()
    excess = len(waiting) - max(limits.pending, 1) + 1
    if excess <= 0:
        return
    holders = {code_id: user_key(channel, external) for code_id, channel, external in waiting}
    counted = await session.execute(
        select(PairingIssuedRow.user, func.count()).where(
            PairingIssuedRow.user.in_(set(holders.values())),
            PairingIssuedRow.at > now - timedelta(seconds=limits.per_user_window_s))
        .group_by(PairingIssuedRow.user))
    had = {holder: count for holder, count in counted.all()}
    dropped = sorted(holders, key=lambda code_id: (-had.get(holders[code_id], 0), code_id))[:excess]
    await session.execute(update(PairingCodeRow).where(PairingCodeRow.id.in_(dropped))
                          .values(expires_at=now).execution_options(synchronize_session=False))


async def count_issued(session: AsyncSession, user: str, now: datetime) -> None:
    """Count a code given to `user`, and forget those older than the longest window."""
    session.add(PairingIssuedRow(user=user, at=now))
    oldest = now - timedelta(seconds=max(PairingLimits.per_user_window_s, PairingLimits.overall_window_s))
    await session.execute(delete(PairingIssuedRow).where(PairingIssuedRow.at <= oldest))


async def record_refusal(session: AsyncSession, user: str, reason: PairingRefusalReason,
                         now: datetime) -> None:
    """One more refused request of `user`; the record stays bounded (PairingLimits.keep_refused
    strangers, for keep_refused_s), however many strangers ask, however often."""
    await session.execute(delete(PairingRefusalRow).where(
        PairingRefusalRow.last_at < now - timedelta(seconds=PairingLimits.keep_refused_s)))
    row = await session.scalar(select(PairingRefusalRow).where(PairingRefusalRow.user == user))
    if row is None:
        session.add(PairingRefusalRow(user=user, reason=reason, count=1, first_at=now, last_at=now))
        await session.flush()
        newest = (select(PairingRefusalRow.id).order_by(PairingRefusalRow.last_at.desc(),
                                                        PairingRefusalRow.id.desc())
                  .limit(PairingLimits.keep_refused))
        await session.execute(delete(PairingRefusalRow).where(PairingRefusalRow.id.not_in(newest))
                              .execution_options(synchronize_session=False))
    else:
        row.reason, row.count, row.last_at = reason, row.count + 1, now
