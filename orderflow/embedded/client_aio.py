"""Async client of the embedded broker, mirroring `azure.servicebus.aio.ServiceBusClient` (queues only).

A database call runs on the event loop while the broker's writer lock is free (a transaction of well under a
millisecond), else in a worker thread (`asyncio.to_thread`), so a busy lock never stalls the loop (`_run`); waiting
for messages is native to the loop (the receiver's datagram socket), so it is cancellable and idle.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from azure.servicebus import ServiceBusMessageBatch
from azure.servicebus.exceptions import ServiceBusError

from ._connection_string import broker_from_connection_string
from ._core import (
    MESSAGE_DEAD_LETTER,
    SHUTDOWN,
    ClientBase,
    QueueRuntimeProperties,
    ReceiverCore,
    check_entity,
    check_timeout,
)
from ._faulted import guard_async
from ._retry import Attempts, RetryPolicy, Timer
from ._session_view import SessionView
from .broker import EmbeddedBroker
from .broker._base import WriterBusy, inline_first
from .config import QueueProperties
from .message import STANDARD, ServiceBusMessage, ServiceBusReceivedMessage, SizeLimits, envelopes_of, new_batch

__all__ = [
    "ServiceBusAdministrationClient",
    "ServiceBusClient",
    "ServiceBusMessage",
    "ServiceBusReceiver",
    "ServiceBusSender",
    "ServiceBusSession",
]
T = TypeVar("T")


async def _run(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`func` on the loop if its first transaction finds the writer lock free (`inline_first`), else in a thread.
    A hand-off to a thread and back costs two wake-ups and two context switches; most calls never wait. It yields to
    the loop first, as a call to Service Bus always does (what runs meanwhile sees the call in flight)."""
    await asyncio.sleep(0)
    try:
        with inline_first():
            return func(*args, **kwargs)
    except WriterBusy:
        pass
    return await asyncio.to_thread(functools.partial(func, *args, **kwargs))


class ServiceBusClient(ClientBase):
    """Entry point, like `azure.servicebus.aio.ServiceBusClient`, over an `EmbeddedBroker`."""

    # sender_class / receiver_class are set at the end of this module, once those classes exist.

    async def close(self) -> None:
        for handler in list(self._handlers):
            await handler.close()
        self._handlers.clear()
        if self._owns_broker:
            self.broker.close()

    async def __aenter__(self) -> ServiceBusClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # Typed as the aio classes (ClientBase serves both sides), so the client meets `orderflow.ports.BusClient`.
    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> ServiceBusClient:
        client: ServiceBusClient = super().from_connection_string(conn_str, **kwargs)
        return client

    def get_queue_sender(self, queue_name: str, **kwargs: Any) -> ServiceBusSender:
        sender: ServiceBusSender = super().get_queue_sender(queue_name, **kwargs)
        return sender

    def get_queue_receiver(self, queue_name: str, **kwargs: Any) -> ServiceBusReceiver:
        receiver: ServiceBusReceiver = super().get_queue_receiver(queue_name, **kwargs)
        return receiver


