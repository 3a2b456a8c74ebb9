"""Integration: the recovery index stays live (issue 26, item 2). Every writer that moves a record's CompleteBy or
LockedBy, or takes it out of the supervised states, removes the entry it superseded after its state write
(orderflow/recovery_index.py `update_indexed`, `superseded`), so the index holds the live entries only.

Each test runs the real writers (the submission, the Starter, the Scheduler's activities, the Supervisor) on the
embedded store and broker with a FakeClock, the index on the same store file behind a wrapper that counts its calls
and can fail its removals (an outage between the state write and the removal, or a crash there).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from support.integration_support import (
    REPLY_QUEUE,
    FakeDurable,
    Pipeline,
    RecordingStartNew,
    claim_orders,
    encode,
    open_pipeline,
    order_body,
    run_action,
    state_activity,
    state_of,
    submit_orders,
)

from orderflow import function_names as fn
from orderflow import runtime
from orderflow.embedded.store import SqliteRecoveryIndex, open_sqlite_recovery_index
from orderflow.messages import CancelOrder
from orderflow.ports import IndexEntry
from orderflow.records import ProcessState, format_utc, parse_utc
from orderflow.starter import run_starter
from orderflow.submission import Accepted, CancelDone, receive, submit
from orderflow.supervisor import run_supervisor
from orderflow.workflow import WORKFLOW_VERSION

ORDER = "o-1"
FIRST = f"{ORDER}:1"
RESERVE, CHARGE, SHIP = "reserve-inventory", "charge-payment", "arrange-shipping"
THRESHOLD = 3


@dataclass
class Watched:
    """The recovery index with its calls counted; `failing_removals`: every remove raises (the entry stays)."""

    inner: SqliteRecoveryIndex
    adds: list[str] = field(default_factory=list)
    removes: list[str] = field(default_factory=list)
    failing_removals: bool = False

    @property
    def bucket_seconds(self) -> int:
        return self.inner.bucket_seconds

    async def add(self, entry: IndexEntry) -> None:
        self.adds.append(entry.id)
        await self.inner.add(entry)

    async def remove(self, entry: IndexEntry) -> None:
        self.removes.append(entry.id)
        if self.failing_removals:
            raise ConnectionError(f"index unreachable: {entry.id} not removed")
        await self.inner.remove(entry)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass
class Deployment:
    pipeline: Pipeline
    index: Watched

    @property
    def clock(self) -> Any:
        return self.pipeline.clock

    @property
    def services(self) -> Any:
        return self.pipeline.services

    def entries(self) -> list[IndexEntry]:
        """Every entry of the index table, read straight from the file."""
        with sqlite3.connect(self.pipeline.store_path) as conn:
            rows = conn.execute("SELECT order_id, complete_by, locked_by FROM recovery_index ORDER BY complete_by")
            return [IndexEntry(r[0], parse_utc(r[1]), r[2]) for r in rows.fetchall()]

    async def live_entries_only(self, *order_ids: str) -> list[IndexEntry]:
        """The index's entries, asserting each describes its record as it is now; returns them."""
        left = self.entries()
        for e in left:
            assert e.matches(await state_of(self.pipeline, e.order_id)), f"stale entry {e.id} left behind"
        for order_id in order_ids:
            rec = await state_of(self.pipeline, order_id)
            if rec.process_state in (ProcessState.PROCESSING, ProcessState.COMPENSATING) and rec.complete_by:
                assert [e.id for e in left if e.order_id == order_id] == [f"{order_id}|{format_utc(rec.complete_by)}"]
        return left


@pytest.fixture
async def d(tmp_path: Path) -> AsyncIterator[Deployment]:
    p = await open_pipeline(tmp_path)
    p.services.tunables = replace(p.services.tunables, failure_threshold=THRESHOLD, scan_mode="index")
    inner = open_sqlite_recovery_index(p.store_path, 300)
    watched = Watched(inner)
    p.services.index = watched
    runtime.use_services(p.services)
    yield Deployment(p, watched)
    runtime.reset_services()
    await inner.aclose()
    await p.aclose()


async def advance(d: Deployment, result: str | None = None, instance: str = FIRST, *, failed: bool = False) -> Any:
    """ADVANCE_ORDER (workflow version 3) after `result`'s step answered (succeeded unless `failed`)."""
    status, error = ("failed", "declined") if failed else ("succeeded", None)
    answer = None if result is None else {"step": result, "status": status, "error": error}
    d.clock.advance(1)
    return await state_activity(fn.ADVANCE_ORDER)(
        {
            "orderId": ORDER,
            "instanceId": instance,
            "attempt": int(instance.rsplit(":", 1)[1]),
            "workflowVersion": WORKFLOW_VERSION,
            "agentRetries": 1,
            "completeBy": format_utc(d.clock.now() + d.services.tunables.step_timeout),
            "result": answer,
        }
    )


