"""State activities of the Scheduler: every state-store update is fenced on LockedBy == the calling instance id.

A fenced-out call (a superseded attempt) returns False/None instead of raising, so the orchestration stops quietly.
Repeating a call with the same input is a no-op (the state machine treats an identical update as unchanged).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import azure.durable_functions as df

from activities import ActivityInput, traced
from orderflow import admission, tracing
from orderflow import function_names as fn
from orderflow.advance import Decision, StepResult, advance
from orderflow.messages import AgentRequest, idempotency_key, parse_action
from orderflow.notifications import entered_end
from orderflow.outbound import send_agent_request
from orderflow.records import TERMINAL_STATES, OrderRecord, OrderStateRecord, ProcessState, StepStatus, parse_utc
from orderflow.recovery_index import index_deadline
from orderflow.runtime import Services, get_services
from orderflow.state_machine import (
    Fenced,
    Wrote,
    begin_compensation,
    cancel_pending,
    complete,
    defer,
    fail,
    record_step,
    set_step_deadline,
)
from orderflow.workflow import PLAN, SUCCEEDED_STEPS

bp = df.Blueprint()
log = logging.getLogger("orderflow.activities")


@bp.function_name(fn.LOAD_ORDER)
@bp.activity_trigger(input_name="request")
async def load_order(request: ActivityInput) -> dict[str, Any] | None:
    """The order's data for the Agent requests, or None when this instance no longer holds the lock."""
    with traced(fn.LOAD_ORDER, request):
        services = await get_services()
        current = await services.state.get(request["orderId"])
        if current is None or current[0].locked_by != request["instanceId"]:
            return None
        stored = await services.orders.get(request["orderId"])
        if stored is None:
            return None
        rec = current[0]
        loaded: dict[str, Any] = {
            **order_payload(stored),
            # Steps an earlier attempt completed: the Scheduler skips them (no remote call; the retry budget).
            SUCCEEDED_STEPS: [s.name.value for s in rec.steps if s.status is StepStatus.SUCCEEDED]}
        if rec.process_state is ProcessState.COMPENSATING:  # version 2 reads it; version 1 never claims a compensation
            loaded[PLAN] = {"compensations": [c.name.value for c in rec.compensations
                                              if c.status is not StepStatus.SUCCEEDED]}
        return loaded


def order_payload(stored: OrderRecord) -> dict[str, Any]:
    """The order as the Agent's requests carry it (`payload`)."""
    order = stored.submit_order()
    return {"orderId": order.order_id, "customer": order.customer.to_dict(), "currency": order.currency,
            "total": str(order.total()), "items": [i.to_dict() for i in order.items]}


async def _fenced(order_id: str, mutate: Callable[[OrderStateRecord], OrderStateRecord], what: str,
                  left_processing_at: datetime | None = None) -> bool:
    """Apply one fenced update; False when this instance no longer holds LockedBy (a superseded attempt). With
    `left_processing_at` (the `now` the mutation stamps), the update takes the order out of Processing: when this call
    wrote it, its admission slot is freed."""
    services = await get_services()
    wrote = Wrote(mutate)
    try:
        rec, _ = await services.state.update_with_retry(order_id, wrote)
    except Fenced as exc:
        log.info("%s fenced: %s", what, exc)
        return False
    if left_processing_at is not None:
        await free_slot(services, rec, wrote, left_processing_at)
    return True


async def free_slot(services: Services, rec: OrderStateRecord, wrote: Wrote, now: datetime) -> None:
    """Free the order's admission slot if this call wrote its exit from Processing (a repeated call wrote nothing and
    frees nothing; a compensation's end frees nothing: its slot was freed when it left Processing). Best effort: a
    failure is an over-count until the next refresh (orderflow/admission.py)."""
    if not wrote.left_processing or rec.process_state is ProcessState.PROCESSING:
        return
    try:
        await admission.exited(services, now)
    except Exception:
        log.exception("admission slot of %s not freed; the next refresh corrects it", rec.order_id)


class _CancelRequested(Exception):
    """The record says the client cancelled: the Scheduler (version 2) stops before this step."""