class ServiceBusSender:
    """Sends to one queue; a send is durable once `send_messages` returns. As the SDK's, it checks the entity when
    its link opens (`__aenter__` or the first operation, with the SDK's retries), not when it is made."""

    def __init__(self, broker: EmbeddedBroker, queue_name: str, *, timer: Timer, retry: RetryPolicy) -> None:
        self._broker, self.entity_name = broker, queue_name
        self._timer, self._retry = timer, retry
        self._running, self._linked = True, False
        self._limits = STANDARD  # what the link allows, once it is open (the entity's sizes)

    async def _open(self, timeout: float | None = None) -> None:
        """As the sync sender's `_open`."""
        if not self._running:
            raise ValueError(SHUTDOWN)
        check_timeout(timeout)
        attempts = Attempts(self._retry, self._timer, timeout)
        while not self._linked:
            try:
                await guard_async(self._broker, self.entity_name, "open", attempts, self._timer)
                self._limits = SizeLimits.of(await _run(check_entity, self._broker, self.entity_name, claim="Send"))
                self._linked = True
            except ServiceBusError as error:
                await self._timer.sleep_async(attempts.failed(error))

    async def _guard(self, op: str, timeout: float | None) -> None:
        """As the sync sender's `_guard`."""
        attempts = Attempts(self._retry, self._timer, timeout)
        await guard_async(self._broker, self.entity_name, op, attempts, self._timer)

    async def send_messages(self, message: Any, *, timeout: float | None = None, **kwargs: Any) -> None:
        await self._open(timeout)
        envelopes = envelopes_of(message, limits=self._limits)
        if envelopes:
            await self._guard("send", timeout)
            await _run(self._broker.send, self.entity_name, envelopes)

    async def schedule_messages(
        self, messages: Any, schedule_time_utc: datetime, *, timeout: float | None = None, **kwargs: Any
    ) -> list[int]:
        await self._open(timeout)
        envelopes = envelopes_of(messages, schedule_time_utc, self._limits)
        if envelopes:
            await self._guard("schedule-message", timeout)
        numbers = await _run(self._broker.send, self.entity_name, envelopes) if envelopes else []
        return [n for n in numbers if n is not None]

    async def cancel_scheduled_messages(
        self, sequence_numbers: int | Sequence[int], *, timeout: float | None = None, **kwargs: Any
    ) -> None:
        await self._open(timeout)
        numbers = [sequence_numbers] if isinstance(sequence_numbers, int) else list(sequence_numbers)
        if numbers:
            await self._guard("cancel-scheduled-message", timeout)
            await _run(self._broker.cancel_scheduled, self.entity_name, numbers)

    async def create_message_batch(self, max_size_in_bytes: int | None = None) -> ServiceBusMessageBatch:
        await self._open()
        return new_batch(max_size_in_bytes, self._limits)

    async def close(self) -> None:
        self._running = False

    async def __aenter__(self) -> ServiceBusSender:
        await self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class ServiceBusSession(SessionView):
    """`receiver.session`: the locked session's id, lock and state (awaitable operations); every operation checks
    the session lock on the local clock first, as the SDK's session does."""

    _receiver: ServiceBusReceiver

    def __init__(self, receiver: ServiceBusReceiver) -> None:
        self._receiver = receiver

    async def get_state(self, *, timeout: float | None = None, **kwargs: Any) -> bytes | None:
        await self._receiver._open(check_timeout(timeout))
        await self._receiver._guard("get-session-state", timeout)
        return await _run(self._receiver._core.get_state)

    async def set_state(
        self, state: str | bytes | bytearray | None, *, timeout: float | None = None, **kwargs: Any
    ) -> None:
        await self._receiver._open(check_timeout(timeout))
        await self._receiver._guard("set-session-state", timeout)
        await _run(self._receiver._core.set_state, state)

    async def renew_lock(self, *, timeout: float | None = None, **kwargs: Any) -> datetime:
        await self._receiver._open(check_timeout(timeout))
        await self._receiver._guard("renew-session-lock", timeout)
        return await _run(self._receiver._core.renew_session_lock)


