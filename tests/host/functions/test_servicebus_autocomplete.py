"""autoCompleteMessages for a plain (`func.ServiceBusMessage`) Service Bus trigger: the message is completed when the
function returns and abandoned when it raises.

Sources: host.json reference for Service Bus (learn.microsoft.com/azure/azure-functions/functions-bindings-service-bus
#hostjson-settings): `autoCompleteMessages`, default true, "whether the trigger should automatically complete the
message after a successful execution"; the extension hands the function to a `ServiceBusProcessor` with
`AutoCompleteMessages` (Microsoft.Azure.WebJobs.Extensions.ServiceBus, ServiceBusListener / MessageProcessor in
azure-sdk-for-net), which completes the message when the handler returns and abandons it when the handler throws
(Azure.Messaging.ServiceBus ServiceBusProcessorOptions.AutoCompleteMessages).

The runner runs on the embedded broker with an injected clock, so "after the lock expired" is a clock move, not a wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import azure.functions as func
from azure.servicebus import ServiceBusMessage

from devhost.config import HostConfig
from devhost.servicebus_trigger import Delivery, ServiceBusTriggerRunner, function_message
from orderflow.adapters import aio_bus_from_connection_string
from orderflow.embedded.broker import EmbeddedBroker

QUEUE = "plain"
LOCK = timedelta(seconds=30)
WAIT = 20.0  # bound of every wait; a passing test never gets near it


class ManualClock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


async def _run_once(
    tmp_path: Path, clock: ManualClock, function: Callable[[func.ServiceBusMessage], None], body: str
) -> tuple[EmbeddedBroker, list[func.ServiceBusMessage]]:
    """Send one message, let a plain auto-completing trigger runner handle exactly one delivery of it, stop the
    runner once that delivery is settled (on_done runs after the settlement); return a view of the broker."""
    client = aio_bus_from_connection_string(f"Endpoint=embedded://{tmp_path / 'bus.db'}", clock=clock)
    client.broker.declare_queue(QUEUE, lock_duration=LOCK, max_delivery_count=5)
    async with client.get_queue_sender(QUEUE) as sender:
        await sender.send_messages(ServiceBusMessage(body, message_id="m-1"))
    seen: list[func.ServiceBusMessage] = []
    stop = asyncio.Event()

    async def invoke(delivery: Delivery) -> None:  # what Host._start_service_bus does for a plain binding
        message = function_message(delivery.message)
        seen.append(message)
        function(message)

    options = HostConfig(app_dir=tmp_path, host_json={"extensions": {"serviceBus": {"maxConcurrentCalls": 1}}})
    runner = ServiceBusTriggerRunner(
        "plain_fn",
        QUEUE,
        client=client,
        sessions=False,
        auto_complete=True,
        options=options.service_bus_options(),
        invoke=invoke,
        on_done=lambda delivery: stop.set(),
    )
    try:
        await asyncio.wait_for(runner.run(stop), WAIT)
    finally:
        await client.close()
    return EmbeddedBroker(tmp_path / "bus.db", clock=clock), seen


async def test_a_message_is_completed_when_the_function_returns(tmp_path: Path) -> None:
    clock = ManualClock()
    broker, seen = await _run_once(tmp_path, clock, lambda msg: None, "fine")
    assert [m.message_id for m in seen] == ["m-1"] and seen[0].delivery_count == 1
    counts = broker.counts(QUEUE)
    assert (counts.active, counts.locked, counts.dead_lettered) == (0, 0, 0)  # completed: gone, not just locked
    clock.now += LOCK + timedelta(seconds=1)  # an unsettled message would now be delivered again
    counts = broker.counts(QUEUE)
    assert (counts.total, counts.locked) == (0, 0)
    assert broker.peek(QUEUE, 0, 10) == []
    broker.close()


async def test_a_message_is_abandoned_when_the_function_raises(tmp_path: Path) -> None:
    def fail(msg: func.ServiceBusMessage) -> None:
        raise RuntimeError("asked to fail")

    clock = ManualClock()
    broker, seen = await _run_once(tmp_path, clock, fail, "fail")
    assert len(seen) == 1 and seen[0].delivery_count == 1
    counts = broker.counts(QUEUE)
    # Abandoned: available again at once (no lock held until LockDuration), its delivery counted.
    assert (counts.active, counts.locked, counts.dead_lettered) == (1, 0, 0)
    client = aio_bus_from_connection_string(f"Endpoint=embedded://{tmp_path / 'bus.db'}", clock=clock)
    async with client, client.get_queue_receiver(QUEUE) as receiver:
        [again] = await receiver.receive_messages(max_message_count=1, max_wait_time=WAIT)
        assert again.message_id == "m-1" and again.delivery_count == 1  # the SDK counts prior deliveries
        await receiver.complete_message(again)
    broker.close()
