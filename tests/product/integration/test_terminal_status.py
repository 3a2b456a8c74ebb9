"""Terminal statuses carry the truth, and a resubmitted terminal order is answered with its terminal status again.

Issue 10, item 3: a `completed` status carries the success, never an error of an earlier attempt; a Processed record
keeps that error in `previousErrors`, not in `lastError`; a resubmission of an order that is already Processed or
Error gets `received` and then the same terminal status (same state, reason, attempt, MessageId) again, so a client
that retries after a timeout learns the outcome, and a repeat inside the duplicate window is absorbed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from support.integration_support import (
    REPLY_QUEUE,
    Pipeline,
    RecordingStartNew,
    claim_orders,
    encode,
    open_pipeline,
    order_body,
    state_of,
)

from orderflow import runtime
from orderflow.messages import STEPS, OrderStatus, StatusMessage
from orderflow.records import ProcessState, StepStatus
from orderflow.starter import run_starter
from orderflow.state_machine import record_step, set_step_deadline
from orderflow.submission import Accepted, submit
from orderflow.supervisor import run_supervisor

PAST_THE_WINDOW = timedelta(minutes=11)  # orders-inbound and the reply queue detect duplicates for 10 minutes


@pytest.fixture
async def p(tmp_path: Path) -> AsyncIterator[Pipeline]:
    deployment = await open_pipeline(tmp_path)
    deployment.services.bus.broker.clock = deployment.clock.now  # the duplicate window follows the test's clock
    yield deployment
    await deployment.aclose()


async def replies(p: Pipeline, order_id: str) -> list[tuple[str, StatusMessage]]:
    """(MessageId, status) of every status on the order's reply session, in order (peeked, left in place)."""
    async with p.services.bus.get_queue_receiver(REPLY_QUEUE, session_id=order_id) as receiver:
        msgs = await receiver.peek_messages(max_message_count=100)
    return [(str(m.message_id), StatusMessage.model_validate_json(b"".join(m.body))) for m in msgs]


async def finish_all_steps(p: Pipeline, order_id: str, instance: str) -> None:
    """The Scheduler's attempt `instance` runs every step to success, then finish_order (the real activity)."""
    import activities.frozen_versions as activities

    for step in STEPS:
        now = p.clock.now()
        await p.services.state.update_with_retry(
            order_id, lambda r, step=step, now=now: set_step_deadline(r, instance, step, now, now)
        )
        await p.services.state.update_with_retry(
            order_id, lambda r, step=step, now=now: record_step(r, instance, step, StepStatus.SUCCEEDED, now)
        )
    runtime.use_services(p.services)
    finish = activities.finish_order._function.get_user_function()  # type: ignore[attr-defined]
    attempt = int(instance.rsplit(":", 1)[1])
    assert await finish(
        {"orderId": order_id, "instanceId": instance, "attempt": attempt, "outcome": "completed", "reason": "ok"}
    )


async def processed_on_the_second_attempt(p: Pipeline, order_id: str) -> str:
    """Attempt 1 expires (the Supervisor sends it back to Pending), attempt 2 succeeds. Returns attempt 1's error."""
    await claim_orders(p, order_id)
    p.clock.advance(p.services.tunables.claim_lease * 2)
    assert (await run_supervisor(p.services)).recovered == [order_id]
    expired = (await state_of(p, order_id)).last_error
    assert expired and "expired" in expired
    p.clock.advance(p.services.tunables.backoff(1) * 2)
    assert (await run_starter(p.services, RecordingStartNew())).claimed == [f"{order_id}:2"]
    await finish_all_steps(p, order_id, f"{order_id}:2")
    return str(expired)


