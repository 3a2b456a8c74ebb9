"""Integration: the Supervisor (`orderflow.supervisor.run_supervisor`) on the embedded store, with a
FakeClock.

Spec: seed 000/001 "Example → Supervision": a bounded scan (CompleteBy window, maximum result count,
continuation-token paging, RU charge monitored) of Processing records with an expired CompleteBy; a
conditional update checked on the expired LockedBy: FailureCount+1, then Pending (retry after a backoff)
or, at the threshold, Error + an operator alert. "Interactions": several Supervisors must not compete to
recover the same step; "Issues and considerations → Operational visibility": alerts and metrics are
emitted signals.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from support.integration_support import (
    FakeDurable,
    MetricPoints,
    Pipeline,
    RecordingStartNew,
    claim_orders,
    counter_value,
    histogram_count,
    state_of,
    submit_orders,
)

from orderflow.errors import NotFound, PreconditionFailed, TransientStoreError
from orderflow.messages import AlertKind, OrderStatus
from orderflow.records import ProcessState, parse_utc
from orderflow.starter import run_starter, try_claim
from orderflow.state_machine import Fenced, IllegalTransition
from orderflow.supervisor import CHECKPOINT, CLOCK_SKEW, run_supervisor


async def expire(p: Pipeline, by: timedelta = timedelta(seconds=1)) -> None:
    """Move the clock past every claim lease taken so far."""
    p.clock.advance(p.services.tunables.claim_lease + by)


async def checkpoint(p: Pipeline) -> Any:
    found = await p.services.state.get_checkpoint(CHECKPOINT)
    return None if found is None else parse_utc(found[0]["position"])


async def test_expired_processing_goes_back_to_pending_with_backoff(pipeline: Pipeline) -> None:
    await claim_orders(pipeline, "o-1")
    await expire(pipeline)

    run = await run_supervisor(pipeline.services)

    assert run.recovered == ["o-1"] and run.escalated == []
    rec = await state_of(pipeline, "o-1")
    assert (rec.process_state, rec.locked_by, rec.failure_count, rec.complete_by) == (
        ProcessState.PENDING,
        None,
        1,
        None,
    )
    assert rec.retry_at == pipeline.clock.now() + pipeline.services.tunables.backoff(1)
    assert "o-1:1" in (rec.last_error or "")
    assert [s.state for s in await pipeline.statuses("o-1")] == [OrderStatus.RECEIVED]  # no failure reported


async def test_at_the_threshold_the_order_goes_to_error_with_alert_failed_status_and_metric(
    pipeline: Pipeline, metric_points: MetricPoints
) -> None:
    services, clock = pipeline.services, pipeline.clock
    alerts_before = counter_value(metric_points, "orderflow.alerts", kind=AlertKind.FAILURE_THRESHOLD.value)
    await claim_orders(pipeline, "o-th")
    for attempt in range(1, services.tunables.failure_threshold + 1):
        await expire(pipeline)
        run = await run_supervisor(services)
        rec = await state_of(pipeline, "o-th")
        assert rec.failure_count == attempt
        if attempt < services.tunables.failure_threshold:
            assert run.recovered == ["o-th"] and rec.process_state is ProcessState.PENDING
            assert rec.retry_at is not None
            clock.set(rec.retry_at)
            assert (await run_starter(services, RecordingStartNew())).claimed == [f"o-th:{attempt + 1}"]

    assert run.escalated == ["o-th"]
    assert (rec.process_state, rec.locked_by, rec.attempt) == (ProcessState.ERROR, None, 3)
    assert (rec.last_error or "").startswith("FailureThresholdReached")
    [alert] = await pipeline.alerts()
    assert (alert.kind, alert.order_id, alert.details["failureCount"]) == (
        AlertKind.FAILURE_THRESHOLD,
        "o-th",
        3,
    )
    failed = (await pipeline.statuses("o-th"))[-1]
    assert failed.state is OrderStatus.FAILED and failed.attempt == 3 and "FailureThresholdReached" in failed.reason
    assert counter_value(metric_points, "orderflow.alerts", kind=AlertKind.FAILURE_THRESHOLD.value) == alerts_before + 1
    assert (await run_supervisor(services)).scanned == 0  # Error is terminal: never scanned again


async def test_two_supervisors_at_once_recover_each_record_once(pipeline: Pipeline) -> None:
    order_ids = [f"o-{i:02d}" for i in range(12)]
    await claim_orders(pipeline, *order_ids)
    await expire(pipeline)
    other = await pipeline.peer()

    runs = await asyncio.gather(run_supervisor(pipeline.services), run_supervisor(other))

    recovered = runs[0].recovered + runs[1].recovered
    assert sorted(recovered) == order_ids  # disjoint: no record recovered twice
    for order_id in order_ids:
        rec = await state_of(pipeline, order_id)
        assert (rec.process_state, rec.failure_count) == (ProcessState.PENDING, 1)


async def test_a_record_whose_complete_by_has_not_expired_is_untouched(pipeline: Pipeline) -> None:
    await claim_orders(pipeline, "o-early")
    pipeline.clock.advance(5)
    await claim_orders(pipeline, "o-late")
    pipeline.clock.set((await state_of(pipeline, "o-early")).complete_by + timedelta(seconds=1))
    late_before = await pipeline.services.state.get("o-late")

    run = await run_supervisor(pipeline.services)

    assert run.recovered == ["o-early"]
    assert await pipeline.services.state.get("o-late") == late_before  # same record and etag


class QuerySpy:
    """Records every `query_expired` call (window, page size, continuation) made through a state store."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: list[tuple[Any, Any, int, str | None, int]] = []

    async def query_expired(self, start: Any, end: Any, page_size: int, continuation: str | None = None) -> Any:
        page = await self._inner.query_expired(start, end, page_size, continuation)
        self.calls.append((start, end, page_size, continuation, len(page.items)))
        return page

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_bounded_scan_honours_max_results_pages_with_continuations_and_advances_the_checkpoint(
    pipeline: Pipeline,
) -> None:
    order_ids = [f"o-{i:02d}" for i in range(7)]
    for order_id in order_ids:  # distinct CompleteBy values, one second apart
        await claim_orders(pipeline, order_id)
        pipeline.clock.advance(1)
    await expire(pipeline, by=timedelta(minutes=5))
    spy = QuerySpy(pipeline.services.state)
    services = replace(
        pipeline.services, state=spy, tunables=replace(pipeline.services.tunables, max_results=3, page_size=2)
    )

    runs = [await run_supervisor(services) for _ in range(4)]

    assert [len(r.recovered) for r in runs] == [3, 3, 1, 0]
    assert sorted(o for r in runs for o in r.recovered) == order_ids
    assert all(size <= 2 for _, _, size, _, _ in spy.calls)
    assert any(cont is not None for _, _, _, cont, _ in spy.calls)  # followed a continuation token
    positions = [r.position for r in runs if r.position is not None]
    assert len(positions) == len(runs) and positions == sorted(positions)  # the checkpoint never moves back
    assert await checkpoint(pipeline) == positions[-1] <= pipeline.clock.now() - CLOCK_SKEW


