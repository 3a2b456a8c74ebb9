"""Terminal notifications: the terminal status to the submitting app (`completed`, `failed`, `compensated`,
`compensation-failed`, `cancelled`) and, for an order that failed, the operator alert; both say which steps' effects
were applied and which were undone (`effects`).

The fenced state write (Processed/Error) comes first, the sends after it, and `notifiedAt` is set only once both
succeed; the Supervisor's sweep sends again for records left with `notifiedAt` null. Status MessageIds are stable
(`<orderId>:<state>:<attempt>`); alerts are at-least-once. The write that sets `notifiedAt` counts the order as
finished (`orderflow.orders.completed`, `orderflow.order.duration`); the sends run in the span
`orderflow.terminal_status`. That write also starts the finished order's retention (orderflow/retention.py: the TTL of
its stored order first, then of its state record). Why this order of writes: docs/modules-product.md."""

from __future__ import annotations

import logging

from orderflow import telemetry, tracing
from orderflow.messages import COMPENSATED_STEP, AlertKind, Effects, OrderStatus
from orderflow.outbound import raise_alert, send_status
from orderflow.records import OrderStateRecord, ProcessState, StepStatus
from orderflow.retention import expire_finished
from orderflow.runtime import Services
from orderflow.state_machine import CANCELLED_PREFIX, IllegalTransition, Wrote, mark_notified

log = logging.getLogger("orderflow.notifications")

THRESHOLD_PREFIX = "FailureThresholdReached"


COMPLETED_REASON = "all steps succeeded"


def terminal_status(rec: OrderStateRecord) -> tuple[OrderStatus, str]:
    """The status a terminal record announces and its reason: `completed` always with the success (never an error
    of an earlier attempt, which a record written before `previousErrors` existed may still hold in lastError),
    `failed` with the error that ended the order, the compensation states with their cause."""
    state = rec.process_state
    if state is ProcessState.ERROR:
        return OrderStatus.FAILED, rec.last_error or "failed"
    if state is ProcessState.PROCESSED:
        return OrderStatus.COMPLETED, COMPLETED_REASON
    if state is ProcessState.COMPENSATED:
        return OrderStatus.COMPENSATED, rec.compensation_cause or "compensated"
    if state is ProcessState.COMPENSATION_FAILED:
        return (
            OrderStatus.COMPENSATION_FAILED,
            f"{rec.last_error or 'compensation failed'} (after: {rec.compensation_cause or 'unknown'})",
        )
    if state is ProcessState.CANCELLED:
        return OrderStatus.CANCELLED, rec.compensation_cause or CANCELLED_PREFIX
    raise IllegalTransition(f"order {rec.order_id} is {state.value}: it has no terminal status")


def effects_of(rec: OrderStateRecord) -> Effects | None:
    """Applied: steps that succeeded, and steps whose compensation found their effect applied (a step recorded as
    running may have been applied). Undone: steps whose compensation undid their effect. None when nothing was sent."""
    if not rec.sent_steps() and not rec.compensations:
        return None
    undone = [COMPENSATED_STEP[c.name] for c in rec.compensations if c.undone]
    succeeded = {s.name for s in rec.steps if s.status is StepStatus.SUCCEEDED}
    applied = [s.name for s in rec.steps if s.name in succeeded or s.name in undone]
    return Effects(applied=applied, undone=[s.name for s in rec.steps if s.name in undone])


def _alert_kind(rec: OrderStateRecord, reason: str) -> AlertKind | None:
    """The operator alert a terminal record owes: an order that failed (compensated or not), or whose compensation
    failed. A completed or cancelled order owes none."""
    if rec.process_state is ProcessState.COMPENSATION_FAILED:
        return AlertKind.COMPENSATION_FAILED
    cause = (
        reason
        if rec.process_state is ProcessState.ERROR
        else (rec.compensation_cause if rec.process_state is ProcessState.COMPENSATED else None)
    )
    if cause is None or cause.startswith(CANCELLED_PREFIX):
        return None
    return AlertKind.FAILURE_THRESHOLD if cause.startswith(THRESHOLD_PREFIX) else AlertKind.ORDER_FAILED


async def send_terminal_status(services: Services, rec: OrderStateRecord) -> None:
    """(Re)send a terminal record's status: same state, reason, attempt and so MessageId every time, so duplicate
    detection on the reply queue absorbs a repeat inside its window. Used by `notify_terminal` and by the
    submission when an order that is already terminal is submitted again."""
    state, reason = terminal_status(rec)
    await send_status(
        services.bus,
        rec.reply_to,
        order_id=rec.order_id,
        state=state,
        attempt=rec.attempt,
        reason=reason,
        now=services.clock.now(),
        effects=effects_of(rec),
    )


async def notify_terminal(services: Services, rec: OrderStateRecord) -> None:
    """Send what a terminal record owes, then record that it was sent (and count the order, once). Raises if a send
    fails. Traced as a child of the current span (the activity that ended the order), else of the order's trace (the
    Supervisor's sweep)."""
    state, reason = terminal_status(rec)
    with tracing.span(
        "orderflow.terminal_status",
        parent=None if tracing.in_trace() else rec.traceparent,
        kind=tracing.SpanKind.PRODUCER,
        attributes={
            **tracing.order_attributes(rec.order_id),
            "orderflow.state": rec.process_state.value,
            "orderflow.status": state.value,
        },
    ):
        now = services.clock.now()
        kind = _alert_kind(rec, reason)
        if kind is not None:
            effects = effects_of(rec)
            details: dict[str, object] = {"attempt": rec.attempt, "failureCount": rec.failure_count}
            if effects is not None:
                details.update(effects.to_dict())
            await raise_alert(
                services.bus,
                services.tunables.alerts_queue,
                kind=kind,
                order_id=rec.order_id,
                reason=reason,
                now=now,
                details=details,
            )
        await send_terminal_status(services, rec)
        ttl = services.tunables.finished_ttl
        await expire_finished(services, rec, ttl)
        wrote = Wrote(lambda r: mark_notified(r, services.clock.now(), ttl))
        await services.state.update_with_retry(rec.order_id, wrote)
    if wrote.changed:  # this call recorded the notification: the order ends here, once
        ended = rec.process_state.value
        telemetry.count_order_completed(ended)
        telemetry.record_order_duration(ended, max(0.0, (rec.updated_at - rec.created_at).total_seconds()))


async def entered_error(services: Services, rec: OrderStateRecord) -> None:
    """Count an order that just moved to Error (metric), then notify."""
    telemetry.count_order_error()
    await notify_terminal(services, rec)


async def entered_end(services: Services, rec: OrderStateRecord) -> None:
    """An order that just reached a terminal state: notify (and count it, for Error)."""
    await (entered_error(services, rec) if rec.process_state is ProcessState.ERROR else notify_terminal(services, rec))


async def sweep_unnotified(services: Services) -> int:
    """Send the notifications still owed by terminal records last written before one claim lease ago."""
    before = services.clock.now() - services.tunables.claim_lease
    sent = 0
    for rec, _etag in await services.state.query_unnotified(before, services.tunables.max_results):
        try:
            await notify_terminal(services, rec)
            sent += 1
        except IllegalTransition:
            continue  # no longer terminal (cannot happen today; a later state may reopen records)
        except Exception:  # one failing send must not stop the sweep; the next run tries again
            log.exception("notification for %s is still owed", rec.order_id)
    if sent:
        log.warning("sent %d owed terminal notifications", sent)
    return sent
