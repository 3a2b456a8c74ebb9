"""Outbound messages: status to a submitting app's reply queue, operator alerts, and Agent requests.

Sending with a SessionId needs the azure-servicebus SDK (the output binding cannot set it), so all sends go through
an `azure.servicebus.aio.ServiceBusClient` (or the embedded broker's client with the same surface). Every message has
a stable MessageId so a retried send is absorbed by duplicate detection.

Every message carries the trace context of the span that sent it in its application properties (`traceparent`,
orderflow/tracing.py): a status message the submitting app receives joins the order's trace, as does an alert.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from azure.servicebus import ServiceBusMessage

from orderflow import telemetry, tracing
from orderflow.apps import client_order_id
from orderflow.messages import AgentRequest, AlertKind, Effects, OperatorAlert, OrderStatus, StatusMessage
from orderflow.ports import BusClient
from orderflow.text import bounded, shown

log = logging.getLogger("orderflow.outbound")


async def _send(
    bus: BusClient,
    queue: str,
    body: str,
    *,
    message_id: str,
    session_id: str | None,
    subject: str,
    traceparent: str | None = None,
) -> None:
    """Send one message; its `traceparent` property is the one given, else the current span's (none outside a
    trace: the message is then exactly what it was before tracing)."""
    properties: dict[str | bytes, Any] = {tracing.TRACEPARENT: traceparent} if traceparent else tracing.inject()
    async with bus.get_queue_sender(queue) as sender:
        await sender.send_messages(
            ServiceBusMessage(
                body,
                message_id=message_id,
                session_id=session_id,
                subject=subject,
                content_type="application/json",
                application_properties=properties or None,
            )
        )


async def send_status(
    bus: BusClient,
    queue: str,
    *,
    order_id: str,
    state: OrderStatus,
    attempt: int,
    reason: str,
    now: datetime,
    message_id: str | None = None,
    effects: Effects | None = None,
) -> StatusMessage:
    """Send a status of the order `order_id` (its key: orderflow/apps.py) to the app's reply queue `queue`. The app
    reads its own orderId in the message and as the SessionId, never the key. The MessageId is
    `<orderId>:<state>:<attempt>` unless the caller names one. The reason (an error text may come from a remote
    service) is cut to `DEAD_LETTER_TEXT_MAX` characters."""
    own_id = client_order_id(order_id)
    status = StatusMessage(
        order_id=own_id, state=state, attempt=attempt, timestamp=now, reason=bounded(reason), effects=effects
    )
    await _send(
        bus,
        queue,
        status.to_json(),
        message_id=message_id or status.message_id(),
        session_id=own_id,
        subject="OrderStatus",
    )
    return status


def about_message(queue: str, message_id: object, session_id: object, sequence_number: object) -> dict[str, Any]:
    """The `details` that name the message an alert is about: its queue, MessageId, SessionId and SequenceNumber, as
    the trigger received them, whole (JSON escapes a NUL or any other control character; nothing here cuts them).

    A dead-lettered message keeps its SequenceNumber, so it matches the alert even where a binding could not hand the
    function the whole MessageId/SessionId (README, Messages: the SDK-type binding's decoder stops at a NUL).
    """
    return {
        "queue": queue,
        "messageId": None if message_id is None else str(message_id),
        "sessionId": None if session_id is None else str(session_id),
        "sequenceNumber": None if sequence_number is None else int(str(sequence_number)),
    }


async def raise_alert(
    bus: BusClient,
    queue: str,
    *,
    kind: AlertKind,
    order_id: str | None,
    reason: str,
    now: datetime,
    details: dict[str, Any] | None = None,
) -> OperatorAlert:
    """Raise an operator alert: a log record at ERROR, a metric, and a message on the operator-alerts queue.

    The alert's MessageId is `OperatorAlert.message_id()`: one per source message (or order attempt) and reason, the
    same when a redelivery raises it again. The reason and every text in `details` are cut to `DEAD_LETTER_TEXT_MAX`
    characters, so an alert stays far inside the queue's message size whatever text a sender chose.
    """
    alert = OperatorAlert(
        kind=kind,
        order_id=order_id,
        reason=bounded(reason),
        raised_at=now,
        details={k: bounded(v) if isinstance(v, str) else v for k, v in (details or {}).items()},
    )
    # %r and shown(): an id or a reason from a message may hold control characters (a NUL, a newline, an ANSI escape);
    # they are written as escapes, never as a new log line.
    log.error(
        "operator alert %s for order %r: %s",
        kind.value,
        order_id,
        shown(alert.reason),
        extra={"alert_kind": kind.value, "order_id": order_id},
    )
    telemetry.count_alert(kind.value)
    telemetry.alert_event(kind.value, order_id, alert.reason)
    await _send(bus, queue, alert.to_json(), message_id=alert.message_id(), session_id=None, subject="OperatorAlert")
    return alert


async def send_agent_request(bus: BusClient, queue: str, request: AgentRequest) -> None:
    """The request's trace context rides twice: in its `traceparent` field and in the application properties."""
    await _send(
        bus,
        queue,
        request.to_json(),
        message_id=request.message_id(),
        session_id=request.order_id,
        subject="AgentRequest",
        traceparent=request.traceparent,
    )
