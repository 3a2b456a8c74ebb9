"""Settlement by a Service Bus trigger when the function returns or raises: with autoCompleteMessages (the default) the
message is completed when the function returns; whatever autoCompleteMessages says, a message the function left
unsettled is abandoned when it raises (available again at once, its delivery counted), and one it settled is left
alone.

Sources: host.json reference for Service Bus (learn.microsoft.com/azure/azure-functions/functions-bindings-service-bus
#hostjson-settings): `autoCompleteMessages`, default true, "whether the trigger should automatically complete the
message after a successful execution". The extension (Microsoft.Azure.WebJobs.Extensions.ServiceBus in
azure-sdk-for-net) hands the function to a `ServiceBusProcessor` (ServiceBusListener `ProcessMessageAsync` /
`ProcessSessionMessageAsync`); after the function, `MessageProcessor.CompleteProcessingMessageAsync` (and
`SessionMessageProcessor`'s) rethrows a failed invocation's exception "so it can handle message state correctly", and
Azure.Messaging.ServiceBus `ReceiverManager.ProcessOneMessage` then abandons every message of the call that is not
settled, in peek-lock mode, unless the error is a lost message or session lock: only the completion on success
depends on `ProcessorOptions.AutoCompleteMessages`.

The runner runs on the embedded broker with an injected clock, so "after the lock expired" is a clock move, not a wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import azure.functions as func
import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage

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
    tmp_path: Path,
    clock: ManualClock,
    function: Callable[[func.ServiceBusMessage], None],
    body: str,
    *,
    auto_complete: bool = True,
    sessions: bool = False,
    settle: Callable[[Delivery], Awaitable[None]] | None = None,
) -> tuple[EmbeddedBroker, list[func.ServiceBusMessage]]:
    """Send one message, let a trigger runner handle exactly one delivery of it, stop the runner once that delivery is
    done (on_done runs after the settlement); return a view of the broker. `settle` runs before the function, as a
    function settling through ServiceBusMessageActions would (the Settlement service marks the delivery settled)."""
    client = aio_bus_from_connection_string(f"Endpoint=embedded://{tmp_path / 'bus.db'}", clock=clock)
    client.broker.declare_queue(QUEUE, lock_duration=LOCK, max_delivery_count=5, requires_session=sessions)
    async with client.get_queue_sender(QUEUE) as sender:
        await sender.send_messages(ServiceBusMessage(body, message_id="m-1", session_id="s-1" if sessions else None))
    seen: list[func.ServiceBusMessage] = []
    stop = asyncio.Event()

    async def invoke(delivery: Delivery) -> None:  # what Host._start_service_bus does for a plain binding
        message = function_message(delivery.message)
        seen.append(message)
        if settle is not None:
            await settle(delivery)
            delivery.settled = True
        function(message)

    options = HostConfig(app_dir=tmp_path, host_json={"extensions": {"serviceBus": {"maxConcurrentCalls": 1}}})
    runner = ServiceBusTriggerRunner(
        "plain_fn",
        QUEUE,
        client=client,
        sessions=sessions,
        auto_complete=auto_complete,
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


def _fail(msg: func.ServiceBusMessage) -> None:
    raise RuntimeError("asked to fail")


def _receiver(client: Any, sessions: bool) -> Any:
    if sessions:
        return client.get_queue_receiver(QUEUE, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=WAIT)
    return client.get_queue_receiver(QUEUE)


@pytest.mark.parametrize("sessions", [False, True], ids=["plain", "sessions"])
@pytest.mark.parametrize("auto_complete", [True, False], ids=["autoComplete", "autoComplete-off"])
async def test_an_unsettled_message_is_abandoned_when_the_function_raises(
    tmp_path: Path, auto_complete: bool, sessions: bool
) -> None:
    # ReceiverManager.ProcessOneMessage abandons it in either case: at once, not when its lock expires.
    clock = ManualClock()
    broker, seen = await _run_once(tmp_path, clock, _fail, "fail", auto_complete=auto_complete, sessions=sessions)
    assert len(seen) == 1 and seen[0].delivery_count == 1
    counts = broker.counts(QUEUE)
    # Abandoned: available again at once (no lock held until LockDuration), its delivery counted.
    assert (counts.active, counts.locked, counts.dead_lettered) == (1, 0, 0)
    client = aio_bus_from_connection_string(f"Endpoint=embedded://{tmp_path / 'bus.db'}", clock=clock)
    async with client, _receiver(client, sessions) as receiver:
        [again] = await receiver.receive_messages(max_message_count=1, max_wait_time=WAIT)
        assert again.message_id == "m-1" and again.delivery_count == 1  # the SDK counts prior deliveries
        await receiver.complete_message(again)
    broker.close()


async def test_a_message_the_function_settled_is_not_abandoned_when_it_raises(tmp_path: Path) -> None:
    # ReceiverManager.ProcessOneMessage: "If the user already settled the message, do not abandon."
    async def dead_letter(delivery: Delivery) -> None:
        await delivery.receiver.dead_letter_message(delivery.message, reason="Poison")

    clock = ManualClock()
    broker, seen = await _run_once(tmp_path, clock, _fail, "poison", auto_complete=False, settle=dead_letter)
    counts = broker.counts(QUEUE)
    assert len(seen) == 1 and (counts.active, counts.locked, counts.dead_lettered) == (0, 0, 1)
    broker.close()


async def test_with_auto_complete_off_a_message_the_function_returned_from_stays_locked(tmp_path: Path) -> None:
    # Only the completion on success depends on AutoCompleteMessages: unsettled, the message is redelivered when its
    # lock expires (the runner stopped renewing it), its delivery counted.
    clock = ManualClock()
    broker, _ = await _run_once(tmp_path, clock, lambda msg: None, "kept", auto_complete=False)
    counts = broker.counts(QUEUE)
    assert (counts.active, counts.locked) == (1, 1)
    clock.now += LOCK + timedelta(seconds=1)
    client = aio_bus_from_connection_string(f"Endpoint=embedded://{tmp_path / 'bus.db'}", clock=clock)
    async with client, client.get_queue_receiver(QUEUE) as receiver:
        [again] = await receiver.receive_messages(max_message_count=1, max_wait_time=WAIT)
        assert again.message_id == "m-1" and again.delivery_count == 1
        await receiver.complete_message(again)
    broker.close()