async def test_completed_after_a_failed_attempt_carries_the_success_not_the_old_error(p: Pipeline) -> None:
    expired = await processed_on_the_second_attempt(p, "o-1")
    [(_, completed)] = [(i, s) for i, s in await replies(p, "o-1") if s.state is OrderStatus.COMPLETED]
    assert (completed.attempt, completed.reason) == (2, "all steps succeeded")
    record = await state_of(p, "o-1")
    assert record.process_state is ProcessState.PROCESSED
    assert record.last_error is None and record.previous_errors == (expired,)
    assert record.to_doc()["previousErrors"] == [expired]


async def test_resubmitted_processed_order_is_answered_with_its_terminal_status_again(p: Pipeline) -> None:
    await processed_on_the_second_attempt(p, "o-1")
    before = await replies(p, "o-1")
    assert [s.state for _, s in before] == [OrderStatus.RECEIVED, OrderStatus.COMPLETED]
    original_id, original = before[1]

    # Inside the duplicate window: the repeat has the same MessageIds, so the reply queue absorbs it.
    assert isinstance(await submit(p.services, encode(order_body("o-1")), "o-1"), Accepted)
    assert await replies(p, "o-1") == before

    # Past the window (a client retrying much later): received, then the same terminal status again.
    p.clock.advance(PAST_THE_WINDOW)
    outcome = await submit(p.services, encode(order_body("o-1")), "o-1")
    assert isinstance(outcome, Accepted) and not outcome.created
    after = await replies(p, "o-1")
    assert [s.state for _, s in after[2:]] == [OrderStatus.RECEIVED, OrderStatus.COMPLETED]
    again_id, again = after[3]
    assert again_id == original_id == "o-1:completed:2"
    assert (again.attempt, again.reason) == (original.attempt, original.reason) == (2, "all steps succeeded")


async def test_resubmitted_error_order_gets_failed_again_without_a_new_alert(p: Pipeline) -> None:
    p.services.tunables = replace(p.services.tunables, failure_threshold=1)
    await claim_orders(p, "o-2")
    p.clock.advance(p.services.tunables.claim_lease * 2)
    assert (await run_supervisor(p.services)).escalated == ["o-2"]
    [(original_id, original)] = [(i, s) for i, s in await replies(p, "o-2") if s.state is OrderStatus.FAILED]
    alerts = await p.alerts()

    p.clock.advance(PAST_THE_WINDOW)
    assert isinstance(await submit(p.services, encode(order_body("o-2")), "o-2"), Accepted)
    failed = [(i, s) for i, s in await replies(p, "o-2") if s.state is OrderStatus.FAILED]
    assert len(failed) == 2
    again_id, again = failed[1]
    assert again_id == original_id == "o-2:failed:1"
    assert again.reason == original.reason and again.reason.startswith("FailureThresholdReached")
    assert await p.alerts() == alerts  # the alert was raised when the order ended, not on a resubmission


async def test_resubmitted_order_still_in_progress_gets_only_received(p: Pipeline) -> None:
    await claim_orders(p, "o-3")
    p.clock.advance(PAST_THE_WINDOW)
    assert isinstance(await submit(p.services, encode(order_body("o-3")), "o-3"), Accepted)
    assert [s.state for _, s in await replies(p, "o-3")] == [OrderStatus.RECEIVED, OrderStatus.RECEIVED]


async def test_a_processed_record_written_with_a_stale_last_error_still_announces_success(p: Pipeline) -> None:
    """A record completed by an older app version keeps lastError on Processed: `completed` still says success."""
    from orderflow.notifications import notify_terminal

    await processed_on_the_second_attempt(p, "o-5")
    rec, _ = await p.services.state.update_with_retry(
        "o-5", lambda r: r.model_copy(update={"last_error": "attempt 1 expired", "notified_at": None})
    )
    p.clock.advance(PAST_THE_WINDOW)
    await notify_terminal(p.services, rec)
    completed = [s for _, s in await replies(p, "o-5") if s.state is OrderStatus.COMPLETED]
    assert [s.reason for s in completed] == ["all steps succeeded", "all steps succeeded"]
