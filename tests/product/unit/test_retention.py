"""Retention (issue 26): bounded records, the finished order's TTL, the operator's keep, and the purge timer's
windows over finished Durable instances (orderflow/retention.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support.state_records import FIRST, NOW, in_state

from orderflow.clock import FakeClock
from orderflow.embedded.store import open_sqlite_stores
from orderflow.records import (
    ERROR_TEXT_MAX,
    MAX_PREVIOUS_ERRORS,
    MAX_RESUBMISSIONS,
    TTL_NEVER,
    ProcessState,
)
from orderflow.retention import CHECKPOINT, FINISHED_STATUSES, START, Retention, keep, run_purge
from orderflow.runtime import Tunables
from orderflow.state_machine import IllegalTransition, fail, mark_notified, resubmit

DAY = timedelta(days=1)


def test_previous_errors_keep_the_newest_and_count_what_they_drop() -> None:
    rec = in_state(ProcessState.ERROR)
    for n in range(MAX_PREVIOUS_ERRORS + 5):
        rec = resubmit(rec.model_copy(update={"last_error": f"e{n}"}), NOW, "ops", "again")
        rec = rec.model_copy(update={"process_state": ProcessState.ERROR})
    assert len(rec.previous_errors) == MAX_PREVIOUS_ERRORS
    assert rec.previous_errors[-1] == f"e{MAX_PREVIOUS_ERRORS + 4}"  # the newest kept, oldest first
    assert rec.previous_errors_dropped == 5
    assert len(rec.resubmissions) + rec.resubmissions_dropped == MAX_PREVIOUS_ERRORS + 5


def test_resubmission_audit_is_bounded_and_counts_the_cut() -> None:
    rec = in_state(ProcessState.ERROR)
    for n in range(MAX_RESUBMISSIONS + 3):
        rec = resubmit(rec, NOW + timedelta(seconds=n), "ops", f"try {n}")
        rec = rec.model_copy(update={"process_state": ProcessState.ERROR})
    assert len(rec.resubmissions) == MAX_RESUBMISSIONS and rec.resubmissions_dropped == 3
    assert rec.resubmissions[-1].reason == f"try {MAX_RESUBMISSIONS + 2}"


def test_a_long_remote_text_is_cut_with_its_length_and_a_repeat_is_still_a_no_op() -> None:
    text = "503 from fulfilment: " + "<html>" * 5000
    failed = fail(in_state(ProcessState.PROCESSING), FIRST, text, NOW)
    assert failed.last_error is not None and len(failed.last_error) == ERROR_TEXT_MAX
    assert failed.last_error.startswith("503 from fulfilment") and f"({len(text)} characters)" in failed.last_error
    assert fail(failed, FIRST, text, NOW) is failed  # the same failure again writes nothing


@pytest.mark.parametrize("state", [ProcessState.PENDING, ProcessState.PROCESSING, ProcessState.COMPENSATING])
def test_no_ttl_on_an_unfinished_record(state: ProcessState) -> None:
    rec = in_state(ProcessState.PROCESSING).model_copy(update={"process_state": state})
    with pytest.raises(IllegalTransition):
        mark_notified(rec, NOW, 3600)


def test_a_finished_order_gets_its_ttl_when_notified_and_loses_it_when_resubmitted() -> None:
    notified = mark_notified(in_state(ProcessState.ERROR), NOW, 3600)
    assert notified.ttl == 3600 and notified.to_doc()["ttl"] == 3600
    again = resubmit(notified, NOW, "ops", "stock arrived")
    assert again.ttl is None and "ttl" not in again.to_doc()
    assert mark_notified(in_state(ProcessState.PROCESSED), NOW, None).ttl is None  # retention 0: forever


def test_a_kept_order_never_expires_through_notification_or_resubmission() -> None:
    kept = keep(in_state(ProcessState.PROCESSING), NOW, "ana", "audit 42")
    assert kept.ttl == TTL_NEVER and kept.kept is not None and kept.kept.by == "ana"
    assert keep(kept, NOW + DAY, "bo", "again") is kept  # repeatable
    ended = mark_notified(kept.model_copy(update={"process_state": ProcessState.ERROR}), NOW, 3600)
    assert ended.ttl == TTL_NEVER
    assert resubmit(ended, NOW, "ops", "fixed").ttl == TTL_NEVER


@dataclass
class RecordingPurge:
    """`purge_instance_history_by` over a list of (created, status) instances: deletes the finished ones matched."""

    instances: list[tuple[datetime, str]]
    calls: list[tuple[datetime, datetime, list[str]]] = field(default_factory=list)
    deleted: list[int] = field(default_factory=list)

    async def __call__(self, start: datetime, end: datetime, statuses: list[Any]) -> int:
        self.calls.append((start, end, list(statuses)))
        hit = [i for i in self.instances if start <= i[0] < end and i[1] in statuses]
        self.instances = [i for i in self.instances if i not in hit]
        self.deleted.append(len(hit))
        return len(hit)


def retention(**overrides: Any) -> Retention:
    base: dict[str, Any] = {
        "instances": 30 * DAY,
        "window": timedelta(hours=1),
        "max_per_call": 10,
        "max_calls": 8,
    }
    return Retention(**{**base, **overrides})


@dataclass
class Services:
    state: Any
    clock: FakeClock


async def test_purge_deletes_only_finished_instances_past_the_retention_bounded_per_run(tmp_path: Path) -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    old, recent = now - 40 * DAY, now - 5 * DAY
    instances = [(old + timedelta(minutes=i), "Completed") for i in range(30)]
    instances += [(old, "Running"), (old, "Pending"), (old, "Suspended"), (recent, "Completed"), (old, "Failed")]
    purge = RecordingPurge(instances)
    _, state = open_sqlite_stores(tmp_path / "s.db")
    services: Any = Services(state, FakeClock(now))
    runs = [await run_purge(services, purge, retention()) for _ in range(12)]
    assert all(r.calls <= 8 for r in runs)  # bounded per run
    assert sorted(s for _, s in purge.instances) == ["Completed", "Pending", "Running", "Suspended"]
    assert (recent, "Completed") in purge.instances  # younger than the retention
    assert all(set(statuses) == set(FINISHED_STATUSES) for *_, statuses in purge.calls)
    assert all(end <= now - 30 * DAY for _, end, _ in purge.calls)  # never past the cutoff
    assert purge.calls[0][0] == START
    starts = [start for start, _, _ in purge.calls]
    assert starts == sorted(starts) and all(a[1] == b[0] for a, b in zip(purge.calls, purge.calls[1:], strict=False))
    saved = await state.get_checkpoint(CHECKPOINT)
    assert saved is not None and saved[0]["position"].startswith("2026-11-01")
    await state.aclose()


async def test_purge_window_doubles_over_empty_stretches_and_halves_after_a_big_call(tmp_path: Path) -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    cutoff = now - 30 * DAY
    burst = [(datetime(2010, 1, 1, tzinfo=UTC) + timedelta(seconds=i), "Completed") for i in range(50)]
    purge = RecordingPurge(burst)
    _, state = open_sqlite_stores(tmp_path / "s.db")
    services: Any = Services(state, FakeClock(now))
    await run_purge(services, purge, retention(max_calls=3))
    widths = [end - start for start, end, _ in purge.calls]
    assert widths == [timedelta(hours=1), timedelta(hours=2), timedelta(hours=4)]  # empty: doubled
    while purge.instances:
        await run_purge(services, purge, retention(max_calls=3))
    big = next(n for n, deleted in enumerate(purge.deleted) if deleted > 10)  # the burst: 50 in one call
    await run_purge(services, purge, retention(max_calls=1))  # the next call after it
    width = [end - start for start, end, _ in purge.calls]
    assert width[big + 1] == width[big] / 2  # halved after a call that deleted more than max_per_call
    assert all(end <= cutoff for _, end, _ in purge.calls)
    await state.aclose()


async def test_no_purge_when_instances_are_kept_forever(tmp_path: Path) -> None:
    purge = RecordingPurge([(datetime(2001, 1, 1, tzinfo=UTC), "Completed")])
    services: Any = Services(None, FakeClock(NOW))
    assert (await run_purge(services, purge, retention(instances=None))).calls == 0 and purge.calls == []


def test_retention_settings_read_zero_as_forever_and_refuse_negatives() -> None:
    assert Retention.from_env({"InstanceRetentionSeconds": "0"}).instances is None
    assert Tunables.from_env({"FinishedOrderRetentionSeconds": "0"}).finished_ttl is None
    assert Tunables.from_env({}).finished_ttl == 90 * 86400 and Retention.from_env({}).instances == 30 * DAY
    with pytest.raises(ValueError, match="FinishedOrderRetentionSeconds"):
        Tunables.from_env({"FinishedOrderRetentionSeconds": "-1"})
    with pytest.raises(ValueError, match="InstanceRetentionSeconds"):
        Retention.from_env({"InstanceRetentionSeconds": "-1"})
