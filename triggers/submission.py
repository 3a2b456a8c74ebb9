"""Submission trigger: orders-inbound (sessions, SessionId = orderId) → orders DB + state store, then the fast path.

Uses the Service Bus SDK-type binding (`azurefunctions-extensions-bindings-servicebus`) with
`auto_complete_messages=False`, so a poison or conflicting order is dead-lettered with a reason that names the field.
Settlement runs in a worker thread (`asyncio.to_thread`). Transient failures are retried inside the delivery for up
to 4 minutes (`receive_patiently`), then the message is abandoned and redelivered; each write is idempotent, so a
retry or a redelivery repairs a half-done submission. Each message is handled in the span `orderflow.submission`,
the root of the order's trace (or a child of the client's). Why the SDK-type binding: docs/modules-product.md."""

from __future__ import annotations

import asyncio
import logging

import azure.durable_functions as df
import azurefunctions.extensions.bindings.servicebus as servicebus

from orderflow import function_names as fn
from orderflow import tracing
from orderflow.runtime import Services, get_services
from orderflow.starter import StarterRun, start_attempt, start_one
from orderflow.submission import Accepted, CancelDone, CancelTooLate, Refused, receive_patiently
from orderflow.text import bounded, shown
from orderflow.workflow import CANCEL_EVENT

bp = df.Blueprint()
log = logging.getLogger("orderflow.submission")


@bp.function_name(fn.SUBMISSION)
@bp.service_bus_queue_trigger(
    arg_name="message",
    queue_name="%OrdersQueueName%",
    connection="ServiceBusConnection",
    is_sessions_enabled=True,
    auto_complete_messages=False,
)
@bp.durable_client_input(client_name="client")
async def submission(
    message: servicebus.ServiceBusReceivedMessage,
    message_actions: servicebus.ServiceBusMessageActions,
    client: df.DurableOrchestrationClient,
) -> None:
    services = await get_services()
    # MessageId/SessionId as the binding decoded them, and the SequenceNumber (exact: the dead-lettered message
    # keeps it) for the alert. None stays None (str(None) would name a message "None").
    message_id = None if message.message_id is None else str(message.message_id)
    attributes = {
        **tracing.order_attributes(message.session_id),
        "messaging.system": "servicebus",
        "messaging.destination.name": services.tunables.orders_queue,
    }
    with tracing.span(
        "orderflow.submission",
        parent=getattr(message, "application_properties", None),
        kind=tracing.SpanKind.CONSUMER,
        attributes=attributes,
    ):
        await _handle(services, message, message_id, message_actions, client)


async def _handle(
    services: Services,
    message: servicebus.ServiceBusReceivedMessage,
    message_id: str | None,
    message_actions: servicebus.ServiceBusMessageActions,
    client: df.DurableOrchestrationClient,
) -> None:
    body = b"".join(message.body)
    try:
        outcome = await receive_patiently(
            services, body, message.session_id, message_id, message.sequence_number, claim=True
        )
    except Exception:
        await asyncio.to_thread(message_actions.abandon, message)
        raise
    if isinstance(outcome, CancelDone | CancelTooLate):
        await asyncio.to_thread(message_actions.complete, message)
        if isinstance(outcome, CancelDone) and outcome.tell:
            # The record already says so; the event only makes the running attempt stop sooner. An instance that
            # has finished or not started yet (404/410) honours the record at its next decision point.
            try:
                await client.raise_event(outcome.tell, CANCEL_EVENT, {"orderId": outcome.order_id})
            except Exception:  # noqa: BLE001 - the record carries the cancel; the event only makes it sooner
                log.warning(
                    "cancel of %s: event to %s not delivered; the record carries it", outcome.order_id, outcome.tell
                )
        return
    if isinstance(outcome, Refused):
        # Admission control: answered `rejected` on the app's reply queue, nothing written. A decision, not poison:
        # the message is completed, never dead-lettered.
        log.info("order %s refused: %s", outcome.order.order_id, outcome.reason)
        await asyncio.to_thread(message_actions.complete, message)
        return
    if not isinstance(outcome, Accepted):
        # Sender-chosen text, escaped (orderflow/text.py): a MessageId or reason cannot forge a log line. The reason
        # and description are within Service Bus's 4,096 characters already (submission._reject); bounded again
        # here, where the limit applies.
        log.warning("dead-lettering message %r: %s: %s", message_id, shown(outcome.reason), shown(outcome.description))
        await asyncio.to_thread(
            message_actions.deadletter,
            message,
            deadletter_reason=bounded(outcome.reason),
            deadletter_error_description=bounded(outcome.description),
        )
        return
    await asyncio.to_thread(message_actions.complete, message)
    # Fast path: start at once — the record was created claimed (one write), or else (no slot at creation, a Pending
    # record from an earlier delivery) claim it now. The Starter's timer poll is the safety net if this fails, and
    # the Supervisor starts a claim whose start_new never happened (orderflow/starter.py).
    try:
        if outcome.claimed is not None:
            await start_attempt(client.start_new, outcome.claimed, StarterRun())
        else:
            await start_one(services, client.start_new, outcome.order.order_id)
    except Exception:
        log.exception("fast-path start of %s failed; the Starter poll will pick it up", outcome.order.order_id)
