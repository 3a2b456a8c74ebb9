"""A clock the test moves by hand, shared by the embedded broker (lock expiry) and a consumer's lock renewal.

`clock()` / `clock.now()` read the time; `await clock.sleep(s)` returns once the test has moved the time `s` past the
call; `await clock.advance(s)` moves it and lets every sleeper whose time came run until it sleeps again (or ends).
So "the consumer worked 20 s while its lock lasts 5 s" is a sequence of clock moves, not a 20 s wait.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta


class SteppedClock:
    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime.now(UTC)
        self._changed: asyncio.Condition | None = None
        self.sleeping: list[datetime] = []  # when each current sleeper wakes up
        self.sleeps: list[float] = []

    def __call__(self) -> datetime:  # the broker's clock (called from its worker threads: a plain read)
        return self._now

    def now(self) -> datetime:
        return self._now

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        wake = self._now + timedelta(seconds=seconds)
        changed = self._condition()
        async with changed:
            self.sleeping.append(wake)
            changed.notify_all()
            try:
                await changed.wait_for(lambda: self._now >= wake)
            finally:
                self.sleeping.remove(wake)
                changed.notify_all()

    async def advance(self, seconds: float, settle_timeout: float = 2.0) -> bool:
        """Move the time; then wait (bounded, real time) until every sleeper is waiting for a later moment again,
        i.e. whatever woke up has done its work. False when that did not happen within `settle_timeout` (a
        sleeper that woke up and ended, or none sleeping)."""
        self._now += timedelta(seconds=seconds)
        changed = self._condition()
        async with changed:
            changed.notify_all()
        deadline = time.monotonic() + settle_timeout
        while time.monotonic() < deadline:
            async with changed:
                if self.sleeping and all(wake > self._now for wake in self.sleeping):
                    return True
            await asyncio.sleep(0.005)  # the woken sleeper's work runs in broker threads: poll, bounded
        return False
