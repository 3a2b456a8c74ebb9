"""End to end on the embedded broker: the lead's ServiceBusTriggerRunner delivers, a function written against
the SDK-type binding settles through the real ServiceBusMessageActions client, the broker shows the result."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusSubQueue
from azurefunctions.extensions.bindings.servicebus import ServiceBusMessageActions
from support.servicebus_sdk import HostLoop

from devhost.config import ServiceBusOptions
from devhost.sdk_servicebus import DeliveryRegistry, SettlementServer, to_sdk_message
from devhost.servicebus_trigger import Delivery, ServiceBusTriggerRunner
from orderflow.embedded.broker import EmbeddedBroker
from orderflow.embedded.client_aio import ServiceBusClient, ServiceBusMessage

WAIT_S = 30.0  # bound on every wait below; the tests finish in well under a second
OPTIONS = ServiceBusOptions(
    max_concurrent_calls=1,
    max_concurrent_sessions=1,
    session_idle_timeout_s=1.0,
    max_auto_lock_renewal_s=60.0,
)


@pytest.fixture
def bus(tmp_path: Path, host_loop: HostLoop) -> Iterator[tuple[ServiceBusClient, str]]:
    broker = EmbeddedBroker(tmp_path / "bus.db")
    queue = f"orders-{uuid.uuid4().hex[:8]}"  # fresh queue per test
    broker.declare_queue(queue, max_delivery_count=5)
    client = ServiceBusClient(broker)
    yield client, queue
    host_loop.run(client.close())
    broker.close()


def _serve_one(
    host_loop: HostLoop,
    client: ServiceBusClient,
    queue: str,
    registry: DeliveryRegistry,
    function: Callable[[Any], None],
    *,
    session_id: str | None = None,
    inspect: Callable[[Delivery], Awaitable[None]] | None = None,
) -> Delivery:
    """Send one message, run the runner until the function returned once; return the delivery it handled.
    `inspect(delivery)` runs on the host loop right after the function, while the runner holds the lock."""
    done: list[Delivery] = []
    stop = asyncio.Event()  # set from on_done (on the host loop) so the runner takes no second message

    def on_done(delivery: Delivery) -> None:
        registry.remove(delivery)
        done.append(delivery)
        stop.set()

    async def invoke(delivery: Delivery) -> None:
        # A sync function runs off the host loop (as the worker's thread pool does); the settlement it makes
        # needs the loop free to reach the receiver.
        await asyncio.to_thread(function, to_sdk_message(delivery.message))
        if inspect is not None:
            await inspect(delivery)

    async def main() -> None:
        async with client.get_queue_sender(queue) as sender:
            await sender.send_messages(ServiceBusMessage('{"orderId": "o-1"}', message_id="o-1", session_id=session_id))
        runner = ServiceBusTriggerRunner(
            "submit",
            queue,
            client=client,
            sessions=session_id is not None,
            auto_complete=False,
            options=OPTIONS,
            invoke=invoke,
            on_delivery=registry.add,
            on_done=on_done,
        )
        await asyncio.wait_for(runner.run(stop), WAIT_S)

    host_loop.run(main(), timeout=WAIT_S * 2)
    assert done, "the runner did not deliver the message"
    return done[0]


async def _drain(client: ServiceBusClient, queue: str, sub_queue: ServiceBusSubQueue | None = None) -> list[Any]:
    async with client.get_queue_receiver(queue, sub_queue=sub_queue) as receiver:
        return await receiver.receive_messages(max_message_count=10, max_wait_time=0.2)


def test_deadletter_via_message_actions_reaches_the_dlq_with_reason_and_description(
    host_loop: HostLoop,
    registry: DeliveryRegistry,
    settlement: SettlementServer,
    bus: tuple[ServiceBusClient, str],
) -> None:
    client, queue = bus

    def function(msg: Any) -> None:  # the app's code, unchanged from Azure
        ServiceBusMessageActions.get_instance().deadletter(
            msg,
            deadletter_reason="ConflictingOrder",
            deadletter_error_description="o-1 resubmitted with other data",
        )

    delivery = _serve_one(host_loop, client, queue, registry, function)
    assert delivery.settled

    dead = host_loop.run(_drain(client, queue, ServiceBusSubQueue.DEAD_LETTER))
    assert [m.message_id for m in dead] == ["o-1"]
    assert dead[0].dead_letter_reason == "ConflictingOrder"
    assert dead[0].dead_letter_error_description == "o-1 resubmitted with other data"
    assert host_loop.run(_drain(client, queue)) == []


def test_complete_via_message_actions_removes_the_message(
    host_loop: HostLoop,
    registry: DeliveryRegistry,
    settlement: SettlementServer,
    bus: tuple[ServiceBusClient, str],
) -> None:
    client, queue = bus
    delivery = _serve_one(
        host_loop, client, queue, registry, lambda msg: ServiceBusMessageActions.get_instance().complete(msg)
    )
    assert delivery.settled
    assert host_loop.run(_drain(client, queue)) == []
    assert host_loop.run(_drain(client, queue, ServiceBusSubQueue.DEAD_LETTER)) == []


def test_abandon_via_message_actions_redelivers_with_a_higher_delivery_count(
    host_loop: HostLoop,
    registry: DeliveryRegistry,
    settlement: SettlementServer,
    bus: tuple[ServiceBusClient, str],
) -> None:
    client, queue = bus
    first = _serve_one(
        host_loop, client, queue, registry, lambda msg: ServiceBusMessageActions.get_instance().abandon(msg)
    )
    again = host_loop.run(_drain(client, queue))
    assert [m.message_id for m in again] == ["o-1"]
    assert again[0].delivery_count == first.message.delivery_count + 1


def test_session_state_set_by_the_function_is_stored_on_the_session(
    host_loop: HostLoop, registry: DeliveryRegistry, settlement: SettlementServer, tmp_path: Path
) -> None:
    broker = EmbeddedBroker(tmp_path / "sessions.db")
    queue = f"agent-requests-{uuid.uuid4().hex[:8]}"
    broker.declare_queue(queue, requires_session=True)
    client = ServiceBusClient(broker)

    def function(msg: Any) -> None:
        actions = ServiceBusMessageActions.get_instance()
        actions.set_session_state(msg.session_id, b"step-2")
        actions.complete(msg)

    states: list[bytes | None] = []

    async def session_state(delivery: Delivery) -> None:
        states.append(await delivery.receiver.session.get_state())

    try:
        delivery = _serve_one(host_loop, client, queue, registry, function, session_id="o-1", inspect=session_state)
    finally:
        host_loop.run(client.close())
        broker.close()
    assert delivery.settled
    assert states == [b"step-2"]
