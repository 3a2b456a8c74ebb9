"""NCRONTAB, the useMonitor default, runOnStartup and one execution at a time (timer trigger docs,
learn.microsoft.com/azure/azure-functions/functions-bindings-timer, and the timer extension's TimerListener)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from devhost.timers import ScheduleError, TimerRunner, default_use_monitor, next_occurrence, parse_schedule

T0 = datetime(2026, 1, 1, 0, 0, 3, tzinfo=UTC)


def test_six_fields_with_seconds_first() -> None:
    assert next_occurrence("*/10 * * * * *", T0) == datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)
    assert next_occurrence("0 */5 * * * *", T0) == datetime(2026, 1, 1, 0, 5, 0, tzinfo=UTC)
    assert next_occurrence("0 30 9 * * 1-5", T0) == datetime(2026, 1, 1, 9, 30, tzinfo=UTC)


@pytest.mark.parametrize("bad", ["* * * * *", "61 * * * * *", "every minute"])
def test_invalid_schedules_are_refused(bad: str) -> None:
    with pytest.raises(ScheduleError):
        parse_schedule(bad)


@pytest.mark.parametrize(
    ("schedule", "monitor"),
    [("*/10 * * * * *", False), ("*/30 * * * * *", False), ("0 * * * * *", True), ("0 0 */2 * * *", True)],
)
def test_use_monitor_defaults_to_true_only_for_intervals_of_a_minute_or_more(schedule: str, monitor: bool) -> None:
    assert default_use_monitor(schedule, T0) is monitor


# ---- TimerRunner with an injected clock ---------------------------------------------------------------------------
# Source for the behaviour below: TimerListener in azure-webjobs-sdk-extensions
# (src/WebJobs.Extensions/Extensions/Timers/Listener/TimerListener.cs): StartAsync schedules an immediate invocation
# when RunOnStartup is set (and the schedule is not past due); InvokeJobFunction holds `_invocationLock`, a
# SemaphoreSlim(1, 1), so one listener never runs its function twice at once; HandleTimerEvent restarts its
# (AutoReset = false) timer only after the invocation, from `Next = GetNextOccurrence(invocation time)`, and
# GetNextTimerInterval turns an interval that is already negative into one tick.


def _runner(
    expression: str,
    clock: Callable[[], datetime],
    invoke: Callable[[dict[str, Any]], Awaitable[None]],
    tmp_path: Path,
    *,
    run_on_startup: bool = False,
) -> TimerRunner:
    return TimerRunner(
        "t", expression, run_on_startup=run_on_startup, use_monitor=False, state_dir=tmp_path, invoke=invoke, now=clock
    )


async def test_run_on_startup_invokes_once_at_start_though_nothing_is_due(tmp_path: Path) -> None:
    stop = asyncio.Event()
    payloads: list[dict[str, Any]] = []

    async def invoke(payload: dict[str, Any]) -> None:
        payloads.append(payload)
        stop.set()

    # Once a year, and the clock stands still: only RunOnStartup can invoke the function.
    runner = _runner("0 0 0 1 1 *", lambda: T0, invoke, tmp_path, run_on_startup=True)
    await asyncio.wait_for(runner.run(stop), timeout=20)
    assert runner.executions == 1 and len(payloads) == 1
    assert payloads[0]["IsPastDue"] is False  # RunOnStartup is not a past-due invocation (InvokeJobFunction)


class TickingClock:
    """Every read moves time one period on: every execution outlasts its period, and every occurrence is due the
    moment the runner looks at the clock, so the runner never waits in real time."""

    def __init__(self, start: datetime, step: timedelta) -> None:
        self.t, self.step = start, step

    def __call__(self) -> datetime:
        self.t += self.step
        return self.t


async def test_an_execution_that_outlasts_its_period_never_overlaps_the_next(tmp_path: Path) -> None:
    stop = asyncio.Event()
    active, peak, starts = 0, 0, 0

    async def invoke(payload: dict[str, Any]) -> None:
        nonlocal active, peak, starts
        active += 1
        starts += 1
        peak = max(peak, active)
        # The execution stays in flight for many turns of the loop, each of which reads the ticking clock: a runner
        # that started the next due occurrence without waiting for this one would start it within these turns.
        for _ in range(200):
            await asyncio.sleep(0)
        active -= 1
        if starts >= 5:
            stop.set()

    runner = _runner("* * * * * *", TickingClock(T0, timedelta(seconds=1)), invoke, tmp_path)
    await asyncio.wait_for(runner.run(stop), timeout=20)
    assert peak == 1  # never two executions at once
    assert starts == 5  # one after another, and none left running after the stop


async def test_missed_occurrences_during_a_long_execution_collapse_into_one_immediate_invocation(
    tmp_path: Path,
) -> None:
    # Real time plus an offset that an execution moves forward to say how long it "took".
    base, started = datetime(2026, 1, 1, 0, 0, 9, 950000, tzinfo=UTC), time.monotonic()
    offset = timedelta()

    def clock() -> datetime:
        return base + offset + timedelta(seconds=time.monotonic() - started)

    def at(second: float) -> datetime:
        return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=second)

    stop = asyncio.Event()
    starts: list[datetime] = []
    past_due: list[bool] = []

    async def invoke(payload: dict[str, Any]) -> None:
        nonlocal offset
        now = clock()
        starts.append(now)
        past_due.append(payload["IsPastDue"])
        if len(starts) == 1:  # the :10 occurrence runs until :32, so :20 and :30 pass meanwhile
            offset += at(32) - now
        elif len(starts) == 2:  # a short one that ends just before :42
            offset += at(41.9) - now
        else:
            stop.set()

    runner = _runner("10,20,30,42 * * * * *", clock, invoke, tmp_path)
    await asyncio.wait_for(runner.run(stop), timeout=20)
    assert len(starts) == 3
    assert at(10) <= starts[0] < at(20)
    # Right after the long execution one invocation runs (its Next, :20, was already past); :20 and :30 do not run
    # one each, and the runner does not wait for the next occurrence (:42) either.
    assert starts[1] < at(41)
    assert starts[2] >= at(42)
    # The catch-up run starts 12 s after its due time, yet it is a scheduled invocation: IsPastDue is false
    # (TimerListener.HandleTimerEvent → InvokeJobFunction(now, isPastDue: false)); only the start-up invocation of a
    # missed occurrence is past due.
    assert past_due == [False, False, False]
