"""Integration: the Starter (`orderflow.starter`) claiming Pending records on the shared embedded store.

Spec: seed 000/001 "Example → Scheduling": a conditional update sets ProcessState=Processing and LockedBy
to the attempt's instance id (`<OrderID>:<attempt>`) before the orchestration is scheduled, so two
starters never schedule the same attempt; "Supervision": an expired claim goes back to Pending
(FailureCount+1) for a new attempt.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace
from datetime import timedelta
from typing import Any

from integration_support import Pipeline, RecordingStartNew, state_of, submit_orders

from orderflow import function_names as fn
from orderflow.records import ProcessState
from orderflow.starter import run_starter
from orderflow.supervisor import run_supervisor


class QueryBarrier:
    """A state store whose `query_claimable` answers only once both starters have queried: both then hold the
    same stale batch and race on every record (the worst case, forced instead of hoped for)."""

    def __init__(self, inner: Any, barrier: asyncio.Barrier) -> None:
        self._inner = inner
        self._barrier = barrier

    async def query_claimable(self, now: Any, limit: int) -> Any:
        batch = await self._inner.query_claimable(now, limit)
        await asyncio.wait_for(self._barrier.wait(), timeout=10)
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_two_starters_at_once_claim_every_order_exactly_once(pipeline: Pipeline) -> None:
    order_ids = [f"o-{i:02d}" for i in range(24)]
    await submit_orders(pipeline, *order_ids)
    barrier = asyncio.Barrier(2)
    a = replace(pipeline.services, state=QueryBarrier(pipeline.services.state, barrier))
    other = await pipeline.peer()  # a second Functions instance on the same store file
    b = replace(other, state=QueryBarrier(other.state, barrier))
    start_a, start_b = RecordingStartNew(), RecordingStartNew()

    runs = await asyncio.gather(run_starter(a, start_a), run_starter(b, start_b))

    started = start_a.instances + start_b.instances
    assert Counter(started) == Counter(
        f"{o}:1" for o in order_ids
    )  # each attempt started once, by one starter
    assert sorted(runs[0].claimed + runs[1].claimed) == sorted(started)
    assert runs[0].lost_race + runs[1].lost_race == len(
        order_ids
    )  # every record was contested, one lost each
    for name, instance, inp in start_a.calls + start_b.calls:
        order_id = instance.rsplit(":", 1)[0]
        assert name == fn.ORDER_WORKFLOW and inp["orderId"] == order_id and inp["attempt"] == 1
        rec = await state_of(pipeline, order_id)
        assert (rec.process_state, rec.locked_by, rec.attempt) == (ProcessState.PROCESSING, instance, 1)
        assert rec.complete_by == pipeline.clock.now() + pipeline.services.tunables.claim_lease
    again = RecordingStartNew()
    assert (await run_starter(pipeline.services, again)).claimed == [] and again.calls == []


async def test_a_record_whose_retry_time_is_in_the_future_is_not_claimed(pipeline: Pipeline) -> None:
    await submit_orders(pipeline, "o-later")
    retry_at = pipeline.clock.now() + timedelta(seconds=10)
    await pipeline.services.state.update_with_retry(
        "o-later", lambda r: r.model_copy(update={"retry_at": retry_at})
    )
    start = RecordingStartNew()

    assert (await run_starter(pipeline.services, start)).claimed == []
    assert start.calls == [] and (await state_of(pipeline, "o-later")).process_state is ProcessState.PENDING

    pipeline.clock.set(retry_at)
    assert (await run_starter(pipeline.services, start)).claimed == ["o-later:1"]


async def test_crash_between_claim_and_start_is_recovered_by_the_supervisor_then_attempt_2(
    pipeline: Pipeline,
) -> None:
    """start_new fails after the claim: the lease expires, the Supervisor recovers it, attempt 2 starts."""
    services, clock = pipeline.services, pipeline.clock
    await submit_orders(pipeline, "o-crash")
    crashed = RecordingStartNew(fail=True)

    run = await run_starter(services, crashed)

    assert run.claimed == [] and run.start_failed == ["o-crash:1"]
    rec = await state_of(pipeline, "o-crash")
    lease_end = clock.now() + services.tunables.claim_lease
    assert (rec.process_state, rec.locked_by, rec.complete_by) == (
        ProcessState.PROCESSING,
        "o-crash:1",
        lease_end,
    )

    clock.set(lease_end - timedelta(microseconds=1))  # the lease still holds: nothing to recover
    assert (await run_supervisor(services)).recovered == []
    clock.set(lease_end + timedelta(seconds=1))
    assert (await run_supervisor(services)).recovered == ["o-crash"]

    rec = await state_of(pipeline, "o-crash")
    expected_retry = clock.now() + services.tunables.backoff(1)
    assert (rec.process_state, rec.locked_by, rec.failure_count) == (ProcessState.PENDING, None, 1)
    assert rec.retry_at == expected_retry
    start = RecordingStartNew()
    assert (await run_starter(services, start)).claimed == []  # still backing off
    clock.set(expected_retry)
    assert (await run_starter(services, start)).claimed == ["o-crash:2"]
    [(_, instance, inp)] = start.calls
    assert instance == "o-crash:2" and inp["attempt"] == 2
    rec = await state_of(pipeline, "o-crash")
    assert (rec.process_state, rec.locked_by, rec.attempt, rec.failure_count) == (
        ProcessState.PROCESSING,
        "o-crash:2",
        2,
        1,
    )
