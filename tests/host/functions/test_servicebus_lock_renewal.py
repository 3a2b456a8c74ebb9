"""devhost's Service Bus trigger renews locks as the Functions Service Bus extension does, with 5 s LockDurations.

Source: the extension runs the trigger on Azure.Messaging.ServiceBus processors (azure-sdk-for-net,
sdk/servicebus/Azure.Messaging.ServiceBus/src/Processor): with sessions, `SessionReceiverManager` starts
`RenewSessionLock` when it accepts the session (`CreateAndInitializeSessionReceiver`) and runs it until the session
receiver is closed, idle waits for the next message included, cancelling it after `MaxAutoLockRenewalDuration`
(`cancellationTokenSource.CancelAfter(_processorOptions.MaxAutoLockRenewalDuration)`); without sessions
`ReceiverManager` renews each message's lock while its handler runs, with the same cap (host.json
`maxAutoLockRenewalDuration`). `agent-replies` locks for 5 s (orderflow/session_locks.py: a dead host must block an
order's replies for at most 5 s), so a live host that did not renew would lose an order's session mid-work or
between two of its replies.

The runner runs on the embedded broker with the clock shared by the broker and the renewal: "the function worked
20 s" is 20 clock moves, not a wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import SessionCannotBeLockedError
from support.stepped_clock import SteppedClock

from devhost.config import ServiceBusOptions
from devhost.servicebus_trigger import Delivery, ServiceBusTriggerRunner
from orderflow.adapters import aio_bus_from_connection_string

REPO = Path(__file__).resolve().parents[3]
REPLIES = "agent-replies"  # the product's queue from servicebus.config.json: sessions, LockDuration PT5S
PLAIN = "plain"
LOCK = timedelta(seconds=5)
WAIT = 20.0  # bound of every real-time wait; a passing test never gets near it


@dataclass
class Function:
    """A function that works until the test opens its gate (or at once when `instant`)."""

    instant: bool = False
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    done: list[str] = field(default_factory=list)

    async def __call__(self, delivery: Delivery) -> None:
        await self.started.put(delivery.message.message_id)
        if not self.instant:
            await asyncio.wait_for(self.gate.wait(), WAIT)
        self.done.append(delivery.message.message_id)


@dataclass
class Running:
    client: Any
    clock: SteppedClock
    runner: ServiceBusTriggerRunner
    function: Function

    async def send(self, queue: str, message_id: str, session_id: str | None = None) -> None:
        async with self.client.get_queue_sender(queue) as sender:
            await sender.send_messages(ServiceBusMessage("{}", message_id=message_id, session_id=session_id))

    async def work(self, seconds: int, settle_timeout: float = 2.0) -> None:
        for _ in range(seconds):
            await self.clock.advance(1, settle_timeout)


async def _running(
    tmp_path: Path, *, queue: str, sessions: bool, function: Function, max_renewal_s: float = 300.0
) -> AsyncIterator[Running]:
    clock = SteppedClock()
    conn = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={REPO / 'servicebus.config.json'}"
    client = aio_bus_from_connection_string(conn, clock=clock)
    client.broker.declare_queue(PLAIN, lock_duration=LOCK, max_delivery_count=5)
    # sessionIdleTimeout long enough that the session stays held while the test moves the clock between messages.
    options = ServiceBusOptions(
        max_concurrent_calls=1,
        max_concurrent_sessions=1,
        session_idle_timeout_s=WAIT,
        max_auto_lock_renewal_s=max_renewal_s,
    )
    runner = ServiceBusTriggerRunner(
        "fn", queue, client=client, sessions=sessions, auto_complete=True, options=options, invoke=function, clock=clock
    )
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        yield Running(client, clock, runner, function)
    finally:
        stop.set()
        function.gate.set()
        await asyncio.wait_for(task, WAIT)
        await client.close()


@pytest.fixture
async def replies(tmp_path: Path) -> AsyncIterator[Running]:
    async for running in _running(tmp_path, queue=REPLIES, sessions=True, function=Function()):
        yield running


async def _settled(running: Running, queue: str, processed: int) -> None:
    async with asyncio.timeout(WAIT):
        while running.runner.processed < processed or running.client.broker.counts(queue).total > 0:
            await asyncio.sleep(0.02)


def _held(running: Running, session_id: str) -> bool:
    """Whether another consumer is refused the session (the runner still holds its lock)."""
    try:
        running.client.broker.accept_session(REPLIES, session_id)
    except SessionCannotBeLockedError:
        return True
    return False


async def test_the_session_lock_is_renewed_while_the_function_works(replies: Running) -> None:
    assert replies.client.broker.queue_properties(REPLIES).lock_duration == LOCK
    await replies.send(REPLIES, "r-1", session_id="o-1")
    assert await asyncio.wait_for(replies.function.started.get(), WAIT) == "r-1"
    await replies.work(20)  # four LockDurations
    assert _held(replies, "o-1")
    replies.function.gate.set()
    await _settled(replies, REPLIES, processed=1)
    assert replies.function.done == ["r-1"] and replies.runner.failed == 0  # completed once, never redelivered


async def test_a_held_session_stays_locked_between_two_messages(tmp_path: Path) -> None:
    async for running in _running(tmp_path, queue=REPLIES, sessions=True, function=Function(instant=True)):
        await running.send(REPLIES, "r-1", session_id="o-1")
        await _settled(running, REPLIES, processed=1)
        await running.work(20)  # the host waits for the session's next message (sessionIdleTimeout) and renews
        assert _held(running, "o-1")
        await running.send(REPLIES, "r-2", session_id="o-1")
        await _settled(running, REPLIES, processed=2)
        assert running.function.done == ["r-1", "r-2"] and running.runner.failed == 0


async def test_renewal_stops_after_max_auto_lock_renewal_duration(tmp_path: Path) -> None:
    async for running in _running(tmp_path, queue=REPLIES, sessions=True, function=Function(), max_renewal_s=10):
        await running.send(REPLIES, "r-1", session_id="o-1")
        await asyncio.wait_for(running.function.started.get(), WAIT)
        await running.work(8)
        assert _held(running, "o-1")  # within maxAutoLockRenewalDuration
        await running.work(10, settle_timeout=0.3)  # 18 s: past the 10 s cap plus the last 5 s lock (renewal ended)
        assert not _held(running, "o-1")  # the lock lapsed: another consumer takes the session


async def test_a_plain_message_lock_is_renewed_while_the_function_works(tmp_path: Path) -> None:
    async for running in _running(tmp_path, queue=PLAIN, sessions=False, function=Function()):
        await running.send(PLAIN, "m-1")
        await asyncio.wait_for(running.function.started.get(), WAIT)
        await running.work(20)
        counts = running.client.broker.counts(PLAIN)
        assert (counts.active, counts.locked) == (1, 1)  # still locked by the function: not redelivered
        running.function.gate.set()
        await _settled(running, PLAIN, processed=1)
        assert running.function.done == ["m-1"] and running.function.started.empty()
