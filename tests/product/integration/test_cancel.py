"""A client's CancelOrder on the embedded store and broker: `orderflow.submission.receive` (orders-inbound, the order's
session), the submission trigger that tells the running attempt, and what the Starter, the Scheduler's activities and
the Supervisor then do with a cancelled order.

Pending → Cancelled (status `cancelled`, never started), or, when an earlier attempt sent steps, CompensationInProgress
unlocked (the Starter claims the compensation, no admission slot). Processing → cancelRequestedAt, and the running
attempt (LockedBy) is told; a repeat changes nothing and tells no one. Processed or failed → `rejected` with the reason
on the cancel's replyTo, record unchanged. Unknown order → dead-lettered `UnknownOrder` with a PoisonMessage alert; an
invalid body → dead-lettered with a reason that names the field.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import unquote

import pytest
from support.integration_support import (
    REPLY_QUEUE,
    Pipeline,
    RecordingStartNew,
    claim_orders,
    encode,
    open_pipeline,
    run_action,
    state_activity,
    state_of,
    submit_orders,
)
from support.replies_support import ScriptedDurableApi

from orderflow import admission, runtime
from orderflow import function_names as fn
from orderflow.messages import STEPS, AlertKind, CancelOrder, OrderStatus
from orderflow.records import ProcessState, StepStatus, format_utc
from orderflow.starter import run_starter
from orderflow.submission import CancelDone, CancelTooLate, Rejected, receive
from orderflow.supervisor import run_supervisor
from orderflow.workflow import CANCEL_EVENT, WORKFLOW_VERSION

ORDER = "o-1"
FIRST = f"{ORDER}:1"
RESERVE = STEPS[0].value
RELEASE = "release-inventory"
REASON = "changed my mind"


@pytest.fixture
async def p(tmp_path: Path) -> AsyncIterator[Pipeline]:
    deployment = await open_pipeline(tmp_path)
    runtime.use_services(deployment.services)  # what the activities' and the trigger's get_services() return
    yield deployment
    runtime.reset_services()
    await deployment.aclose()


def cancel_body(order_id: str = ORDER, **fields: Any) -> dict[str, Any]:
    """A CancelOrder as the client sends it, built through the model (so it states the schemaVersion it needs), with
    fields overridable afterwards."""
    body = CancelOrder.model_validate(
        {"orderId": "placeholder", "replyTo": REPLY_QUEUE, "reason": REASON, "requestedAt": "2024-01-01T00:00:01+00:00"}
    ).to_dict()
    body.update({"orderId": order_id, **fields})
    return body


async def cancel(
    p: Pipeline,
    body: dict[str, Any] | None = None,
    *,
    session: str | None = ORDER,
    message_id: str = "cancel-1",
    sequence_number: int = 7,
) -> Any:
    return await receive(
        p.services, encode(cancel_body() if body is None else body), session, message_id, sequence_number
    )


def terminal(statuses: list[Any]) -> list[Any]:
    return [s for s in statuses if s.state not in (OrderStatus.RECEIVED, OrderStatus.PROCESSING)]


async def status_ids(p: Pipeline, order_id: str) -> list[str]:
    async with p.services.bus.get_queue_receiver(REPLY_QUEUE, session_id=order_id) as receiver:
        return [str(m.message_id) for m in await receiver.peek_messages(max_message_count=100)]


async def begin(p: Pipeline, cause: str, instance: str = FIRST) -> Any:
    return await state_activity(fn.BEGIN_COMPENSATION)(
        {
            "orderId": ORDER,
            "instanceId": instance,
            "cause": cause,
            "completeBy": format_utc(p.clock.now() + p.services.tunables.step_timeout),
        }
    )


async def finish(p: Pipeline, outcome: str, reason: str, instance: str = FIRST, *, honours_cancel: bool = False) -> Any:
    return await state_activity(fn.FINISH_ORDER)(
        {
            "orderId": ORDER,
            "instanceId": instance,
            "attempt": int(instance.rsplit(":", 1)[1]),
            "outcome": outcome,
            "reason": reason,
            **({"honoursCancel": True} if honours_cancel else {}),
        }
    )


# --- (a) a Pending order ------------------------------------------------------------------------------------------


async def test_a_pending_order_is_cancelled_and_never_started(p: Pipeline) -> None:
    await submit_orders(p, ORDER)

    outcome = await cancel(p)

    assert outcome == CancelDone(order_id=ORDER, state=ProcessState.CANCELLED, changed=True, tell=None)
    rec = await state_of(p, ORDER)
    assert (rec.process_state, rec.locked_by, rec.attempt, rec.retry_at) == (ProcessState.CANCELLED, None, 0, None)
    assert rec.cancel_requested_at == p.clock.now() and rec.compensation_cause == f"cancelled: {REASON}"
    assert rec.compensations == () and rec.notified_at is not None
    [status] = terminal(await p.statuses(ORDER))
    assert (status.state, status.reason, status.attempt, status.effects) == (
        OrderStatus.CANCELLED,
        f"cancelled: {REASON}",
        0,
        None,
    )
    assert await p.alerts() == []

    start = RecordingStartNew()
    assert (await run_starter(p.services, start)).claimed == [] and start.calls == []
    assert (await state_of(p, ORDER)).process_state is ProcessState.CANCELLED


async def test_a_repeated_cancel_changes_nothing_and_sends_nothing(p: Pipeline) -> None:
    await submit_orders(p, ORDER)
    await cancel(p)
    before = await p.services.state.get(ORDER)
    p.clock.advance(1)

    outcome = await cancel(p, message_id="cancel-2", sequence_number=8)

    assert outcome == CancelDone(order_id=ORDER, state=ProcessState.CANCELLED, changed=False, tell=None)
    assert await p.services.state.get(ORDER) == before
    assert len(terminal(await p.statuses(ORDER))) == 1


# --- (b) a Processing order ---------------------------------------------------------------------------------------


async def test_a_processing_order_records_the_cancel_and_tells_the_running_attempt(p: Pipeline) -> None:
    await claim_orders(p, ORDER)
    p.clock.advance(1)

    outcome = await cancel(p)

    assert outcome == CancelDone(order_id=ORDER, state=ProcessState.PROCESSING, changed=True, tell=FIRST)
    rec = await state_of(p, ORDER)
    assert (rec.process_state, rec.locked_by, rec.cancel_requested_at) == (
        ProcessState.PROCESSING,
        FIRST,
        p.clock.now(),
    )
    assert terminal(await p.statuses(ORDER)) == [] and await p.alerts() == []

    p.clock.advance(1)
    again = await cancel(p, message_id="cancel-2", sequence_number=8)
    assert again == CancelDone(order_id=ORDER, state=ProcessState.PROCESSING, changed=False, tell=None)
    assert (await state_of(p, ORDER)).cancel_requested_at == rec.cancel_requested_at


async def test_the_running_attempt_honours_a_recorded_cancel_at_its_next_step(p: Pipeline) -> None:
    await claim_orders(p, ORDER)
    await run_action(p, ORDER, FIRST, RESERVE)
    await cancel(p)
    before = await p.services.state.get(ORDER)

    assert await run_action(p, ORDER, FIRST, STEPS[1].value) == "cancel"  # version 2: nothing set, nothing sent
    assert await p.services.state.get(ORDER) == before

    assert await begin(p, "cancelled") == [RELEASE]
    await run_action(p, ORDER, FIRST, RELEASE, undone=True, honours_cancel=False)
    assert await finish(p, "completed", "compensated") is True
    [status] = terminal(await p.statuses(ORDER))
    # the client's reason, recorded with the cancel, is the cause the status names
    assert (status.state, status.reason) == (OrderStatus.COMPENSATED, f"cancelled: {REASON}")
    assert status.effects is not None and [s.value for s in status.effects.undone] == [RESERVE]
    assert await p.alerts() == []


async def test_a_cancel_recorded_during_the_last_step_is_honoured_at_the_finish(p: Pipeline) -> None:
    """FINISH_ORDER is a decision point: a cancel accepted while the last step ran is never dropped."""
    await claim_orders(p, ORDER)
    for step in STEPS:
        await run_action(p, ORDER, FIRST, step.value)
    await cancel(p)
    before = await p.services.state.get(ORDER)

    assert await finish(p, "completed", "all steps succeeded", honours_cancel=True) == "cancel"
    assert await p.services.state.get(ORDER) == before  # nothing written: still Processing
    assert await begin(p, "cancelled") == ["cancel-shipment", "refund-payment", RELEASE]
    assert (await state_of(p, ORDER)).compensation_cause == f"cancelled: {REASON}"
    # a version-1 caller (no honoursCancel) completes as it always did
    await p.services.state.update_with_retry(ORDER, lambda r: before[0])
    assert await finish(p, "completed", "all steps succeeded") is True
    assert (await state_of(p, ORDER)).process_state is ProcessState.PROCESSED


async def test_a_version_1_attempt_is_not_stopped_by_the_record(p: Pipeline) -> None:
    await claim_orders(p, ORDER)
    await cancel(p)
    assert await run_action(p, ORDER, FIRST, RESERVE, None, honours_cancel=False) is True
    assert (await state_of(p, ORDER)).step(STEPS[0]).status is StepStatus.RUNNING


async def test_a_cancel_before_the_first_step_ends_cancelled(p: Pipeline) -> None:
    await claim_orders(p, ORDER)
    await cancel(p)
    assert await run_action(p, ORDER, FIRST, RESERVE) == "cancel"
    assert await begin(p, "cancelled") == []
    rec = await state_of(p, ORDER)
    assert rec.process_state is ProcessState.CANCELLED and rec.failure_count == 0
    [status] = terminal(await p.statuses(ORDER))
    assert (status.state, status.effects) == (OrderStatus.CANCELLED, None)


# --- (c) too late ---------------------------------------------------------------------------------------------------


async def processed(p: Pipeline) -> None:
    await claim_orders(p, ORDER)
    for step in STEPS:
        await run_action(p, ORDER, FIRST, step.value)
    assert await finish(p, "completed", "all steps succeeded") is True


async def test_a_processed_order_answers_rejected_and_keeps_its_record(p: Pipeline) -> None:
    await processed(p)
    before = await p.services.state.get(ORDER)

    outcome = await cancel(p, message_id="cancel-9")

    assert isinstance(outcome, CancelTooLate) and outcome.order_id == ORDER and "already processed" in outcome.reason
    assert await p.services.state.get(ORDER) == before
    statuses = await p.statuses(ORDER)
    assert [s.state for s in statuses] == [OrderStatus.RECEIVED, OrderStatus.COMPLETED, OrderStatus.REJECTED]
    rejected = statuses[-1]
    assert rejected.reason.startswith("cancel refused") and "already processed" in rejected.reason
    assert rejected.attempt == 1
    assert (await status_ids(p, ORDER))[-1] == f"{ORDER}:rejected:cancel:cancel-9"
    assert await p.alerts() == []  # a decision, not poison


@pytest.mark.parametrize("ending", ["error", "compensating-a-failure"])
async def test_a_failed_or_failing_order_refuses_the_cancel(p: Pipeline, ending: str) -> None:
    await claim_orders(p, ORDER)
    if ending == "error":
        await run_action(p, ORDER, FIRST, RESERVE, "failed", error="out of stock")
        assert await begin(p, f"{RESERVE}: Declined: out of stock") == []
    else:
        await run_action(p, ORDER, FIRST, RESERVE)
        assert await begin(p, f"{STEPS[1].value}: Declined: card declined") == [RELEASE]
    before = await p.services.state.get(ORDER)
    alerts = await p.alerts()

    outcome = await cancel(p)

    assert isinstance(outcome, CancelTooLate)
    assert await p.services.state.get(ORDER) == before
    assert (await p.statuses(ORDER))[-1].state is OrderStatus.REJECTED
    assert await p.alerts() == alerts


# --- (d) unknown order, (e) invalid body ----------------------------------------------------------------------------


async def test_an_unknown_order_is_dead_lettered_with_a_poison_alert(p: Pipeline) -> None:
    outcome = await cancel(p, cancel_body("o-x"), session="o-x", message_id="cancel-x", sequence_number=11)

    assert isinstance(outcome, Rejected) and (outcome.reason, outcome.order_id) == ("UnknownOrder", "o-x")
    assert "orderId" in outcome.description
    [alert] = await p.alerts()
    assert (alert.kind, alert.order_id, alert.reason) == (AlertKind.POISON_MESSAGE, "o-x", "UnknownOrder")
    assert (
        alert.details["queue"],
        alert.details["messageId"],
        alert.details["sessionId"],
        alert.details["sequenceNumber"],
    ) == ("orders-inbound", "cancel-x", "o-x", 11)
    assert await p.services.state.get("o-x") is None and await p.statuses("o-x") == []


def without(key: str) -> dict[str, Any]:
    body = cancel_body()
    del body[key]
    return body


@pytest.mark.parametrize(
    ("body", "session", "reason"),
    [
        (cancel_body("bad id!"), "bad id!", "InvalidField:orderId"),
        (without("requestedAt"), ORDER, "InvalidField:requestedAt"),
        (cancel_body(requestedAt="2024-01-01T00:00:01"), ORDER, "InvalidField:requestedAt"),  # no time zone
        (cancel_body(requestedAt="yesterday"), ORDER, "InvalidField:requestedAt"),
        (without("replyTo"), ORDER, "InvalidField:replyTo"),
        (cancel_body(replyTo="orders-inbound"), ORDER, "InvalidField:replyTo"),  # an internal queue
        (cancel_body(), "o-2", "InvalidField:sessionId"),
        (cancel_body(reason="x" * 257), ORDER, "InvalidField:reason"),
        (cancel_body(schemaVersion=99), ORDER, "UnsupportedSchemaVersion"),
        (cancel_body(extra=1), ORDER, "InvalidField:extra"),
    ],
)
async def test_an_invalid_cancel_is_dead_lettered_with_the_field(
    p: Pipeline, body: dict[str, Any], session: str, reason: str
) -> None:
    await submit_orders(p, ORDER)
    before = await p.services.state.get(ORDER)

    outcome = await cancel(p, body, session=session)

    assert isinstance(outcome, Rejected) and outcome.reason == reason, outcome
    assert await p.services.state.get(ORDER) == before  # the order is untouched
    [alert] = await p.alerts()
    assert (alert.kind, alert.reason) == (AlertKind.POISON_MESSAGE, reason)
    assert terminal(await p.statuses(ORDER)) == []


# --- (f) a Pending order whose earlier attempt sent a step ----------------------------------------------------------


async def retried_after_sending(p: Pipeline) -> None:
    """Attempt 1 sent reserve-inventory and expired: the Supervisor sent the order back to Pending (retry later)."""
    await claim_orders(p, ORDER)
    await run_action(p, ORDER, FIRST, RESERVE, None)
    p.clock.advance(p.services.tunables.claim_lease + timedelta(seconds=1))
    assert (await run_supervisor(p.services)).recovered == [ORDER]
    rec = await state_of(p, ORDER)
    assert (rec.process_state, rec.failure_count, rec.locked_by) == (ProcessState.PENDING, 1, None)
    assert rec.retry_at is not None and rec.retry_at > p.clock.now()


async def test_a_pending_order_whose_earlier_attempt_sent_a_step_is_compensated(p: Pipeline) -> None:
    await retried_after_sending(p)

    outcome = await cancel(p)

    assert outcome == CancelDone(order_id=ORDER, state=ProcessState.COMPENSATING, changed=True, tell=None)
    rec = await state_of(p, ORDER)
    assert (rec.process_state, rec.locked_by, rec.retry_at, rec.complete_by) == (
        ProcessState.COMPENSATING,
        None,
        None,
        None,
    )
    assert rec.compensation_cause == f"cancelled: {REASON}" and rec.failure_count == 1
    assert [(c.name.value, c.step.value) for c in rec.compensations] == [(RELEASE, RESERVE)]
    assert terminal(await p.statuses(ORDER)) == []

    # Due at once (not at the Pending retryAt), claimed for attempt 2 without an admission slot.
    start = RecordingStartNew()
    run = await run_starter(p.services, start)
    assert run.claimed == [f"{ORDER}:2"] and run.not_admitted == 0
    assert (start.calls[0][2]["attempt"], start.calls[0][2]["workflowVersion"]) == (2, WORKFLOW_VERSION)
    figures, _ = await admission.read_figures(p.services)
    assert (figures.processing, figures.reserved) == (0, ())
    rec = await state_of(p, ORDER)
    assert (rec.process_state, rec.locked_by, rec.attempt) == (ProcessState.COMPENSATING, f"{ORDER}:2", 2)
    second = f"{ORDER}:2"
    assert (await state_activity(fn.LOAD_ORDER)({"orderId": ORDER, "instanceId": second}))["plan"] == {
        "compensations": [RELEASE]
    }

    await run_action(p, ORDER, second, RELEASE, undone=False, honours_cancel=False)  # never applied
    assert await finish(p, "completed", "compensated", instance=second) is True
    [status] = terminal(await p.statuses(ORDER))
    assert (status.state, status.reason, status.attempt) == (OrderStatus.COMPENSATED, f"cancelled: {REASON}", 2)
    assert status.effects is not None and (status.effects.applied, status.effects.undone) == ([], [])
    assert await p.alerts() == []  # a cancel raises no alert


# --- the Supervisor and "not now" honour a recorded cancel ----------------------------------------------------------


async def test_an_expired_cancelled_attempt_with_nothing_sent_ends_cancelled_without_a_failure(p: Pipeline) -> None:
    await claim_orders(p, ORDER)
    await cancel(p)
    p.clock.advance(p.services.tunables.claim_lease + timedelta(seconds=1))

    run = await run_supervisor(p.services)

    assert run.escalated == [ORDER]
    rec = await state_of(p, ORDER)
    assert (rec.process_state, rec.failure_count, rec.locked_by) == (ProcessState.CANCELLED, 0, None)
    [status] = terminal(await p.statuses(ORDER))
    assert status.state is OrderStatus.CANCELLED
    assert await p.alerts() == []


async def test_an_expired_cancelled_attempt_that_sent_a_step_is_compensated(p: Pipeline) -> None:
    await claim_orders(p, ORDER)
    await run_action(p, ORDER, FIRST, RESERVE, None)
    await cancel(p)
    p.clock.advance(p.services.tunables.claim_lease + timedelta(seconds=1))

    run = await run_supervisor(p.services)

    assert run.recovered == [ORDER]
    rec = await state_of(p, ORDER)
    assert (rec.process_state, rec.failure_count, rec.locked_by, rec.retry_at) == (
        ProcessState.COMPENSATING,
        0,
        None,
        None,
    )
    assert (await run_starter(p.services, RecordingStartNew())).claimed == [f"{ORDER}:2"]


async def test_a_deferral_of_a_cancelled_attempt_compensates_instead(p: Pipeline) -> None:
    await claim_orders(p, ORDER)
    await run_action(p, ORDER, FIRST, RESERVE, None)
    await cancel(p)
    retry_at = p.clock.now() + timedelta(seconds=30)
    assert (
        await state_activity(fn.DEFER_ORDER)(
            {
                "orderId": ORDER,
                "instanceId": FIRST,
                "step": RESERVE,
                "retryAfterSeconds": 30,
                "retryAt": format_utc(retry_at),
                "reason": f"{RESERVE}: CircuitOpen: open",
            }
        )
        is True
    )
    rec = await state_of(p, ORDER)
    assert (rec.process_state, rec.locked_by, rec.retry_at) == (ProcessState.COMPENSATING, None, None)
    assert [c.name.value for c in rec.compensations] == [RELEASE]


# --- the submission trigger -----------------------------------------------------------------------------------------


class Settled:
    """ServiceBusMessageActions in the trigger's hands: what it settled."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def complete(self, message: Any) -> None:
        self.calls.append("complete")

    def abandon(self, message: Any) -> None:
        self.calls.append("abandon")

    def deadletter(self, message: Any, **kwargs: Any) -> None:
        self.calls.append(f"deadletter:{kwargs.get('deadletter_reason')}")


