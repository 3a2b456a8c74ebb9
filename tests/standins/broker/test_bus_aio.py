"""The aio client (`orderflow.embedded.client_aio`) mirrors `azure.servicebus.aio` for the same subset:
send/receive/settle, sessions and state, dead-lettering, NEXT_AVAILABLE_SESSION timeout, event-driven waits.
Sources as in the sync tests; SDK: azure/servicebus/aio/_servicebus_receiver_async.py."""

from __future__ import annotations

import asyncio
import time

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusSubQueue
from azure.servicebus.exceptions import MessageLockLostError, OperationTimeoutError

from orderflow.embedded.client import ServiceBusMessage
from orderflow.embedded.client_aio import ServiceBusAdministrationClient, ServiceBusClient

SHORT = 0.05


@pytest.fixture
async def aclient(broker):
    async with ServiceBusClient(broker) as c:
        yield c


async def test_send_receive_complete_and_dead_letter(aclient, queue):
    q = queue()
    async with aclient.get_queue_sender(q) as sender:
        await sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
    async with aclient.get_queue_receiver(q) as receiver:
        first, second = await receiver.receive_messages(5, max_wait_time=SHORT)
        await receiver.complete_message(first)
        await receiver.dead_letter_message(second, reason="bad", error_description="why")
    async with aclient.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        [dead] = await dlq.receive_messages(max_wait_time=SHORT)
    assert (str(dead), dead.dead_letter_reason, dead.dead_letter_error_description) == ("b", "bad", "why")


async def test_lock_lost_raises_sdk_exception(aclient, queue, clock):
    q = queue(lock_duration="PT10S")
    await aclient.get_queue_sender(q).send_messages(ServiceBusMessage("a"))
    receiver = aclient.get_queue_receiver(q)
    [msg] = await receiver.receive_messages(max_wait_time=SHORT)
    clock.advance(10)
    with pytest.raises(MessageLockLostError):
        await receiver.complete_message(msg)
    await receiver.close()


async def test_sessions_state_and_next_available(aclient, queue):
    q = queue(requires_session=True)
    await aclient.get_queue_sender(q).send_messages([ServiceBusMessage(b, session_id="S") for b in ("1", "2")])
    async with aclient.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=SHORT) as receiver:
        assert receiver.session.session_id == "S"
        await receiver.session.set_state(b"half")
        messages = await receiver.receive_messages(5, max_wait_time=SHORT)
        assert [str(m) for m in messages] == ["1", "2"]
        for m in messages:
            await receiver.complete_message(m)
        assert await receiver.session.get_state() == b"half"
        assert await receiver.session.renew_lock() is not None
    with pytest.raises(OperationTimeoutError):  # retry_total=0: without the SDK's retries (test_bus_sdk_parity.py)
        async with aclient.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=SHORT, retry_total=0):
            pass


async def test_waiting_receive_does_not_block_the_loop_and_wakes_on_send(tmp_path):
    from orderflow.embedded.broker import EmbeddedBroker

    broker = EmbeddedBroker(tmp_path / "bus.db")  # real clock
    broker.declare_queue("q")
    async with ServiceBusClient(broker) as client:
        receiver = client.get_queue_receiver("q")
        started = time.monotonic()
        waiting = asyncio.create_task(receiver.receive_messages(max_wait_time=30))
        await asyncio.sleep(0)  # let it start; the send below may land before or during its wait
        await client.get_queue_sender("q").send_messages(ServiceBusMessage("ping"))
        [msg] = await asyncio.wait_for(waiting, timeout=5)
        assert str(msg) == "ping" and time.monotonic() - started < 1.0
        await receiver.complete_message(msg)
    broker.close()


async def test_async_iteration_stops_after_max_wait_time(aclient, queue):
    q = queue()
    await aclient.get_queue_sender(q).send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
    async with aclient.get_queue_receiver(q, max_wait_time=SHORT) as receiver:
        bodies = []
        async for msg in receiver:
            bodies.append(str(msg))
            await receiver.complete_message(msg)
    assert bodies == ["a", "b"]


async def test_admin_runtime_properties(broker, aclient, queue):
    q = queue()
    await aclient.get_queue_sender(q).send_messages(ServiceBusMessage("a"))
    props = await ServiceBusAdministrationClient(broker).get_queue_runtime_properties(q)
    assert props.active_message_count == 1