async def test_after_a_downtime_longer_than_the_window_no_expired_record_is_skipped(
    pipeline: Pipeline,
) -> None:
    """Records expired long ago across many windows, checkpoint old: successive runs recover every one."""
    services = replace(
        pipeline.services,
        tunables=replace(pipeline.services.tunables, scan_window=timedelta(minutes=1), max_results=2, page_size=1),
    )
    await run_supervisor(services)  # sets the checkpoint before the downtime
    old_position = await checkpoint(pipeline)
    order_ids = [f"o-{i:02d}" for i in range(6)]
    for order_id in order_ids:  # CompleteBy spread over ~10 hours: many empty windows between them
        await claim_orders(pipeline, order_id)
        pipeline.clock.advance(timedelta(hours=2))
    pipeline.clock.advance(timedelta(days=3))  # the Supervisor was down

    recovered: list[str] = []
    for _ in range(len(order_ids)):  # bounded: at most one run per record
        run = await run_supervisor(services)
        assert len(run.recovered) <= 2
        recovered += run.recovered
        if not run.recovered:
            break
    assert sorted(recovered) == order_ids
    assert old_position is not None and await checkpoint(pipeline) > old_position
    for order_id in order_ids:
        assert (await state_of(pipeline, order_id)).failure_count == 1


