"""Agent replies trigger: agent-replies (sessions) → `raise_event` to the named Scheduler instance.

The event name is stable per step (`AgentReply:<step>`). Every reply ends in exactly one of three ways:
- **Raised** (the Durable HTTP API answers 202).
- **Completed without raising**, because it can never be used (`orderflow.replies.check_reply`, checked before any
  HTTP call, or a raise refused for good: `RaiseEventRejected:400`): completed with an operator alert naming the
  field; an unknown or completed instance (404 / 410) is a late reply, logged and completed without an alert.
- **Retried** (the function raises; the message is redelivered): only a failure that may pass — the host
  unreachable, a timeout, a 5xx, 408 or 429 — or an answer whose status the client could not read.
The reasons an unusable reply gets: docs/modules-product.md."""

from __future__ import annotations

import logging

import azure.durable_functions as df
import azure.functions as func

from orderflow import function_names as fn
from orderflow import tracing
from orderflow.messages import AlertKind, reply_event_name
from orderflow.outbound import about_message, raise_alert
from orderflow.replies import RaiseOutcome, UnusableReply, check_reply, classify_raise_error
from orderflow.runtime import get_services

bp = df.Blueprint()
log = logging.getLogger("orderflow.agent_replies")


@bp.function_name(fn.AGENT_REPLIES)
@bp.service_bus_queue_trigger(
    arg_name="message",
    queue_name="%AgentRepliesQueueName%",
    connection="ServiceBusConnection",
    is_sessions_enabled=True,
)
@bp.durable_client_input(client_name="client")
async def agent_replies(message: func.ServiceBusMessage, client: df.DurableOrchestrationClient) -> None:
    # The span `orderflow.agent_reply` joins the order's trace: the message's `traceparent` application property,
    # else the reply's own field (orderflow/tracing.py).
    properties = getattr(message, "application_properties", None)
    try:
        reply = check_reply(message.get_body(), message.session_id)
    except UnusableReply as unusable:
        with tracing.span(
            "orderflow.agent_reply",
            parent=properties,
            kind=tracing.SpanKind.CONSUMER,
            attributes=tracing.order_attributes(message.session_id),
        ):
            await _unusable(message, unusable)
        return
    with tracing.span(
        "orderflow.agent_reply",
        parent=properties,
        fallback=reply.traceparent,
        kind=tracing.SpanKind.CONSUMER,
        attributes=tracing.order_attributes(reply.order_id, reply.instance_id, reply.step.value),
    ):
        try:
            await raise_event_outcome(client, reply.instance_id, reply_event_name(reply.step.value), reply.to_dict())
        except UnusableReply as unusable:
            await _unusable(message, unusable)


async def _unusable(message: func.ServiceBusMessage, unusable: UnusableReply) -> None:
    """Complete a reply that can never be raised, with an operator alert naming the field."""
    services = await get_services()
    where = about_message(
        services.tunables.agent_replies_queue, message.message_id, message.session_id, message.sequence_number
    )
    log.warning(
        "agent reply %r completed without raising: %s: %s", message.message_id, unusable.reason, unusable.description
    )
    await raise_alert(
        services.bus,
        services.tunables.alerts_queue,
        kind=AlertKind.POISON_MESSAGE,
        order_id=message.session_id,
        reason=unusable.reason,
        now=services.clock.now(),
        details={"description": unusable.description, **where},
    )


async def raise_event_outcome(
    client: df.DurableOrchestrationClient, instance_id: str, event_name: str, data: object
) -> RaiseOutcome:
    """Raise the event through the real client and say how it ended (raised or late); raise UnusableReply for an
    answer that can never succeed, and re-raise everything that may pass on a redelivery."""
    try:
        await client.raise_event(instance_id, event_name, data)
    except Exception as exc:  # the client raises a plain Exception per status (see classify_raise_error)
        outcome = classify_raise_error(exc)  # raises UnusableReply for an answer that can never succeed
        if outcome is RaiseOutcome.LATE:
            log.info("late reply for %r (%s) ignored: %s", instance_id, event_name, exc)
            return outcome
        raise  # RaiseOutcome.TRANSIENT: the message is redelivered
    return RaiseOutcome.RAISED
