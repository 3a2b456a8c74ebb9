"""Agent activity: send one step's request to the Agent on agent-requests (SessionId = orderId).

The MessageId is `<instanceId>:<step>`, stable across activity retries, so duplicate detection absorbs a resend.
"""

from __future__ import annotations

import azure.durable_functions as df

from activities import ActivityInput, traced
from orderflow import function_names as fn
from orderflow import tracing
from orderflow.messages import AgentRequest
from orderflow.outbound import send_agent_request
from orderflow.runtime import get_services

bp = df.Blueprint()


@bp.function_name(fn.SEND_AGENT_REQUEST)
@bp.activity_trigger(input_name="request")
async def send_agent_request_activity(request: ActivityInput) -> str:
    with traced(fn.SEND_AGENT_REQUEST, request):
        services = await get_services()
        message = AgentRequest.model_validate({**request, "replyTo": services.tunables.agent_replies_queue,
                                               "traceparent": tracing.current_traceparent()})
        await send_agent_request(services.bus, services.tunables.agent_requests_queue, message)
        return message.message_id()