@bp.function_name(fn.SET_STEP_DEADLINE)
@bp.activity_trigger(input_name="request")
async def set_step_deadline_activity(request: ActivityInput) -> bool | str:
    """True: the deadline is set (fenced). False: superseded. "cancel" (only for a caller that honours cancels, the
    Scheduler's version 2): the client cancelled this order; nothing was written."""
    with traced(fn.SET_STEP_DEADLINE, request):
        services = await get_services()
        action, deadline = parse_action(request["step"]), parse_utc(request["completeBy"])
        instance, honours_cancel = request["instanceId"], bool(request.get("honoursCancel"))
        await index_deadline(services.index, request["orderId"], deadline, instance)

        def mutate(r: OrderStateRecord) -> OrderStateRecord:
            if honours_cancel and cancel_pending(r, instance):
                raise _CancelRequested
            return set_step_deadline(r, instance, action, deadline, services.clock.now(),
                                     request.get("workflowVersion"))

        try:
            return await _fenced(request["orderId"], mutate, fn.SET_STEP_DEADLINE)
        except _CancelRequested:
            return "cancel"


@bp.function_name(fn.RECORD_STEP_RESULT)
@bp.activity_trigger(input_name="request")
async def record_step_result(request: ActivityInput) -> bool:
    with traced(fn.RECORD_STEP_RESULT, request):
        services = await get_services()
        action, status = parse_action(request["step"]), StepStatus(request["status"])
        return await _fenced(request["orderId"], lambda r: record_step(
            r, request["instanceId"], action, status, services.clock.now(), error=request.get("error"),
            undone=request.get("undone")), fn.RECORD_STEP_RESULT)


@bp.function_name(fn.BEGIN_COMPENSATION)
@bp.activity_trigger(input_name="request")
async def begin_compensation_activity(request: ActivityInput) -> list[str] | None:
    """Fenced: Processing → CompensationInProgress; answers the compensations to run, newest step first. [] when
    nothing was sent: the order ended Cancelled (a cancel) or Error (a failure), and its status is sent here. None:
    superseded."""
    with traced(fn.BEGIN_COMPENSATION, request):
        services = await get_services()
        now = services.clock.now()
        deadline = parse_utc(request["completeBy"])
        await index_deadline(services.index, request["orderId"], deadline, request["instanceId"])
        rec = await _write_and_notify(services, request["orderId"], Wrote(
            lambda r: begin_compensation(r, request["instanceId"], request["cause"], deadline, now)), now,
            fn.BEGIN_COMPENSATION)
        if rec is None:
            return None
        if rec.process_state in TERMINAL_STATES:
            return []
        return [c.name.value for c in rec.compensations if c.status is not StepStatus.SUCCEEDED]


@bp.function_name(fn.DEFER_ORDER)
@bp.activity_trigger(input_name="request")
async def defer_order(request: ActivityInput) -> bool:
    """"Not now" (fenced): the remote service's circuit breaker is open, so the attempt ends without a FailureCount and
    the order waits in Pending until `retryAfterSeconds` (the breaker's cool-down); the Starter claims it again once
    the breaker lets calls through."""
    with traced(fn.DEFER_ORDER, request):
        services = await get_services()
        now = services.clock.now()
        retry_at = parse_utc(request["retryAt"]) if request.get("retryAt") else \
            now + timedelta(seconds=max(0.0, float(request.get("retryAfterSeconds") or 0.0)))
        return await _fenced(request["orderId"], lambda r: defer(
            r, request["instanceId"], retry_at, now, request.get("reason") or "deferred"), fn.DEFER_ORDER,
            left_processing_at=now)


@bp.function_name(fn.FINISH_ORDER)
@bp.activity_trigger(input_name="request")
async def finish_order(request: ActivityInput) -> bool | str:
    """Processed + status `completed`, or Error + operator alert + status `failed`; in CompensationInProgress,
    Compensated + status `compensated` or CompensationFailed + alert + status `compensation-failed` (fenced,
    idempotent). "cancel" (a caller that honours cancels, the Scheduler's version 2): the client cancelled while
    the last step ran; nothing was written.

    The notification follows the state write; if it fails the activity raises and is retried by the Scheduler,
    and the Supervisor's sweep sends whatever a terminal record still owes (orderflow/notifications.py)."""
    with traced(fn.FINISH_ORDER, request):
        services = await get_services()
        now = services.clock.now()
        instance, reason = request["instanceId"], request["reason"]
        failed = request["outcome"] == "failed"
        honours_cancel = bool(request.get("honoursCancel"))

        def finish(r: OrderStateRecord) -> OrderStateRecord:
            if failed:
                return fail(r, instance, reason, now)
            if honours_cancel and cancel_pending(r, instance):
                raise _CancelRequested
            return complete(r, instance, now)

        try:
            return await _write_and_notify(services, request["orderId"], Wrote(finish), now, fn.FINISH_ORDER) \
                is not None
        except _CancelRequested:
            return "cancel"


