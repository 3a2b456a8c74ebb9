"""Support for driving the agent_replies trigger: a scripted Durable HTTP API for the real client, and replies
delivered through the embedded broker as the worker hands them to the function."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import azure.functions as func
from aiohttp import web
from azure.servicebus import ServiceBusMessage

from devhost.servicebus_trigger import function_message
from support.integration_support import Pipeline

REPLIES_QUEUE = "agent-replies"


@dataclass
class ScriptedDurableApi:
    """An HTTP server in the Durable API's place: answers every request with `answer`, records each path."""

    answer: tuple[int, bytes, str | None] = (202, b"", None)
    requests: list[str] = field(default_factory=list)
    base: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request.raw_path)
        status, body, content_type = self.answer
        return web.Response(status=status, body=body, content_type=content_type)

    def binding(self) -> str:
        """The durableClient binding data the host passes (DurableOrchestrationBindings JSON); the SDK's
        middleware turns it into the real DurableOrchestrationClient."""
        base = f"{self.base}/runtime/webhooks/durabletask"
        instance = f"{base}/instances/INSTANCEID"
        return json.dumps(
            {
                "taskHubName": "hub",
                "creationUrls": {
                    "createNewInstancePostUri": f"{base}/orchestrators/{{functionName}}",
                    "createAndWaitOnNewInstancePostUri": f"{base}/orchestrators/{{functionName}}",
                },
                "managementUrls": {
                    "id": "INSTANCEID",
                    "statusQueryGetUri": instance,
                    "sendEventPostUri": f"{instance}/raiseEvent/{{eventName}}",
                    "terminatePostUri": f"{instance}/terminate",
                    "rewindPostUri": f"{instance}/rewind",
                    "purgeHistoryDeleteUri": instance,
                    "restartPostUri": f"{instance}/restart",
                    "suspendPostUri": f"{instance}/suspend",
                    "resumePostUri": f"{instance}/resume",
                },
                "rpcBaseUrl": f"{base}/",
            }
        )


def reply_body(instance_id: str, order_id: str, attempt: int = 1, **overrides: Any) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "type": "AgentReply",
        "instanceId": instance_id,
        "orderId": order_id,
        "attempt": attempt,
        "step": "reserve-inventory",
        "outcome": "succeeded",
        "permanent": False,
        "errorCode": None,
        "error": None,
        "result": {},
        "completedAt": "2026-01-01T00:00:01Z",
        **overrides,
    }


async def deliver(p: Pipeline, body: bytes, *, session_id: str, message_id: str) -> func.ServiceBusMessage:
    """Send a reply to agent-replies and receive it as the trigger does: the worker's func.ServiceBusMessage."""
    async with p.services.bus.get_queue_sender(REPLIES_QUEUE) as sender:
        await sender.send_messages(ServiceBusMessage(body, session_id=session_id, message_id=message_id))
    async with p.services.bus.get_queue_receiver(REPLIES_QUEUE, session_id=session_id) as receiver:
        [received] = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
        await receiver.complete_message(received)
    return function_message(received)