async def expire(d: Deployment) -> None:
    d.clock.advance(d.services.tunables.step_timeout + d.services.tunables.claim_lease + timedelta(seconds=1))


# --- orders that end leave nothing behind ----------------------------------------------------------------------


async def test_a_happy_order_leaves_no_entry(d: Deployment) -> None:
    """Version 3: the claim, three step deadlines, the finish. Each decision removes the entry it moved past; the
    last one, which ends the order, also removes the entry it wrote ahead of the write it did not need."""
    await claim_orders(d.pipeline, ORDER)
    assert await advance(d) == {"send": RESERVE}
    assert len(await d.live_entries_only(ORDER)) == 1
    assert await advance(d, RESERVE) == {"send": CHARGE}
    assert await advance(d, CHARGE) == {"send": SHIP}
    assert len(await d.live_entries_only(ORDER)) == 1
    assert await advance(d, SHIP) == {"done": "Processed"}
    assert (await state_of(d.pipeline, ORDER)).process_state is ProcessState.PROCESSED
    assert d.entries() == []
    assert (len(d.index.adds), len(d.index.removes)) == (5, 5)  # the lease, four decisions; each one removed once


async def test_a_happy_order_of_the_version_2_activities_leaves_no_entry(d: Deployment) -> None:
    await claim_orders(d.pipeline, ORDER)
    for step in (RESERVE, CHARGE, SHIP):
        d.clock.advance(1)
        assert await run_action(d.pipeline, ORDER, FIRST, step) is True
        assert len(await d.live_entries_only(ORDER)) == 1
    finish = {"orderId": ORDER, "instanceId": FIRST, "attempt": 1, "outcome": "completed", "reason": "ok"}
    assert await state_activity(fn.FINISH_ORDER)(finish) is True
    assert d.entries() == []


async def test_the_fast_path_claim_of_a_happy_order_leaves_no_entry(d: Deployment) -> None:
    outcome = await submit(d.services, encode(order_body(ORDER)), ORDER, claim=True)
    assert isinstance(outcome, Accepted) and outcome.claimed is not None
    assert len(await d.live_entries_only(ORDER)) == 1
    for result in (None, RESERVE, CHARGE, SHIP):
        await advance(d, result)
    assert d.entries() == []


async def test_a_fast_path_redelivery_removes_the_entry_it_wrote_for_a_claim_not_made(d: Deployment) -> None:
    await submit(d.services, encode(order_body(ORDER)), ORDER, claim=True)
    d.clock.advance(5)  # the redelivery's claim lease would end later: another entry
    again = await submit(d.services, encode(order_body(ORDER)), ORDER, claim=True)
    assert isinstance(again, Accepted) and again.claimed is None and not again.created
    assert len(await d.live_entries_only(ORDER)) == 1  # the first claim's only


async def test_a_failed_step_compensated_leaves_no_entry(d: Deployment) -> None:
    await claim_orders(d.pipeline, ORDER)
    await advance(d)
    await advance(d, RESERVE)
    assert await advance(d, CHARGE, failed=True) == {"send": "release-inventory"}
    assert (await state_of(d.pipeline, ORDER)).process_state is ProcessState.COMPENSATING
    assert len(await d.live_entries_only(ORDER)) == 1
    assert await advance(d, "release-inventory") == {"done": "Compensated"}
    assert d.entries() == []


async def test_a_recovered_order_and_an_escalated_order_leave_no_entry(d: Deployment) -> None:
    await claim_orders(d.pipeline, ORDER, "o-2")
    await d.services.state.update_with_retry("o-2", lambda r: r.model_copy(update={"failure_count": THRESHOLD - 1}))
    await advance(d)  # o-1 sent its first step: a step deadline, not the lease
    await expire(d)
    run = await run_supervisor(d.services)
    assert (run.recovered, run.escalated) == ([ORDER], ["o-2"])
    assert (await state_of(d.pipeline, ORDER)).process_state is ProcessState.PENDING
    assert (await state_of(d.pipeline, "o-2")).process_state is ProcessState.ERROR
    assert d.entries() == []
    assert run.cost.stale == 0  # the scan met live entries only


async def test_a_restarted_claim_has_exactly_its_new_lease(d: Deployment) -> None:
    """A claim whose orchestration never started: the Supervisor starts the same attempt under a new lease; the
    expired lease's entry goes."""
    await submit_orders(d.pipeline, ORDER)
    await run_starter(d.services, RecordingStartNew(fail=True))  # the claim stands, the start failed
    await expire(d)
    run = await run_supervisor(d.services, FakeDurable().client())
    assert run.restarted == [ORDER]
    [entry] = await d.live_entries_only(ORDER)
    assert entry.complete_by == d.clock.now() + d.services.tunables.claim_lease