async def trigger(
    p: Pipeline, body: dict[str, Any], api: ScriptedDurableApi, *, session: str = ORDER, message_id: str = "cancel-1"
) -> Settled:
    """The submission trigger with a message as the binding hands it over and the real DurableOrchestrationClient
    on a scripted Durable HTTP API (its requests are recorded)."""
    import triggers.submission

    message = SimpleNamespace(
        body=[json.dumps(body).encode()], message_id=message_id, session_id=session, sequence_number=5
    )
    settled = Settled()
    handler = triggers.submission.submission._function.get_user_function()  # type: ignore[attr-defined]
    await handler(message=message, message_actions=settled, client=api.binding())
    return settled


def raised(api: ScriptedDurableApi) -> list[str]:
    return [unquote(r.split("?")[0]) for r in api.requests]


async def test_the_trigger_raises_the_cancel_on_the_running_attempt_once(
    p: Pipeline, durable_api: ScriptedDurableApi
) -> None:
    await claim_orders(p, ORDER)

    assert (await trigger(p, cancel_body(), durable_api)).calls == ["complete"]
    [request] = raised(durable_api)
    assert request.endswith(f"/instances/{FIRST}/raiseEvent/{CANCEL_EVENT}")
    assert (await trigger(p, cancel_body(), durable_api, message_id="cancel-2")).calls == ["complete"]
    assert len(durable_api.requests) == 1  # a repeat tells no one


