"""NCRONTAB and the useMonitor default (timer trigger docs,
learn.microsoft.com/azure/azure-functions/functions-bindings-timer)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from devhost.timers import ScheduleError, default_use_monitor, next_occurrence, parse_schedule

T0 = datetime(2026, 1, 1, 0, 0, 3, tzinfo=UTC)


def test_six_fields_with_seconds_first() -> None:
    assert next_occurrence("*/10 * * * * *", T0) == datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)
    assert next_occurrence("0 */5 * * * *", T0) == datetime(2026, 1, 1, 0, 5, 0, tzinfo=UTC)
    assert next_occurrence("0 30 9 * * 1-5", T0) == datetime(2026, 1, 1, 9, 30, tzinfo=UTC)


@pytest.mark.parametrize("bad", ["* * * * *", "61 * * * * *", "every minute"])
def test_invalid_schedules_are_refused(bad: str) -> None:
    with pytest.raises(ScheduleError):
        parse_schedule(bad)


@pytest.mark.parametrize(("schedule", "monitor"), [("*/10 * * * * *", False), ("*/30 * * * * *", False),
                                                   ("0 * * * * *", True), ("0 0 */2 * * *", True)])
def test_use_monitor_defaults_to_true_only_for_intervals_of_a_minute_or_more(schedule: str, monitor: bool) -> None:
    assert default_use_monitor(schedule, T0) is monitor
