"""Agent replies trigger: agent-replies (sessions) → `raise_event` to the named Scheduler instance.

The event name is stable per step (`AgentReply:<step>`). An unknown or completed instance (the Durable HTTP API's 404
or 410, raised by the client as an exception) means a late reply — for example attempt 1 answering after the
Supervisor started attempt 2 — and is logged and completed, never retried in a loop. A reply that is not valid JSON
of the AgentReply schema is a poison message: an operator alert, then completed.
"""

from __future__ import annotations

import logging

import azure.durable_functions as df
import azure.functions as func
from pydantic import ValidationError

from orderflow import function_names as fn
from orderflow.messages import AgentReply, AlertKind, reply_event_name
from orderflow.outbound import raise_alert
from orderflow.runtime import get_services

bp = df.Blueprint()
log = logging.getLogger("orderflow.agent_replies")

# The real client's messages for 410 and 404 (azure/durable_functions/models/DurableOrchestrationClient.py raise_event).
LATE_REPLY_MARKERS = ("is gone: either completed or failed", "No instance with ID")


@bp.function_name(fn.AGENT_REPLIES)
@bp.service_bus_queue_trigger(arg_name="message", queue_name="%AgentRepliesQueueName%",
                              connection="ServiceBusConnection", is_sessions_enabled=True)
@bp.durable_client_input(client_name="client")
async def agent_replies(message: func.ServiceBusMessage, client: df.DurableOrchestrationClient) -> None:
    try:
        reply = AgentReply.model_validate_json(message.get_body())
    except ValidationError as exc:
        services = await get_services()
        await raise_alert(services.bus, services.tunables.alerts_queue, kind=AlertKind.POISON_MESSAGE,
                          order_id=message.session_id, reason="InvalidAgentReply", now=services.clock.now(),
                          details={"messageId": message.message_id, "error": str(exc.errors()[0])})
        return
    try:
        await client.raise_event(reply.instance_id, reply_event_name(reply.step.value), reply.to_dict())
    except Exception as exc:  # the client raises a plain Exception for 404/410
        if any(marker in str(exc) for marker in LATE_REPLY_MARKERS):
            log.info("late reply for %s step %s ignored: %s", reply.instance_id, reply.step.value, exc)
            return
        raise
