"""Time source: a `Clock` protocol; every time-dependent decision takes one (tests inject `FakeClock`)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

DEFAULT_FAKE_START = datetime(2024, 1, 1, tzinfo=UTC)


@runtime_checkable
class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware, in UTC."""
        ...


class WaitingClock(Clock, Protocol):
    """A clock that can also wait (the Agent's retries, lock renewal); tests move time instead of waiting."""

    async def sleep(self, seconds: float) -> None: ...


def ensure_utc(value: datetime) -> datetime:
    """Return `value` in UTC; a naive datetime is a programming error (its zone is unknowable)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"datetime must be timezone-aware, got naive {value!r}")
    return value.astimezone(UTC)


class SystemClock:
    """The wall clock (UTC), and real waiting."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class FakeClock:
    """A settable clock for tests: time moves only when the test says so."""

    def __init__(self, start: datetime = DEFAULT_FAKE_START) -> None:
        self._now = ensure_utc(start)

    def now(self) -> datetime:
        return self._now

    def set(self, value: datetime) -> None:
        self._now = ensure_utc(value)

    def advance(self, delta: timedelta | float) -> datetime:
        """Move forward by `delta` (a timedelta or seconds); returns the new time."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        if step < timedelta(0):
            raise ValueError("a clock does not go backwards; use set() to rewind on purpose")
        self._now = self._now + step
        return self._now
