"""Integration: the Starter (`orderflow.starter`) claiming Pending records on the shared embedded store.

Spec: seed 000/001 "Example → Scheduling": a conditional update sets ProcessState=Processing and LockedBy
to the attempt's instance id (`<OrderID>:<attempt>`) before the orchestration is scheduled, so two
starters never schedule the same attempt; "Supervision": an expired claim goes back to Pending
(FailureCount+1) for a new attempt — unless its orchestration was never started (a crash between the claim and
start_new), which the Supervisor starts again in the same attempt at no cost to the order.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace
from datetime import timedelta
from typing import Any

from support.integration_support import FakeDurable, Pipeline, RecordingStartNew, state_of, submit_orders

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

    async def query_claimable(self, now: Any, limit: int, *states: Any, **keys: Any) -> Any:
        batch = await self._inner.query_claimable(now, limit, *states, **keys)
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
    assert Counter(started) == Counter(f"{o}:1" for o in order_ids)  # each attempt started once, by one starter
    assert sorted(runs[0].claimed + runs[1].claimed) == sorted(started)
    assert runs[0].lost_race + runs[1].lost_race == len(order_ids)  # every record was contested, one lost each
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
    await pipeline.services.state.update_with_retry("o-later", lambda r: r.model_copy(update={"retry_at": retry_at}))
    start = RecordingStartNew()

    assert (await run_starter(pipeline.services, start)).claimed == []
    assert start.calls == [] and (await state_of(pipeline, "o-later")).process_state is ProcessState.PENDING

    pipeline.clock.set(retry_at)
    assert (await run_starter(pipeline.services, start)).claimed == ["o-later:1"]


async def test_without_a_durable_client_an_unstarted_claim_is_recovered_as_attempt_2(
    pipeline: Pipeline,
) -> None:
    """start_new fails after the claim; a Supervisor that cannot ask Durable recovers it, attempt 2 starts."""
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


async def _crashed_claim(pipeline: Pipeline, order_id: str = "o-crash") -> Any:
    """Claim `order_id` with a start_new that fails (the crash), then let its claim lease expire."""
    await submit_orders(pipeline, order_id)
    assert (await run_starter(pipeline.services, RecordingStartNew(fail=True))).start_failed == [f"{order_id}:1"]
    pipeline.clock.advance(pipeline.services.tunables.claim_lease + timedelta(seconds=1))
    return await state_of(pipeline, order_id)


async def test_a_claim_whose_orchestration_never_started_is_started_again_in_the_same_attempt(
    pipeline: Pipeline,
) -> None:
    """The rule "a crash may delay an order, never fail a healthy one": no FailureCount, no second attempt."""
    services, clock = pipeline.services, pipeline.clock
    await _crashed_claim(pipeline)
    durable = FakeDurable()

    run = await run_supervisor(services, durable.client())

    assert (run.restarted, run.recovered, run.escalated) == (["o-crash"], [], [])
    rec = await state_of(pipeline, "o-crash")
    assert (rec.process_state, rec.locked_by, rec.attempt, rec.failure_count, rec.restarts) == (
        ProcessState.PROCESSING,
        "o-crash:1",
        1,
        0,
        1,
    )
    assert rec.complete_by == clock.now() + services.tunables.claim_lease
    assert durable.starts.instances == ["o-crash:1"]
    name, _, inp = durable.starts.calls[0]
    assert name == fn.ORDER_WORKFLOW and (inp["orderId"], inp["attempt"]) == ("o-crash", 1)
    # the lease holds again: the next run leaves it to the orchestration it started
    assert (await run_supervisor(services, durable.client())).scanned == 0


async def test_an_expired_attempt_whose_orchestration_exists_is_recovered_as_a_failure(pipeline: Pipeline) -> None:
    await _crashed_claim(pipeline)
    durable = FakeDurable(running={"o-crash:1"})  # started after all (e.g. by a start_new that reported an error)

    run = await run_supervisor(pipeline.services, durable.client())

    assert (run.restarted, run.recovered) == ([], ["o-crash"]) and durable.starts.calls == []
    rec = await state_of(pipeline, "o-crash")
    assert (rec.process_state, rec.failure_count, rec.restarts) == (ProcessState.PENDING, 1, 0)


async def test_restarts_are_bounded_by_the_failure_threshold(pipeline: Pipeline) -> None:
    """A host that never manages to start the orchestration: FailureThreshold restarts, then a normal recovery."""
    services, clock = pipeline.services, pipeline.clock
    await _crashed_claim(pipeline)
    dead = FakeDurable(starts=RecordingStartNew(fail=True))
    for restarts in range(1, services.tunables.failure_threshold + 1):
        assert (await run_supervisor(services, dead.client())).restarted == ["o-crash"]
        assert (await state_of(pipeline, "o-crash")).restarts == restarts
        clock.advance(services.tunables.claim_lease + timedelta(seconds=1))
    assert (await run_supervisor(services, dead.client())).recovered == ["o-crash"]
    rec = await state_of(pipeline, "o-crash")
    assert (rec.process_state, rec.failure_count) == (ProcessState.PENDING, 1)


async def test_an_unreachable_durable_api_spends_nothing_and_is_asked_again(pipeline: Pipeline) -> None:
    services = pipeline.services
    before = await _crashed_claim(pipeline)
    durable = FakeDurable(unreachable=True)

    run = await run_supervisor(services, durable.client())

    assert (run.restarted, run.recovered, run.skipped) == ([], [], 1)
    assert await state_of(pipeline, "o-crash") == before
    durable.unreachable = False
    assert (await run_supervisor(services, durable.client())).restarted == ["o-crash"]