async def test_request_charge_is_accumulated_logged_and_emitted(
    pipeline: Pipeline, metric_points: MetricPoints, caplog: pytest.LogCaptureFixture
) -> None:
    await claim_orders(pipeline, "o-ru")
    await expire(pipeline)
    scans_before = histogram_count(metric_points, "orderflow.supervisor.request_charge")

    with caplog.at_level(logging.INFO, logger="orderflow.supervisor"):
        run = await run_supervisor(pipeline.services)

    assert isinstance(run.request_charge, float) and run.request_charge >= 0.0  # 0 RU on the embedded store
    assert histogram_count(metric_points, "orderflow.supervisor.request_charge") == scans_before + 1
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("supervisor scan (query):")]
    assert "1 recovered" in line and "RU" in line


# --- a record skipped for a reason that may pass holds the checkpoint ----------------------------------------------


class FlakyDurable(FakeDurable):
    """A FakeDurable whose status route fails for the instances in `down` (the Durable HTTP API answering 503 as
    azure-functions-durable 1.x's DurableOrchestrationClient.get_status raises it: a plain Exception)."""

    down: set[str]

    def __init__(self, down: set[str]) -> None:
        super().__init__()
        self.down = down

    async def get_status(self, instance_id: str) -> Any:
        if instance_id in self.down:
            raise Exception("The operation failed with an unexpected status code 503")
        return await super().get_status(instance_id)


