"""The activities only the Scheduler's frozen versions 1 and 2 call (orchestrators/frozen_versions.py).

They stay registered, with their names and input shapes, until no instance of those versions is in flight (README,
"Versioning"). Fenced on LockedBy like every state activity (activities/state.py); a fenced-out call returns
False/None. `send_agent_request` sends one step's request to the Agent on agent-requests (SessionId = orderId) with
the MessageId `<instanceId>:<step>`, so duplicate detection absorbs a resend.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import azure.durable_functions as df

from activities import ActivityInput, traced
from activities.state import fenced_update, free_slot, order_payload
from orderflow import function_names as fn
from orderflow import tracing
from orderflow.messages import AgentRequest, parse_action
from orderflow.notifications import entered_end
from orderflow.outbound import send_agent_request
from orderflow.ports import IndexEntry
from orderflow.records import TERMINAL_STATES, OrderStateRecord, ProcessState, StepStatus, parse_utc
from orderflow.recovery_index import index_deadline, update_indexed
from orderflow.runtime import Services, get_services
from orderflow.state_machine import (
    Fenced,
    Wrote,
    begin_compensation,
    cancel_pending,
    complete,
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
            SUCCEEDED_STEPS: [s.name.value for s in rec.steps if s.status is StepStatus.SUCCEEDED],
        }
        if rec.process_state is ProcessState.COMPENSATING:  # version 2 reads it; version 1 never claims a compensation
            loaded[PLAN] = {
                "compensations": [c.name.value for c in rec.compensations if c.status is not StepStatus.SUCCEEDED]
            }
        return loaded


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
        ahead = await index_deadline(services.index, request["orderId"], deadline, instance)

        def mutate(r: OrderStateRecord) -> OrderStateRecord:
            if honours_cancel and cancel_pending(r, instance):
                raise _CancelRequested
            return set_step_deadline(
                r, instance, action, deadline, services.clock.now(), request.get("workflowVersion")
            )

        try:
            return await fenced_update(request["orderId"], mutate, fn.SET_STEP_DEADLINE, ahead=ahead)
        except _CancelRequested:
            return "cancel"


@bp.function_name(fn.RECORD_STEP_RESULT)
@bp.activity_trigger(input_name="request")
async def record_step_result(request: ActivityInput) -> bool:
    with traced(fn.RECORD_STEP_RESULT, request):
        services = await get_services()
        action, status = parse_action(request["step"]), StepStatus(request["status"])
        return await fenced_update(
            request["orderId"],
            lambda r: record_step(
                r,
                request["instanceId"],
                action,
                status,
                services.clock.now(),
                error=request.get("error"),
                undone=request.get("undone"),
            ),
            fn.RECORD_STEP_RESULT,
        )


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
        ahead = await index_deadline(services.index, request["orderId"], deadline, request["instanceId"])
        rec = await _write_and_notify(
            services,
            request["orderId"],
            Wrote(lambda r: begin_compensation(r, request["instanceId"], request["cause"], deadline, now)),
            now,
            fn.BEGIN_COMPENSATION,
            ahead,
        )
        if rec is None:
            return None
        if rec.process_state in TERMINAL_STATES:
            return []
        return [c.name.value for c in rec.compensations if c.status is not StepStatus.SUCCEEDED]


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
            return (
                await _write_and_notify(services, request["orderId"], Wrote(finish), now, fn.FINISH_ORDER) is not None
            )
        except _CancelRequested:
            return "cancel"


async def _write_and_notify(
    services: Services, order_id: str, wrote: Wrote, now: datetime, what: str, ahead: IndexEntry | None = None
) -> OrderStateRecord | None:
    """One fenced write (None: fenced), then the removal of the recovery-index entries it superseded (`ahead`: the
    one written for it); the admission slot of an exit from Processing is freed, and a record that reached its end
    sends what it owes. A failed send raises: the Scheduler retries the activity, and the Supervisor's sweep sends
    whatever a terminal record still owes (orderflow/notifications.py)."""
    try:
        rec, _ = await update_indexed(services.state, services.index, order_id, wrote, ahead)
    except Fenced as exc:
        log.info("%s fenced: %s", what, exc)
        return None
    await free_slot(services, rec, wrote, now)
    if rec.process_state in TERMINAL_STATES and rec.notified_at is None:
        await entered_end(services, rec)
    return rec


@bp.function_name(fn.SEND_AGENT_REQUEST)
@bp.activity_trigger(input_name="request")
async def send_agent_request_activity(request: ActivityInput) -> str:
    with traced(fn.SEND_AGENT_REQUEST, request):
        services = await get_services()
        message = AgentRequest.model_validate(
            {**request, "replyTo": services.tunables.agent_replies_queue, "traceparent": tracing.current_traceparent()}
        )
        await send_agent_request(services.bus, services.tunables.agent_requests_queue, message)
        return message.message_id()