async def _write_and_notify(services: Services, order_id: str, wrote: Wrote, now: datetime,
                            what: str) -> OrderStateRecord | None:
    """One fenced write (None: fenced); the admission slot of an exit from Processing is freed, and a record that
    reached its end sends what it owes. A failed send raises: the Scheduler retries the activity, and the
    Supervisor's sweep sends whatever a terminal record still owes (orderflow/notifications.py)."""
    try:
        rec, _ = await services.state.update_with_retry(order_id, wrote)
    except Fenced as exc:
        log.info("%s fenced: %s", what, exc)
        return None
    await free_slot(services, rec, wrote, now)
    if rec.process_state in TERMINAL_STATES and rec.notified_at is None:
        await entered_end(services, rec)
    return rec


@bp.function_name(fn.ADVANCE_ORDER)
@bp.activity_trigger(input_name="request")
async def advance_order(request: ActivityInput) -> dict[str, Any] | None:
    """Workflow version 3: one decision point of the Scheduler in one fenced write (orderflow/advance.py): record the
    last action's result, honour a cancel, then set the next step's or compensation's CompleteBy and send its Agent
    request — or end the order and send what it owes. Answers {"send": action} (the request is on its way; its
    CompleteBy is the one given), {"done": state} (the record is terminal) or None (superseded: fenced out).

    Idempotent: the recovery-index entry is written before the CompleteBy, the write is a no-op when repeated, the
    request's MessageId `<instanceId>:<step>` lets duplicate detection absorb a resend, and a terminal record still
    owing its notification sends it."""
    with traced(fn.ADVANCE_ORDER, request) as span:
        services = await get_services()
        now = services.clock.now()
        order_id, instance = request["orderId"], request["instanceId"]
        complete_by = parse_utc(request["completeBy"])
        result = StepResult.from_request(request["result"]) if request.get("result") else None
        cancel = bool(request.get("cancel"))
        version = str(request["workflowVersion"])
        decisions: list[Decision] = []

        def decide(r: OrderStateRecord) -> OrderStateRecord:
            decisions.append(advance(r, instance, result, complete_by, now, version, cancel))
            return decisions[-1].record

        # The entry of the CompleteBy this decision may write, first: a crash in between leaves a stale entry, never a
        # missing one. Written even when the decision turns out to end the order (one stale entry; knowing it would
        # cost a read).
        await index_deadline(services.index, order_id, complete_by, instance)
        wrote = Wrote(decide)
        try:
            rec, _ = await services.state.update_with_retry(order_id, wrote)
        except Fenced as exc:
            log.info("%s fenced: %s", fn.ADVANCE_ORDER, exc)
            return None
        decision = decisions[-1]
        span.set_attribute(tracing.STEP, (decision.send or rec.process_state).value)  # what this decision does
        await free_slot(services, rec, wrote, now)
        if decision.send is None:
            if rec.notified_at is None:
                await entered_end(services, rec)
            return {"done": rec.process_state.value}
        stored = await services.orders.get(order_id)
        if stored is None:
            raise LookupError(f"order {order_id} has a state record but no order record")
        message = AgentRequest.model_validate({
            "instanceId": instance, "orderId": order_id, "attempt": rec.attempt, "step": decision.send.value,
            "idempotencyKey": idempotency_key(order_id, decision.send.value), "deadline": complete_by.isoformat(),
            "maxRetries": request["agentRetries"], "payload": order_payload(stored),
            "replyTo": services.tunables.agent_replies_queue, "traceparent": tracing.current_traceparent()})
        await send_agent_request(services.bus, services.tunables.agent_requests_queue, message)
        return {"send": decision.send.value}
