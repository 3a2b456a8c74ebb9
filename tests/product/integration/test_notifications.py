"""A terminal state is always announced: a send that fails after the state write (a Service Bus outage, a crash
between the lines) is repaired by the Supervisor's sweep of records whose notification is still owed.

Seed 000/001, "Status reporting" and "Issues and considerations" (every order reaches its app and its operator).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support.integration_support import Pipeline, claim_orders, open_pipeline, state_of

from orderflow import runtime
from orderflow.messages import STEPS, AlertKind, OrderStatus
from orderflow.records import ProcessState, StepStatus
from orderflow.state_machine import record_step, set_step_deadline
from orderflow.supervisor import run_supervisor


class FlakyBus:
    """The bus, except that the first `fail` sender opens raise, like a Service Bus outage."""

    def __init__(self, inner: Any, fail: int) -> None:
        self.inner, self.fail = inner, fail

    def get_queue_sender(self, queue: str, **kw: Any) -> Any:
        if self.fail > 0:
            self.fail -= 1
            raise ConnectionError("Service Bus unavailable")
        return self.inner.get_queue_sender(queue, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
async def p(tmp_path: Path) -> AsyncIterator[Pipeline]:
    deployment = await open_pipeline(tmp_path)
    yield deployment
    await deployment.aclose()


async def test_escalation_notice_lost_to_a_failed_send_is_sent_by_a_later_sweep(p: Pipeline) -> None:
    p.services.tunables = replace(p.services.tunables, failure_threshold=1)
    await claim_orders(p, "o-1")
    p.clock.advance(p.services.tunables.claim_lease * 2)
    good_bus = p.services.bus
    p.services.bus = FlakyBus(good_bus, fail=1)
    run = await run_supervisor(p.services)  # one failing send does not abort the scan
    p.services.bus = good_bus
    record = await state_of(p, "o-1")
    assert run.escalated == ["o-1"] and record.process_state is ProcessState.ERROR and record.notified_at is None
    p.clock.advance(p.services.tunables.claim_lease * 2)
    later = await run_supervisor(p.services)
    assert later.notified == 1
    assert OrderStatus.FAILED in [s.state for s in await p.statuses("o-1")]
    assert [a.kind for a in await p.alerts() if a.order_id == "o-1"] == [AlertKind.FAILURE_THRESHOLD]
    assert (await state_of(p, "o-1")).notified_at is not None
    again = await run_supervisor(p.services)
    assert again.notified == 0  # sent once: nothing is owed any more


async def test_completed_status_lost_by_finish_order_is_sent_by_the_sweep(p: Pipeline) -> None:
    import activities.frozen_versions as activities

    await claim_orders(p, "o-1")
    for step in STEPS:
        now = p.clock.now()
        await p.services.state.update_with_retry(
            "o-1", lambda r, step=step, now=now: set_step_deadline(r, "o-1:1", step, now, now)
        )
        await p.services.state.update_with_retry(
            "o-1", lambda r, step=step, now=now: record_step(r, "o-1:1", step, StepStatus.SUCCEEDED, now)
        )
    good_bus = p.services.bus
    p.services.bus = FlakyBus(good_bus, fail=1)
    runtime.use_services(p.services)
    finish = activities.finish_order._function.get_user_function()  # type: ignore[attr-defined]
    request = {"orderId": "o-1", "instanceId": "o-1:1", "attempt": 1, "outcome": "completed", "reason": "ok"}
    with pytest.raises(ConnectionError):
        await finish(request)
    p.services.bus = good_bus
    assert (await state_of(p, "o-1")).process_state is ProcessState.PROCESSED
    # Not yet: the sweep leaves a record alone for one claim lease (the activity's own retry may still send).
    assert (await run_supervisor(p.services)).notified == 0
    p.clock.advance(p.services.tunables.claim_lease * 2)
    assert (await run_supervisor(p.services)).notified == 1
    assert [s.state for s in await p.statuses("o-1")].count(OrderStatus.COMPLETED) == 1


async def test_a_finished_order_expires_only_once_its_status_went_out(p: Pipeline) -> None:
    # Issue 26: the TTL (FinishedOrderRetentionSeconds) comes with the notification's write, never before: a record
    # whose status is still owed must outlive its retry.
    p.services.tunables = replace(p.services.tunables, failure_threshold=1, finished_ttl=3600)
    await claim_orders(p, "o-1")
    p.clock.advance(p.services.tunables.claim_lease * 2)
    good_bus = p.services.bus
    p.services.bus = FlakyBus(good_bus, fail=1)
    await run_supervisor(p.services)  # escalated, the send failed: the notification is owed
    p.services.bus = good_bus
    owed = await state_of(p, "o-1")
    stored = await p.services.orders.get("o-1")
    assert owed.process_state is ProcessState.ERROR and owed.ttl is None
    assert stored is not None and "ttl" not in (stored.model_extra or {})
    p.clock.advance(p.services.tunables.claim_lease * 2)
    assert (await run_supervisor(p.services)).notified == 1
    finished = await state_of(p, "o-1")
    stored = await p.services.orders.get("o-1")
    assert finished.ttl == 3600 and stored is not None and (stored.model_extra or {}).get("ttl") == 3600


async def test_no_ttl_when_finished_orders_are_kept_forever(p: Pipeline) -> None:
    p.services.tunables = replace(p.services.tunables, failure_threshold=1, finished_ttl=None)
    await claim_orders(p, "o-1")
    p.clock.advance(p.services.tunables.claim_lease * 2)
    await run_supervisor(p.services)
    finished = await state_of(p, "o-1")
    stored = await p.services.orders.get("o-1")
    assert finished.notified_at is not None and finished.ttl is None
    assert stored is not None and "ttl" not in (stored.model_extra or {})
