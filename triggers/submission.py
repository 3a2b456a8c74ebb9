"""Submission triggers: each app's inbound queue (sessions, SessionId = orderId) → orders DB + state store, then the
fast path. One path, registered per queue: `submission-<app>` on `<app>-orders`, and `submission` on the shared
`orders-inbound` for LegacyOrdersApp; the app is the queue's, never the message's (orderflow/apps.py). The apps come
from the app setting SubmittingApps when the worker indexes the app (a settings change restarts it).
The SDK-type binding (`auto_complete_messages=False`) lets a poison or conflicting order be dead-lettered with a
reason that names the field; settlement runs in a worker thread. Transient failures are retried inside the delivery
for up to 4 minutes (`receive_patiently`), then the message is abandoned; each write is idempotent, so a redelivery
repairs a half-done submission. Span: `orderflow.submission`. Why the SDK-type binding: docs/modules-product.md."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import azure.durable_functions as df
import azurefunctions.extensions.bindings.servicebus as servicebus

from orderflow import admission, apps, settings, tracing
from orderflow import function_names as fn
from orderflow.runtime import Services, get_services, submitting_apps
from orderflow.starter import StarterRun, start_attempt, start_one
from orderflow.submission import Accepted, CancelDone, CancelTooLate, Inbound, Refused, receive_patiently
from orderflow.text import bounded, shown
from orderflow.workflow import CANCEL_EVENT

bp = df.Blueprint()
log = logging.getLogger("orderflow.submission")


# Each registered submission function by name (the host's function name), for tests that invoke one as the host does.
REGISTERED: dict[str, Any] = {}


def _register(function_name: str, queue_name: str, source: Callable[[Services], Inbound]) -> None:
    """Register the one submission path on `queue_name` as `function_name`, for the app `source` names."""

    @bp.function_name(function_name)
    @bp.service_bus_queue_trigger(
        arg_name="message",
        queue_name=queue_name,
        connection=settings.SERVICE_BUS_CONNECTION,
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
        await _submission(services, source(services), message, message_actions, client)

    REGISTERED[function_name] = submission


def _register_all(submitting: apps.SubmittingApps) -> None:
    for app in submitting.names:
        _register(fn.submission_of(app), apps.inbound_queue(app), _own_queue_of(app))
    if submitting.legacy is not None:
        _register(fn.SUBMISSION, "%OrdersQueueName%", Inbound.shared)


def _own_queue_of(app: str) -> Callable[[Services], Inbound]:
    def source(services: Services) -> Inbound:
        return Inbound.of_app(app)

    return source


async def _submission(
    services: Services,
    source: Inbound,
    message: servicebus.ServiceBusReceivedMessage,
    message_actions: servicebus.ServiceBusMessageActions,
    client: df.DurableOrchestrationClient,
) -> None:
    # MessageId/SessionId as the binding decoded them, and the SequenceNumber (exact: the dead-lettered message
    # keeps it) for the alert. None stays None (str(None) would name a message "None").
    message_id = None if message.message_id is None else str(message.message_id)
    attributes = {
        **tracing.order_attributes(message.session_id),
        "messaging.system": "servicebus",
        "messaging.destination.name": source.queue,
        "orderflow.app": source.app,
    }
    with tracing.span(
        "orderflow.submission",
        parent=getattr(message, "application_properties", None),
        kind=tracing.SpanKind.CONSUMER,
        attributes=attributes,
    ):
        await _handle(services, source, message, message_id, message_actions, client)


async def _handle(
    services: Services,
    source: Inbound,
    message: servicebus.ServiceBusReceivedMessage,
    message_id: str | None,
    message_actions: servicebus.ServiceBusMessageActions,
    client: df.DurableOrchestrationClient,
) -> None:
    body = b"".join(message.body)
    try:
        outcome = await receive_patiently(
            services, body, message.session_id, message_id, message.sequence_number, claim=True, source=source
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
    # record from an earlier delivery) claim it now, unless another app's orders wait: then the Starter's round-robin
    # shares the slots that free (orderflow/admission.py), so a stream of one app's orders cannot jump ahead of
    # another's. The Starter's timer poll is the safety net if this fails, and the Supervisor starts a claim whose
    # start_new never happened (orderflow/starter.py).
    try:
        if outcome.claimed is not None:
            await start_attempt(client.start_new, outcome.claimed, StarterRun())
        elif not admission.others_waiting(services, source.app):
            await start_one(services, client.start_new, outcome.key)
    except Exception:
        log.exception("fast-path start of %s failed; the Starter poll will pick it up", outcome.key)


_register_all(submitting_apps())
submission = REGISTERED.get(fn.SUBMISSION)  # the shared queue's trigger (the legacy app's), when registered
