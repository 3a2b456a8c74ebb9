"""Run the registered submission trigger on one delivered orders-inbound message, as the host hands it over (the
SDK-type message, decoded while locked), with ServiceBusMessageActions that refuse what the host's SDK refuses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from azure.servicebus import ServiceBusMessage

from devhost.sdk_servicebus import to_sdk_message
from orderflow import runtime
from orderflow.text import DEAD_LETTER_TEXT_MAX, utf16_length
from support.integration_support import Pipeline
from support.replies_support import ScriptedDurableApi
from triggers import submission as submission_trigger


class RecordingActions:
    """ServiceBusMessageActions in the submission trigger's hands: records each settlement as (kind, kwargs), refusing
    what the host's SDK refuses (a dead-letter reason or description past 4,096 UTF-16 code units: Azure.Messaging.
    ServiceBus AmqpReceiver.DeadLetterInternalAsync, as orderflow/text.py and devhost's Settlement service cite)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def complete(self, message: Any) -> None:
        self.calls.append(("complete", {}))

    def abandon(self, message: Any) -> None:
        self.calls.append(("abandon", {}))

    def deadletter(self, message: Any, **kwargs: Any) -> None:
        for name in ("deadletter_reason", "deadletter_error_description"):
            if utf16_length(kwargs.get(name) or "") > DEAD_LETTER_TEXT_MAX:
                raise ValueError(f"The argument '{name}' cannot exceed {DEAD_LETTER_TEXT_MAX} characters.")
        self.calls.append(("deadletter", kwargs))


@dataclass
class Delivered:
    """One orders-inbound message run through the submission trigger: the broker's message, the SDK-type message the
    trigger got, and what the trigger settled."""

    received: Any
    sdk_message: Any
    actions: RecordingActions


async def run_submission_trigger(p: Pipeline, body: bytes, session_id: str, message_id: str) -> Delivered:
    """Send `body` to orders-inbound, receive it as the host hands it over (decoded while locked), and run the
    registered submission trigger on it."""
    async with p.services.bus.get_queue_sender("orders-inbound") as sender:
        await sender.send_messages(ServiceBusMessage(body, session_id=session_id, message_id=message_id))
    async with p.services.bus.get_queue_receiver("orders-inbound", session_id=session_id) as receiver:
        [received] = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
        sdk_message = to_sdk_message(received)
        await receiver.complete_message(received)
    actions = RecordingActions()
    runtime.use_services(p.services)
    try:
        handler = submission_trigger.submission._function.get_user_function()  # type: ignore[attr-defined]
        await handler(
            message=sdk_message, message_actions=actions, client=ScriptedDurableApi(base="http://127.0.0.1:9").binding()
        )
    finally:
        runtime.reset_services()
    return Delivered(received, sdk_message, actions)
