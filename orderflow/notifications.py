"""Terminal notifications: the `completed`/`failed` status to the submitting app and, for Error, the operator alert.

The state write comes first (Processed/Error, fenced), the notification after it, and `notifiedAt` is set only once
both sends succeeded. A send that fails, or a crash between the write and the sends, leaves `notifiedAt` null: the
Supervisor's sweep finds such records (after a grace period, so it does not race the activity that is sending) and
sends again. Status MessageIds are stable (`<orderId>:<state>:<attempt>`), so duplicate detection on the reply queue
absorbs a repeat; an alert may be raised twice in that case (at-least-once alerting).
"""

from __future__ import annotations

import logging

from orderflow import telemetry
from orderflow.messages import AlertKind, OrderStatus
from orderflow.outbound import raise_alert, send_status
from orderflow.records import OrderStateRecord, ProcessState
from orderflow.runtime import Services
from orderflow.state_machine import IllegalTransition, mark_notified

log = logging.getLogger("orderflow.notifications")

THRESHOLD_PREFIX = "FailureThresholdReached"


COMPLETED_REASON = "all steps succeeded"


def terminal_status(rec: OrderStateRecord) -> tuple[OrderStatus, str]:
    """The status a terminal record announces and its reason: `completed` always with the success (never an error
    of an earlier attempt, which a record written before `previousErrors` existed may still hold in lastError),
    `failed` with the error that ended the order."""
    if rec.process_state is ProcessState.ERROR:
        return OrderStatus.FAILED, rec.last_error or "failed"
    if rec.process_state is ProcessState.PROCESSED:
        return OrderStatus.COMPLETED, COMPLETED_REASON
    raise IllegalTransition(f"order {rec.order_id} is {rec.process_state.value}: it has no terminal status")


async def send_terminal_status(services: Services, rec: OrderStateRecord) -> None:
    """(Re)send a terminal record's status: same state, reason, attempt and so MessageId every time, so duplicate
    detection on the reply queue absorbs a repeat inside its window. Used by `notify_terminal` and by the
    submission when an order that is already terminal is submitted again."""
    state, reason = terminal_status(rec)
    await send_status(services.bus, rec.reply_to, order_id=rec.order_id, state=state, attempt=rec.attempt,
                      reason=reason, now=services.clock.now())


async def notify_terminal(services: Services, rec: OrderStateRecord) -> None:
    """Send what a terminal record owes, then record that it was sent. Raises if a send fails."""
    now = services.clock.now()
    state, reason = terminal_status(rec)
    if state is OrderStatus.FAILED:
        kind = AlertKind.FAILURE_THRESHOLD if reason.startswith(THRESHOLD_PREFIX) else AlertKind.ORDER_FAILED
        await raise_alert(services.bus, services.tunables.alerts_queue, kind=kind, order_id=rec.order_id,
                          reason=reason, now=now, details={"attempt": rec.attempt, "failureCount": rec.failure_count})
    await send_terminal_status(services, rec)
    await services.state.update_with_retry(rec.order_id, lambda r: mark_notified(r, services.clock.now()))


async def entered_error(services: Services, rec: OrderStateRecord) -> None:
    """Count an order that just moved to Error (metric), then notify."""
    telemetry.count_order_error()
    await notify_terminal(services, rec)


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