async def test_the_trigger_completes_the_cancel_when_the_event_cannot_be_delivered(
    p: Pipeline, durable_api: ScriptedDurableApi
) -> None:
    await claim_orders(p, ORDER)
    durable_api.answer = (410, b"", None)  # the instance has completed meanwhile
    assert (await trigger(p, cancel_body(), durable_api)).calls == ["complete"]
    assert len(durable_api.requests) == 1
    assert (await state_of(p, ORDER)).cancel_requested_at is not None  # the record carries it


async def test_the_trigger_settles_pending_repeated_and_invalid_cancels_without_the_durable_api(
    p: Pipeline, durable_api: ScriptedDurableApi
) -> None:
    await submit_orders(p, ORDER)
    assert (await trigger(p, cancel_body(), durable_api)).calls == ["complete"]  # Pending → Cancelled
    assert (await trigger(p, cancel_body(), durable_api, message_id="cancel-2")).calls == ["complete"]  # a repeat
    assert (await trigger(p, cancel_body("o-x"), durable_api, session="o-x")).calls == ["deadletter:UnknownOrder"]
    assert (await trigger(p, cancel_body("bad id!"), durable_api, session="bad id!")).calls == [
        "deadletter:InvalidField:orderId"
    ]
    assert durable_api.requests == []  # no event raised, no Scheduler started
