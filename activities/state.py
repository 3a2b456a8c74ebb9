"""The live Scheduler's state activities: every state-store update is fenced on LockedBy == the calling instance id.

A fenced-out call (a superseded attempt) returns False/None instead of raising, so the orchestration stops quietly.
Repeating a call with the same input is a no-op (the state machine treats an identical update as unchanged). Inputs
and results are the typed models of orderflow/activity_models.py, as plain JSON; the activities only versions 1 and
2 call are in activities/frozen_versions.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import azure.durable_functions as df

from activities import ActivityInput, traced
from orderflow import admission, tracing
from orderflow import function_names as fn
from orderflow.activity_models import AdvanceOrderInput, AdvanceOrderResult, DeferOrderInput
from orderflow.advance import Decision, advance
from orderflow.messages import AgentRequest, idempotency_key
from orderflow.notifications import entered_end
from orderflow.outbound import send_agent_request
from orderflow.patience import patiently
from orderflow.ports import IndexEntry
from orderflow.records import OrderRecord, OrderStateRecord, ProcessState
from orderflow.recovery_index import index_deadline, update_indexed
from orderflow.runtime import Services, get_services
from orderflow.state_machine import (
    Fenced,
    Wrote,
    defer,
)

bp = df.Blueprint()
log = logging.getLogger("orderflow.activities")


def order_payload(stored: OrderRecord) -> dict[str, Any]:
    """The order as the Agent's requests carry it (`payload`)."""
    order = stored.submit_order()
    return {
        "orderId": order.order_id,
        "customer": order.customer.to_dict(),
        "currency": order.currency,
        "total": str(order.total()),
        "items": [i.to_dict() for i in order.items],
    }


async def fenced_update(
    order_id: str,
    mutate: Callable[[OrderStateRecord], OrderStateRecord],
    what: str,
    left_processing_at: datetime | None = None,
    ahead: IndexEntry | None = None,
) -> bool:
    """Apply one fenced update; False when this instance no longer holds LockedBy (a superseded attempt). With
    `left_processing_at` (the `now` the mutation stamps), the update takes the order out of Processing: when this call
    wrote it, its admission slot is freed. The recovery-index entries the write superseded are removed after it
    (`ahead`: the entry written for it; orderflow/recovery_index.py)."""
    services = await get_services()
    wrote = Wrote(mutate)
    try:
        rec, _ = await update_indexed(services.state, services.index, order_id, wrote, ahead)
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


@bp.function_name(fn.DEFER_ORDER)
@bp.activity_trigger(input_name="request")
async def defer_order(request: ActivityInput) -> bool:
    """ "Not now" (fenced): the remote service's circuit breaker is open, so the attempt ends without a FailureCount and
    the order waits in Pending until `retryAfterSeconds` (the breaker's cool-down); the Starter claims it again once
    the breaker lets calls through."""
    with traced(fn.DEFER_ORDER, request):
        services = await get_services()
        now = services.clock.now()
        inp = DeferOrderInput.from_dict(request)
        retry_at = inp.retry_at or now + timedelta(seconds=max(0.0, inp.retry_after_seconds))
        return await fenced_update(
            inp.order_id,
            lambda r: defer(r, inp.instance_id, retry_at, now, inp.reason or "deferred"),
            fn.DEFER_ORDER,
            left_processing_at=now,
        )


@bp.function_name(fn.ADVANCE_ORDER)
@bp.activity_trigger(input_name="request")
async def advance_order(request: ActivityInput) -> dict[str, Any] | None:
    """Workflow version 3: one decision point of the Scheduler in one fenced write (orderflow/advance.py): record the
    last action's result, honour a cancel, then set the next step's or compensation's CompleteBy and send its Agent
    request — or end the order and send what it owes. Answers {"send": action} (the request is on its way; its
    CompleteBy is the one given), {"done": state} (the record is terminal) or None (superseded: fenced out).

    Idempotent: the recovery-index entry is written before the CompleteBy (the entries the write superseded are
    removed after it), the write is a no-op when repeated, the request's MessageId `<instanceId>:<step>` lets
    duplicate detection absorb a resend, and a terminal record still owing its notification sends it. A transient bus
    failure of the request is retried here until the CompleteBy."""
    with traced(fn.ADVANCE_ORDER, request) as span:
        services = await get_services()
        now = services.clock.now()
        inp = AdvanceOrderInput.from_dict(request)
        order_id, instance, complete_by, cancel = inp.order_id, inp.instance_id, inp.complete_by, inp.cancel
        result = inp.result.step_result() if inp.result is not None else None
        version = inp.workflow_version
        decisions: list[Decision] = []

        def decide(r: OrderStateRecord) -> OrderStateRecord:
            decisions.append(advance(r, instance, result, complete_by, now, version, cancel))
            return decisions[-1].record

        # The entry of the CompleteBy this decision may write, first: a crash in between leaves a stale entry, never a
        # missing one. Written even when the decision turns out to end the order (knowing it would cost a read); then
        # removed after the write, with the entry of the CompleteBy the write replaced.
        ahead = await index_deadline(services.index, order_id, complete_by, instance)
        wrote = Wrote(decide)
        try:
            rec, _ = await update_indexed(services.state, services.index, order_id, wrote, ahead)
        except Fenced as exc:
            log.info("%s fenced: %s", fn.ADVANCE_ORDER, exc)
            return None
        decision = decisions[-1]
        span.set_attribute(tracing.STEP, (decision.send or rec.process_state).value)  # what this decision does
        await free_slot(services, rec, wrote, now)
        if decision.send is None:
            if rec.notified_at is None:
                await entered_end(services, rec)
            return AdvanceOrderResult(done=rec.process_state).to_dict()
        stored = await services.orders.get(order_id)
        if stored is None:
            raise LookupError(f"order {order_id} has a state record but no order record")
        message = AgentRequest.model_validate(
            {
                "instanceId": instance,
                "orderId": order_id,
                "attempt": rec.attempt,
                "step": decision.send.value,
                "idempotencyKey": idempotency_key(order_id, decision.send.value),
                "deadline": complete_by.isoformat(),
                "maxRetries": inp.agent_retries,
                "payload": order_payload(stored),
                "replyTo": services.tunables.agent_replies_queue,
                "traceparent": tracing.current_traceparent(),
            }
        )
        # A bus outage is waited out here until the step's CompleteBy (orderflow/patience.py): failing, the activity
        # would be retried 3 times 1 s apart, then end the attempt, which the Supervisor counts as a failure.
        await patiently(
            lambda: send_agent_request(services.bus, services.tunables.agent_requests_queue, message),
            services.clock,
            complete_by,
            what=f"request {message.message_id()}",
            sleep=getattr(services.clock, "sleep", asyncio.sleep),
            logger=log,
        )
        return AdvanceOrderResult(send=decision.send).to_dict()