async def test_a_cancelled_order_leaves_no_entry(d: Deployment) -> None:
    """A cancel recorded while Processing keeps the attempt's entry (nothing moved); the attempt honours it at its
    next decision, compensates, and ends."""
    await claim_orders(d.pipeline, ORDER)
    await advance(d)
    removes = list(d.index.removes)
    body = CancelOrder.model_validate(
        {"orderId": ORDER, "replyTo": REPLY_QUEUE, "reason": "changed", "requestedAt": "2024-01-01T00:00:01+00:00"}
    ).to_dict()
    done = await receive(d.services, encode(body), ORDER, "cancel-1", 7)
    assert isinstance(done, CancelDone) and done.changed and done.tell == FIRST
    assert d.index.removes == removes  # CompleteBy and lock unchanged: no index call
    assert len(await d.live_entries_only(ORDER)) == 1
    assert await advance(d, RESERVE) == {"send": "release-inventory"}
    assert "done" in await advance(d, "release-inventory")  # the order ended (its compensation ran)
    assert d.entries() == []


async def test_a_deferred_attempt_leaves_no_entry(d: Deployment) -> None:
    await claim_orders(d.pipeline, ORDER)
    await advance(d)
    deferred = {"orderId": ORDER, "instanceId": FIRST, "step": RESERVE, "retryAfterSeconds": 30, "reason": "open"}
    assert await state_activity(fn.DEFER_ORDER)(deferred) is True
    assert (await state_of(d.pipeline, ORDER)).process_state is ProcessState.PENDING
    assert d.entries() == []


# --- a step deadline that moves keeps exactly one entry -----------------------------------------------------------


async def test_a_step_deadline_move_leaves_exactly_one_live_entry(d: Deployment) -> None:
    await claim_orders(d.pipeline, ORDER)
    lease = (await state_of(d.pipeline, ORDER)).complete_by
    d.clock.advance(1)
    assert await run_action(d.pipeline, ORDER, FIRST, RESERVE, status=None) is True
    [entry] = await d.live_entries_only(ORDER)
    assert entry.complete_by != lease
    assert d.index.removes == [f"{ORDER}|{format_utc(lease)}"]


async def test_a_repeated_write_removes_nothing(d: Deployment) -> None:
    """Durable activities are at-least-once: a repeat writes nothing, so it removes nothing (no index call)."""
    await claim_orders(d.pipeline, ORDER)
    await advance(d)
    removes = list(d.index.removes)
    request = {"orderId": ORDER, "instanceId": FIRST, "step": RESERVE, "status": "succeeded", "error": None}
    assert await state_activity(fn.RECORD_STEP_RESULT)(request) is True  # CompleteBy and lock unchanged
    assert await state_activity(fn.RECORD_STEP_RESULT)(request) is True  # a repeat
    assert d.index.removes == removes
    assert len(await d.live_entries_only(ORDER)) == 1


# --- a removal that fails never fails the writer ----------------------------------------------------------------


async def test_a_removal_that_raises_does_not_fail_the_write(d: Deployment, caplog: pytest.LogCaptureFixture) -> None:
    await claim_orders(d.pipeline, ORDER)
    lease = (await state_of(d.pipeline, ORDER)).complete_by
    d.services.tunables = replace(d.services.tunables, step_timeout=timedelta(minutes=5))  # the step outlives the lease
    d.index.failing_removals = True
    with caplog.at_level(logging.WARNING, logger="orderflow.supervisor"):
        assert await advance(d) == {"send": RESERVE}
    rec = await state_of(d.pipeline, ORDER)
    assert rec.complete_by != lease and rec.step(RESERVE).status.value == "running"
    assert d.index.removes == [f"{ORDER}|{format_utc(lease)}"]  # tried once, failed
    assert "not removed" in caplog.text
    # The lease's entry is stale and stays (what a crash there leaves); the scan verifies it, skips and deletes it.
    assert sorted(e.complete_by for e in d.entries()) == sorted([lease, rec.complete_by])
    d.index.failing_removals = False
    d.clock.set(lease + timedelta(seconds=1))  # the lease expired, the step's deadline has not
    run = await run_supervisor(d.services)
    assert (run.scanned, run.cost.stale) == (0, 1)
    assert len(await d.live_entries_only(ORDER)) == 1


async def test_a_supervisor_recovery_whose_removal_raises_still_recovers(d: Deployment) -> None:
    await claim_orders(d.pipeline, ORDER)
    await expire(d)
    d.index.failing_removals = True
    run = await run_supervisor(d.services)
    assert run.recovered == [ORDER]
    assert (await state_of(d.pipeline, ORDER)).process_state is ProcessState.PENDING
    assert len(d.entries()) == 1  # stale: the next scan or the TTL takes it
    d.index.failing_removals = False
    d.clock.advance(1)
    again = await run_supervisor(d.services)
    assert (again.scanned, again.cost.stale, d.entries()) == (0, 1, [])
