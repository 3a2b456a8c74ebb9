"""State activities of the Scheduler: every state-store update is fenced on LockedBy == the calling instance id.

A fenced-out call (a superseded attempt) returns False/None instead of raising, so the orchestration stops quietly.
Repeating a call with the same input is a no-op (the state machine treats an identical update as unchanged).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import azure.durable_functions as df

from activities import ActivityInput
from orderflow import function_names as fn
from orderflow.messages import StepName
from orderflow.notifications import entered_error, notify_terminal
from orderflow.records import OrderStateRecord, StepStatus, parse_utc
from orderflow.runtime import get_services
from orderflow.state_machine import Fenced, complete, fail, record_step, set_step_deadline

bp = df.Blueprint()
log = logging.getLogger("orderflow.activities")


@bp.function_name(fn.LOAD_ORDER)
@bp.activity_trigger(input_name="request")
async def load_order(request: ActivityInput) -> dict[str, Any] | None:
    """The order's data for the Agent requests, or None when this instance no longer holds the lock."""
    services = await get_services()
    current = await services.state.get(request["orderId"])
    if current is None or current[0].locked_by != request["instanceId"]:
        return None
    stored = await services.orders.get(request["orderId"])
    if stored is None:
        return None
    order = stored.submit_order()
    return {"orderId": order.order_id, "customer": order.customer.to_dict(), "currency": order.currency,
            "total": str(order.total()), "items": [i.to_dict() for i in order.items]}


async def _fenced(order_id: str, mutate: Callable[[OrderStateRecord], OrderStateRecord], what: str) -> bool:
    """Apply one fenced update; False when this instance no longer holds LockedBy (a superseded attempt)."""
    services = await get_services()
    try:
        await services.state.update_with_retry(order_id, mutate)
    except Fenced as exc:
        log.info("%s fenced: %s", what, exc)
        return False
    return True


@bp.function_name(fn.SET_STEP_DEADLINE)
@bp.activity_trigger(input_name="request")
async def set_step_deadline_activity(request: ActivityInput) -> bool:
    services = await get_services()
    step, deadline = StepName(request["step"]), parse_utc(request["completeBy"])
    return await _fenced(request["orderId"], lambda r: set_step_deadline(
        r, request["instanceId"], step, deadline, services.clock.now()), fn.SET_STEP_DEADLINE)


@bp.function_name(fn.RECORD_STEP_RESULT)
@bp.activity_trigger(input_name="request")
async def record_step_result(request: ActivityInput) -> bool:
    services = await get_services()
    step, status = StepName(request["step"]), StepStatus(request["status"])
    return await _fenced(request["orderId"], lambda r: record_step(
        r, request["instanceId"], step, status, services.clock.now(), error=request.get("error")),
        fn.RECORD_STEP_RESULT)


@bp.function_name(fn.FINISH_ORDER)
@bp.activity_trigger(input_name="request")
async def finish_order(request: ActivityInput) -> bool:
    """Processed + status `completed`, or Error + operator alert + status `failed` (fenced, idempotent).

    The notification follows the state write; if it fails the activity raises and is retried by the Scheduler,
    and the Supervisor's sweep sends whatever a terminal record still owes (orderflow/notifications.py)."""
    services = await get_services()
    now = services.clock.now()
    instance, reason = request["instanceId"], request["reason"]
    failed = request["outcome"] == "failed"
    try:
        rec, _ = await services.state.update_with_retry(
            request["orderId"], (lambda r: fail(r, instance, reason, now)) if failed else
            (lambda r: complete(r, instance, now)))
    except Fenced as exc:
        log.info("finish_order fenced: %s", exc)
        return False
    if rec.notified_at is None:
        await (entered_error(services, rec) if failed else notify_terminal(services, rec))
    return True
