"""timerTrigger: 6-field NCRONTAB schedules, run_on_startup, use_monitor (a missed schedule runs once at start), and
one execution at a time per function, as the Functions host's timer extension does.

Sources: "Timer trigger for Azure Functions" (learn.microsoft.com/azure/azure-functions/functions-bindings-timer):
NCRONTAB `{second} {minute} {hour} {day} {month} {day-of-week}`; `useMonitor` persists schedule status so a past-due
occurrence runs (IsPastDue=true) when the host starts; a timer function never overlaps itself (singleton lock).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from croniter import croniter

from .singleton import DEFAULT_RECOVERY_POLL_SECONDS, ListenerLock

log = logging.getLogger("devhost.timer")


class ScheduleError(ValueError):
    """The schedule is not a valid 6-field NCRONTAB expression."""


def parse_schedule(expression: str) -> str:
    fields = expression.split()
    if len(fields) != 6:
        raise ScheduleError(f"NCRONTAB needs 6 fields (second minute hour day month day-of-week), got {expression!r}")
    if not croniter.is_valid(expression, second_at_beginning=True):
        raise ScheduleError(f"invalid NCRONTAB expression {expression!r}")
    return expression


def next_occurrence(expression: str, after: datetime) -> datetime:
    """The first occurrence strictly after `after` (UTC)."""
    it = croniter(expression, after.astimezone(UTC), second_at_beginning=True)
    nxt: datetime = it.get_next(datetime)
    return nxt.astimezone(UTC)


def should_disable_schedule_monitor(expression: str, now: datetime | None = None) -> bool:
    """The timer extension's rule for turning `useMonitor` off (azure-webjobs-sdk-extensions,
    TimerSchedule.ShouldDisableScheduleMonitor, applied by TimerSchedule.Create): only when every field from minutes up
    is a wildcard and more than one occurrence falls within the next minute, i.e. a sub-minute schedule."""
    fields = parse_schedule(expression).split()
    if any(field not in ("*", "*/1") for field in fields[1:]):  # NCrontab prints a full range as "*"
        return False
    start = (now or datetime.now(UTC)).astimezone(UTC)
    first = next_occurrence(expression, start)
    return next_occurrence(expression, first) < start + timedelta(minutes=1)


def default_use_monitor(expression: str, now: datetime | None = None) -> bool:
    """`useMonitor` when the function does not say: true, unless the extension turns it off for a sub-minute schedule
    (timer trigger docs: "For schedules with a recurrence interval less than 1 minute, the default is false")."""
    return not should_disable_schedule_monitor(expression, now)


@dataclass
class ScheduleStatus:
    last: datetime | None
    next: datetime
    last_updated: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "Last": self.last.isoformat() if self.last else None,
            "Next": self.next.isoformat(),
            "LastUpdated": self.last_updated.isoformat(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScheduleStatus:
        return cls(
            last=datetime.fromisoformat(data["Last"]) if data.get("Last") else None,
            next=datetime.fromisoformat(data["Next"]),
            last_updated=datetime.fromisoformat(data["LastUpdated"]),
        )


class TimerRunner:
    """Runs one timer function: waits for the next occurrence (an event-driven sleep until due), then invokes it."""

    def __init__(
        self,
        name: str,
        expression: str,
        *,
        run_on_startup: bool,
        use_monitor: bool,
        state_dir: Path,
        invoke: Callable[[dict[str, Any]], Awaitable[None]],
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        lock: ListenerLock | None = None,
        recovery_poll: float = DEFAULT_RECOVERY_POLL_SECONDS,
    ) -> None:
        self.name = name
        self.expression = parse_schedule(expression)
        self.run_on_startup = run_on_startup
        self.use_monitor = use_monitor
        self._status_path = state_dir / "timers" / f"{name}.json"
        self._invoke = invoke
        self._now = now
        self.executions = 0
        self.lock = lock  # the listener lock across hosts sharing the state folder (singleton.py)
        self.recovery_poll = recovery_poll

    def _load_status(self) -> ScheduleStatus | None:
        try:
            return ScheduleStatus.from_json(json.loads(self._status_path.read_text()))
        except (FileNotFoundError, ValueError, KeyError):
            return None

    def _save_status(self, status: ScheduleStatus) -> None:
        self._status_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(status.to_json()))
        tmp.replace(self._status_path)

    async def _fire(self, *, past_due: bool, last: datetime | None) -> datetime:
        now = self._now()
        nxt = next_occurrence(self.expression, now)
        status = ScheduleStatus(last=last, next=nxt, last_updated=now)
        payload = {"Schedule": {"AdjustForDST": True}, "ScheduleStatus": status.to_json(), "IsPastDue": past_due}
        try:
            await self._invoke(payload)
        except Exception:  # the host logs a failed execution and keeps the schedule
            log.exception("timer function %s failed", self.name)
        self.executions += 1
        if self.use_monitor:
            self._save_status(
                ScheduleStatus(last=now, next=next_occurrence(self.expression, self._now()), last_updated=self._now())
            )
        return now

    async def run(self, stop: asyncio.Event) -> None:
        """Hold the listener lock (when there is one), then run the schedule until `stop`."""
        try:
            if self.lock is not None and not await self._acquire(self.lock, stop):
                return
            await self._run_schedule(stop)
        finally:
            if self.lock is not None:
                self.lock.release()

    async def _acquire(self, lock: ListenerLock, stop: asyncio.Event) -> bool:
        """One attempt at start-up, then one every recovery poll, as SingletonListener does; False when stopped."""
        while not lock.try_acquire():
            log.info(
                "timer %s: another host (pid %s) runs this schedule; trying again in %.0f s",
                self.name,
                lock.holder(),
                self.recovery_poll,
            )
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.recovery_poll)
                return False
            except TimeoutError:
                pass
        return True

    async def _run_schedule(self, stop: asyncio.Event) -> None:
        last: datetime | None = None
        previous = self._load_status() if self.use_monitor else None
        if previous is not None and previous.next <= self._now():
            log.info("timer %s missed its schedule at %s: running once (IsPastDue)", self.name, previous.next)
            last = await self._fire(past_due=True, last=previous.last)
        elif self.run_on_startup:
            last = await self._fire(past_due=False, last=None)
        elif self.use_monitor and previous is None:
            self._save_status(ScheduleStatus(None, next_occurrence(self.expression, self._now()), self._now()))
        # The next occurrence counts from when the previous invocation started, not from when it ended: the timer
        # extension restarts its timer after the invocation with `Next = GetNextOccurrence(invocation time)`, and an
        # interval that is already negative becomes one tick (TimerListener.HandleTimerEvent / InvokeJobFunction /
        # GetNextTimerInterval in azure-webjobs-sdk-extensions). So an execution that outlasts its period is followed
        # by one immediate invocation, not by one per missed occurrence, and never overlaps it (the awaited `_fire`
        # here is the listener's `_invocationLock`). A scheduled invocation that fired early counts from its due time.
        anchor = last or self._now()
        while not stop.is_set():
            due = next_occurrence(self.expression, anchor)
            delay = max(0.0, (due - self._now()).total_seconds())
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
                return
            except TimeoutError:
                pass
            # A scheduled invocation is never past due, however late it starts: only the start-up invocation of a
            # missed occurrence is (TimerListener.HandleTimerEvent calls InvokeJobFunction(now, isPastDue: false)).
            last = await self._fire(past_due=False, last=last)
            anchor = max(last, due)
