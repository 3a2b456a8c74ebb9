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

from activities import ActivityInput
from orderflow import admission
from orderflow import function_names as fn
from orderflow.messages import StepName
from orderflow.notifications import entered_error, notify_terminal
from orderflow.records import OrderStateRecord, ProcessState, StepStatus, parse_utc
from orderflow.runtime import Services, get_services
from orderflow.state_machine import Fenced, complete, defer, fail, record_step, set_step_deadline
from orderflow.store.ports import IndexEntry
from orderflow.workflow import SUCCEEDED_STEPS

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
            "total": str(order.total()), "items": [i.to_dict() for i in order.items],
            # Steps an earlier attempt completed: the Scheduler skips them (no remote call; the retry budget).
            SUCCEEDED_STEPS: [s.name.value for s in current[0].steps if s.status is StepStatus.SUCCEEDED]}


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
        await free_slot(services, rec, wrote.changed, left_processing_at)
    return True


class Wrote:
    """A mutation that remembers whether its last application changed the record (what `update_with_retry` wrote):
    a repeated activity finds the record already moved and writes nothing."""

    def __init__(self, mutate: Callable[[OrderStateRecord], OrderStateRecord]) -> None:
        self._mutate = mutate
        self.changed = False

    def __call__(self, rec: OrderStateRecord) -> OrderStateRecord:
        updated = self._mutate(rec)
        self.changed = updated is not rec
        return updated


async def free_slot(services: Services, rec: OrderStateRecord, wrote: bool, now: datetime) -> None:
    """Free the order's admission slot if this call wrote its exit from Processing (a repeated call wrote nothing and
    frees nothing). Best effort: a failure is an over-count until the next refresh (orderflow/admission.py)."""
    if not wrote or rec.process_state is ProcessState.PROCESSING:
        return
    try:
        await admission.exited(services, now)
    except Exception:
        log.exception("admission slot of %s not freed; the next refresh corrects it", rec.order_id)


@bp.function_name(fn.SET_STEP_DEADLINE)
@bp.activity_trigger(input_name="request")
async def set_step_deadline_activity(request: ActivityInput) -> bool:
    services = await get_services()
    step, deadline = StepName(request["step"]), parse_utc(request["completeBy"])
    if services.index is not None:  # before the record: a crash leaves a stale entry, never a missing one
        await services.index.add(IndexEntry(request["orderId"], deadline, request["instanceId"]))
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


@bp.function_name(fn.DEFER_ORDER)
@bp.activity_trigger(input_name="request")
async def defer_order(request: ActivityInput) -> bool:
    """"Not now" (fenced): the remote service's circuit breaker is open, so the attempt ends without a FailureCount and
    the order waits in Pending until `retryAfterSeconds` (the breaker's cool-down); the Starter claims it again once
    the breaker lets calls through."""
    services = await get_services()
    now = services.clock.now()
    retry_at = parse_utc(request["retryAt"]) if request.get("retryAt") else \
        now + timedelta(seconds=max(0.0, float(request.get("retryAfterSeconds") or 0.0)))
    return await _fenced(request["orderId"], lambda r: defer(
        r, request["instanceId"], retry_at, now, request.get("reason") or "deferred"), fn.DEFER_ORDER,
        left_processing_at=now)


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
    wrote = Wrote((lambda r: fail(r, instance, reason, now)) if failed else (lambda r: complete(r, instance, now)))
    try:
        rec, _ = await services.state.update_with_retry(request["orderId"], wrote)
    except Fenced as exc:
        log.info("finish_order fenced: %s", exc)
        return False
    await free_slot(services, rec, wrote.changed, now)
    if rec.notified_at is None:
        await (entered_error(services, rec) if failed else notify_terminal(services, rec))
    return True