class FailingUpdates:
    """The state store, whose update_with_retry raises `error` for the order ids in `failing` (once each, unless
    `always`); every other call goes to the store."""

    def __init__(self, inner: Any, failing: set[str], error: Callable[[], Exception], always: bool = False) -> None:
        self._inner = inner
        self.failing = failing
        self._error = error
        self._always = always

    async def update_with_retry(self, order_id: str, mutate: Any, attempts: int = 5) -> Any:
        if order_id in self.failing:
            if not self._always:
                self.failing.discard(order_id)
            raise self._error()
        return await self._inner.update_with_retry(order_id, mutate, attempts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def narrow(p: Pipeline, **overrides: Any) -> Any:
    """The pipeline's services with a one-minute scan window (so a pass walks several windows), and `overrides`."""
    return replace(p.services, tunables=replace(p.services.tunables, scan_window=timedelta(minutes=1), **overrides))


async def test_a_record_skipped_while_the_durable_api_is_down_is_restarted_after_the_window_moved_on(
    pipeline: Pipeline,
) -> None:
    """get_status fails once, in a pass long after the lease expired (several windows and CLOCK_SKEW); the next pass,
    later still, must see the record again and start its attempt."""
    services = narrow(pipeline)
    await claim_orders(pipeline, "o-a")  # a claim whose orchestration never started (no FakeDurable knows it)
    complete_by = (await state_of(pipeline, "o-a")).complete_by
    await expire(pipeline, by=5 * services.tunables.scan_window + CLOCK_SKEW)
    durable = FlakyDurable(down={"o-a:1"})

    held = await run_supervisor(services, durable.client())

    assert (held.restarted, held.recovered, held.skipped, held.held) == ([], [], 1, ["o-a"])
    assert await checkpoint(pipeline) <= complete_by  # not past the skipped record
    durable.down.clear()
    pipeline.clock.advance(5 * services.tunables.scan_window + CLOCK_SKEW)
    assert (await run_supervisor(services, durable.client())).restarted == ["o-a"]
    assert (await state_of(pipeline, "o-a")).process_state is ProcessState.PROCESSING
    assert durable.starts.instances == ["o-a:1"]


async def test_a_skipped_record_behind_a_later_one_is_not_passed_when_the_probe_jumps(pipeline: Pipeline) -> None:
    """Two expired claims an hour apart (far more than the window): the first one's status fails, the second one's
    is answered. The pass handles the second and jumps to it; the checkpoint must stay at the first."""
    services = narrow(pipeline)
    await claim_orders(pipeline, "o-first")
    pipeline.clock.advance(timedelta(hours=1))
    await claim_orders(pipeline, "o-second")
    first_by = (await state_of(pipeline, "o-first")).complete_by
    await expire(pipeline)
    durable = FlakyDurable(down={"o-first:1"})

    run = await run_supervisor(services, durable.client())

    assert (run.restarted, run.held) == (["o-second"], ["o-first"])
    assert run.position == await checkpoint(pipeline) == first_by
    durable.down.clear()
    pipeline.clock.advance(timedelta(hours=2))
    assert (await run_supervisor(services, durable.client())).restarted == ["o-first"]


async def test_a_transient_store_error_during_recovery_holds_the_checkpoint(pipeline: Pipeline) -> None:
    """A 503 from the state store (TransientStoreError, orderflow/errors.py) on one record's recovery: the
    other records are recovered in the same pass; the failed one is recovered by the next, after the clock moved
    on by far more than the window and CLOCK_SKEW."""
    await claim_orders(pipeline, "o-x")
    pipeline.clock.advance(timedelta(minutes=10))
    await claim_orders(pipeline, "o-y")
    x_by = (await state_of(pipeline, "o-x")).complete_by
    await expire(pipeline, by=timedelta(minutes=10))
    store = FailingUpdates(pipeline.services.state, {"o-x"}, lambda: TransientStoreError("unavailable", 503))
    services = replace(narrow(pipeline), state=store)

    run = await run_supervisor(services)

    assert (run.recovered, run.held) == (["o-y"], ["o-x"])
    assert await checkpoint(pipeline) == x_by
    pipeline.clock.advance(timedelta(hours=1))
    again = await run_supervisor(services)
    assert again.recovered == ["o-x"] and again.held == []
    assert (await state_of(pipeline, "o-x")).failure_count == 1
    assert await checkpoint(pipeline) == pipeline.clock.now() - CLOCK_SKEW


@pytest.mark.parametrize("lost_to", ["fenced", "illegal", "not-found", "precondition"])
async def test_a_record_another_writer_won_does_move_the_checkpoint(pipeline: Pipeline, lost_to: str) -> None:
    """Skipped because another Supervisor or the Scheduler got there first: nothing left to do for it, so the
    checkpoint moves on past it (to now - CLOCK_SKEW)."""
    errors: dict[str, Callable[[], Exception]] = {
        "fenced": lambda: Fenced("o-won", "o-won:1", "o-won:2"),
        "illegal": lambda: IllegalTransition("Processed"),
        "not-found": lambda: NotFound("o-won"),
        "precondition": lambda: PreconditionFailed("etag"),
    }
    await claim_orders(pipeline, "o-won")
    won_by = (await state_of(pipeline, "o-won")).complete_by
    await expire(pipeline, by=5 * timedelta(minutes=1) + CLOCK_SKEW)
    services = replace(narrow(pipeline), state=FailingUpdates(pipeline.services.state, {"o-won"}, errors[lost_to]))

    run = await run_supervisor(services)

    assert (run.skipped, run.held, run.recovered) == (1, [], [])
    assert await checkpoint(pipeline) == pipeline.clock.now() - CLOCK_SKEW > won_by


async def test_a_restart_lost_to_another_writer_does_move_the_checkpoint(pipeline: Pipeline) -> None:
    """The restart path: its status is answered (never started), then the restart's write is fenced."""
    await claim_orders(pipeline, "o-won")
    await expire(pipeline, by=5 * timedelta(minutes=1) + CLOCK_SKEW)
    store = FailingUpdates(pipeline.services.state, {"o-won"}, lambda: Fenced("o-won", "o-won:1", "o-won:2"))

    run = await run_supervisor(replace(narrow(pipeline), state=store), FakeDurable().client())

    assert (run.skipped, run.held, run.restarted) == (1, [], [])
    assert await checkpoint(pipeline) == pipeline.clock.now() - CLOCK_SKEW


async def test_a_record_that_always_fails_holds_the_checkpoint_at_a_bounded_cost_per_pass(pipeline: Pipeline) -> None:
    """One record whose recovery always fails transiently, 30 passes a window apart, each with a new expired order:
    each pass reads that record's window, the new order's and the probes between, so its queries stay bounded (they
    do not grow with the backlog behind the held record) and every other order is recovered by its pass."""
    services = narrow(pipeline)
    await claim_orders(pipeline, "o-stuck")
    stuck_by = (await state_of(pipeline, "o-stuck")).complete_by
    store = FailingUpdates(pipeline.services.state, {"o-stuck"}, lambda: TransientStoreError("busy", 503), always=True)
    services = replace(services, state=store)
    queries: list[int] = []
    for i in range(30):
        await submit_orders(pipeline, f"o-{i:02d}")
        found = await pipeline.services.state.get(f"o-{i:02d}")
        assert found is not None and await try_claim(pipeline.services, *found) is not None  # this order only
        await expire(pipeline, by=services.tunables.scan_window)
        run = await run_supervisor(services)
        assert (run.recovered, run.held) == ([f"o-{i:02d}"], ["o-stuck"])
        assert await checkpoint(pipeline) == stuck_by
        queries.append(run.cost.queries)
    assert queries == [3] * 30  # measured: the held record's window, one probe, the new order's window