class ServiceBusReceiver:
    """Receives from one queue, its dead-letter sub-queue, or one session of it."""

    def __init__(self, broker: EmbeddedBroker, queue_name: str, **options: Any) -> None:
        self._core = ReceiverCore(broker, queue_name, self, **options)
        self.entity_path = queue_name
        self._session = ServiceBusSession(self) if self._core.is_session else None

    @property
    def session(self) -> ServiceBusSession:
        return self._session  # type: ignore[return-value]

    async def _wait_for(
        self, attempt: Callable[[], T | None], deadline: float, register_first: bool = False
    ) -> T | None:
        """As the sync receiver's `_wait_for`, sleeping on the event loop instead of blocking a thread; each look
        (database and registration together) is one hand-off to a worker thread."""
        core = self._core
        epoch = core.begin_wait()
        try:
            while True:
                result, sleep = await _run(core.look, attempt, deadline, epoch, register_first=register_first)
                register_first = False
                if sleep is None:
                    return result
                await core.timer.wait_async(core.waiter, sleep)
        finally:
            core.end_wait(epoch)

    async def _open(self, budget: float | None = None) -> None:
        """As the sync receiver's `_open`: the entity check, then the session accept with the SDK's retries."""
        core = self._core
        core.check_live()
        if core.opened:
            return
        attempts = core.attempts(budget)
        while True:
            try:
                await guard_async(core.broker, core.queue, "open", attempts, core.timer)
                await _run(core.link)
                if core.opened:
                    return
                wait, client_deadline = core.accept_wait(attempts.attempt_timeout())
                if await self._wait_for(core.try_open, core.timer.monotonic() + wait):
                    return
                raise core.accept_timeout(client_deadline)
            except ServiceBusError as error:
                pause = attempts.failed(error)
            await core.timer.sleep_async(pause)

    async def receive_messages(
        self, max_message_count: int | None = 1, max_wait_time: float | None = None
    ) -> list[ServiceBusReceivedMessage]:
        core = self._core
        core.check_live()
        wait = core.default_wait(max_wait_time)
        count = core.batch_size(max_message_count)
        deadline = core.timer.monotonic() + wait
        await self._open(wait)
        if count == 0:
            return []
        await self._guard("receive", wait)
        return await self._wait_for(lambda: core.try_receive(count), deadline, core.expect_idle) or []

    async def _guard(self, op: str, timeout: float | None) -> None:
        """As the sync receiver's `_guard`."""
        core = self._core
        core.check_live()
        await guard_async(core.broker, core.queue, op, core.attempts(timeout), core.timer, core)

    async def receive_deferred_messages(
        self, sequence_numbers: int | Sequence[int], *, timeout: float | None = None, **kwargs: Any
    ) -> list[ServiceBusReceivedMessage]:
        await self._open(check_timeout(timeout))
        await self._guard("receive-by-sequence-number", timeout)
        return await _run(self._core.receive_deferred, sequence_numbers)

    async def peek_messages(
        self, max_message_count: int = 1, *, sequence_number: int = 0, timeout: float | None = None, **kwargs: Any
    ) -> list[ServiceBusReceivedMessage]:
        await self._open(check_timeout(timeout))
        await self._guard("peek-message", timeout)
        return await _run(self._core.peek, max_message_count, sequence_number)

    async def _settle(self, message: ServiceBusReceivedMessage, action: str, **details: str | None) -> None:
        self._core.check_settle(message, action)
        await self._guard(action, None)
        await _run(self._core.settle, message, action, True, **details)

    async def complete_message(self, message: ServiceBusReceivedMessage) -> None:
        await self._settle(message, "complete")

    async def abandon_message(self, message: ServiceBusReceivedMessage) -> None:
        await self._settle(message, "abandon")

    async def defer_message(self, message: ServiceBusReceivedMessage) -> None:
        await self._settle(message, "defer")

    async def dead_letter_message(
        self,
        message: ServiceBusReceivedMessage,
        reason: str | None = None,
        error_description: str | None = None,
    ) -> None:
        await self._settle(message, MESSAGE_DEAD_LETTER, reason=reason, error_description=error_description)

    async def renew_message_lock(
        self, message: ServiceBusReceivedMessage, *, timeout: float | None = None, **kwargs: Any
    ) -> datetime:
        if not self._core.is_session:  # a session receiver's TypeError comes first
            await self._guard("renew-lock", timeout)
        return await _run(self._core.renew_message_lock, message, timeout)

    async def __aiter__(self) -> AsyncIterator[ServiceBusReceivedMessage]:
        await self._open()
        while True:
            messages = await self.receive_messages(1, max_wait_time=self._core.max_wait_time or 3600.0)
            if messages:
                yield messages[0]
            elif self._core.max_wait_time is not None:
                return

    async def close(self) -> None:
        if self._core.running:
            await _run(self._core.close)
        self._core.close_waiter()

    async def __aenter__(self) -> ServiceBusReceiver:
        await self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class ServiceBusAdministrationClient:
    """Async counterpart of `embedded.ServiceBusAdministrationClient`."""

    def __init__(self, broker: EmbeddedBroker) -> None:
        self.broker = broker

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> ServiceBusAdministrationClient:
        return cls(broker_from_connection_string(conn_str, clock=kwargs.pop("clock", None)))

    async def create_queue(self, queue_name: str, **properties: Any) -> QueueProperties:
        return await _run(self.broker.declare_queue, queue_name, **properties)

    async def get_queue_runtime_properties(self, queue_name: str, **kwargs: Any) -> QueueRuntimeProperties:
        return QueueRuntimeProperties.of(queue_name, await _run(self.broker.counts, queue_name))

    async def close(self) -> None:
        self.broker.close()

    async def __aenter__(self) -> ServiceBusAdministrationClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


ServiceBusClient.sender_class = ServiceBusSender
ServiceBusClient.receiver_class = ServiceBusReceiver
