"""In-memory fakes for the Agent tests: a session queue bus with the azure-servicebus aio surface, a clock.

Only what the Agent uses: `get_queue_sender(...).send_messages`, `get_queue_receiver(queue,
session_id=NEXT_AVAILABLE_SESSION, max_wait_time=...)` as an async context manager that locks one session
(raising OperationTimeoutError when none is available in time, as the SDK does:
azure/servicebus/aio/_base_handler_async.py), `receive_messages`, `complete_message`, `abandon_message`,
`dead_letter_message(reason=, error_description=)`, `session.renew_lock()`. Duplicate detection on MessageId.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import OperationTimeoutError

from agent.config import AgentConfig, config_from_env
from orderflow.messages import AgentRequest, StepName, idempotency_key

START = datetime(2030, 1, 1, tzinfo=UTC)


class FakeClock:
    """`now()` and an async `sleep()` that advances time instantly (no real waiting)."""

    def __init__(self, start: datetime = START) -> None:
        self._now = start
        self.sleeps: list[float] = []

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)
        await asyncio.sleep(0)


@dataclass
class FakeMessage:
    raw: bytes
    message_id: str | None
    session_id: str | None
    subject: str | None = None
    content_type: str | None = None
    delivery_count: int = 0
    sequence_number: int = 0
    dead_letter_reason: str | None = None
    dead_letter_error_description: str | None = None

    @property
    def body(self) -> Any:
        """Like the SDK's received message: a data body is an iterable of byte sections."""
        return iter([self.raw])

    def text(self) -> str:
        return self.raw.decode()


def to_fake(message: ServiceBusMessage | FakeMessage, sequence: int) -> FakeMessage:
    if isinstance(message, FakeMessage):
        return message
    return FakeMessage(
        b"".join(message.body),
        message.message_id,
        message.session_id,
        message.subject,
        message.content_type,
        sequence_number=sequence,
    )


@dataclass
class _Queue:
    active: list[FakeMessage] = field(default_factory=list)
    locked: set[int] = field(default_factory=set)  # sequence numbers delivered and not settled
    dead: list[FakeMessage] = field(default_factory=list)
    completed: list[FakeMessage] = field(default_factory=list)
    seen_ids: set[str] = field(default_factory=set)


class FakeBus:
    def __init__(self) -> None:
        self.queues: dict[str, _Queue] = {}
        self.locked_sessions: set[tuple[str, str]] = set()
        self.events: list[str] = []  # settlement and send log, in order
        self.send_failures: dict[str, int] = {}  # queue → number of sends to fail
        self.send_error: type[Exception] = ConnectionError  # what they raise (ConnectionError: transient)
        self.receive_failures = 0  # number of receive_messages calls to fail (in any session)
        self._changed = asyncio.Condition()
        self._seq = itertools.count(1)
        self.session_waiters = 0  # receivers waiting for a session right now
        self.peak_session_waiters = 0
        self.accept_timeouts = 0  # session waits that ended with OperationTimeoutError
        self.receivers: list[FakeSessionReceiver] = []  # every session receiver created, in order

    def queue(self, name: str) -> _Queue:
        return self.queues.setdefault(name, _Queue())

    # --- the azure-servicebus aio client surface --------------------------------------------------------
    def get_queue_sender(self, queue_name: str) -> FakeSender:
        return FakeSender(self, queue_name)

    def get_queue_receiver(
        self, queue_name: str, *, session_id: Any = None, max_wait_time: float | None = None
    ) -> FakeSessionReceiver:
        receiver = FakeSessionReceiver(self, queue_name, max_wait_time or 1.0)
        self.receivers.append(receiver)
        return receiver

    async def __aenter__(self) -> FakeBus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    # --- test helpers ----------------------------------------------------------------------------------
    async def send(self, queue_name: str, message: ServiceBusMessage | FakeMessage) -> bool:
        """Enqueue unless the MessageId was seen (duplicate detection); True when enqueued."""
        failures = self.send_failures.get(queue_name, 0)
        if failures:
            self.send_failures[queue_name] = failures - 1
            raise self.send_error(f"injected send failure on {queue_name}")
        fake = to_fake(message, next(self._seq))
        q = self.queue(queue_name)
        self.events.append(f"send:{queue_name}:{fake.message_id}")
        if fake.message_id in q.seen_ids:
            return False
        if fake.message_id:
            q.seen_ids.add(fake.message_id)
        async with self._changed:
            q.active.append(fake)
            self._changed.notify_all()
        return True

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout)

    async def notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def bodies(self, queue_name: str) -> list[str]:
        return [m.text() for m in self.queue(queue_name).active]

    def _free_session(self, queue_name: str) -> str | None:
        q = self.queue(queue_name)
        for m in q.active:
            if (
                m.session_id
                and (queue_name, m.session_id) not in self.locked_sessions
                and m.sequence_number not in q.locked
            ):
                return m.session_id
        return None

    async def lock_session(self, queue_name: str, wait: float) -> str:
        async with self._changed:
            self.session_waiters += 1
            self.peak_session_waiters = max(self.peak_session_waiters, self.session_waiters)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait_for(lambda: self._free_session(queue_name)), wait)
            finally:
                self.session_waiters -= 1
            session = self._free_session(queue_name)
            if session is None:
                self.accept_timeouts += 1
                self._changed.notify_all()
                raise OperationTimeoutError(message="no session available")
            self.locked_sessions.add((queue_name, session))
            return session

    def _available(self, queue_name: str, session: str) -> list[FakeMessage]:
        q = self.queue(queue_name)
        return [m for m in q.active if m.session_id == session and m.sequence_number not in q.locked]

    async def take(self, queue_name: str, session: str, count: int, wait: float) -> list[FakeMessage]:
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait_for(lambda: self._available(queue_name, session)), wait)
            batch = self._available(queue_name, session)[:count]
            q = self.queue(queue_name)
            for m in batch:
                m.delivery_count += 1
                q.locked.add(m.sequence_number)
            return batch

    async def settle(self, queue_name: str, message: FakeMessage, how: str) -> None:
        q = self.queue(queue_name)
        if message.sequence_number not in q.locked:
            raise ValueError(f"message {message.message_id} is not locked")
        q.locked.discard(message.sequence_number)
        if how != "abandon":
            q.active.remove(message)
            (q.dead if how == "dead-letter" else q.completed).append(message)
        self.events.append(f"{how}:{queue_name}:{message.message_id}")
        await self.notify()


class FakeSender:
    def __init__(self, bus: FakeBus, queue_name: str) -> None:
        self._bus = bus
        self._queue = queue_name

    async def __aenter__(self) -> FakeSender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def send_messages(self, message: ServiceBusMessage) -> None:
        await self._bus.send(self._queue, message)


class FakeSession:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.locked_until_utc: datetime | None = None
        self.renewals = 0

    async def renew_lock(self) -> datetime:
        self.renewals += 1
        return datetime.now(UTC)


class FakeSessionReceiver:
    def __init__(self, bus: FakeBus, queue_name: str, wait: float) -> None:
        self._bus = bus
        self._queue = queue_name
        self._wait = wait
        self.session: FakeSession | None = None
        self.closes = 0
        self._released = False

    async def __aenter__(self) -> FakeSessionReceiver:
        self.session = FakeSession(await self._bus.lock_session(self._queue, self._wait))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.session is not None
        await self.close()

    async def close(self) -> None:
        """As the SDK's: releases the session, if one was accepted; closing twice is a no-op."""
        self.closes += 1
        if self.session is None or self._released:
            return
        self._released = True
        q = self._bus.queue(self._queue)
        for m in q.active:  # closing the receiver releases its unsettled messages (the lock is gone)
            if m.session_id == self.session.session_id:
                q.locked.discard(m.sequence_number)
        self._bus.locked_sessions.discard((self._queue, self.session.session_id))
        await self._bus.notify()

    async def receive_messages(
        self, max_message_count: int = 1, max_wait_time: float | None = None
    ) -> list[FakeMessage]:
        assert self.session is not None
        if self._bus.receive_failures:
            self._bus.receive_failures -= 1
            raise ConnectionError("injected receive failure")
        return await self._bus.take(
            self._queue, self.session.session_id, max_message_count, max_wait_time or self._wait
        )

    async def complete_message(self, message: FakeMessage) -> None:
        await self._bus.settle(self._queue, message, "complete")

    async def abandon_message(self, message: FakeMessage) -> None:
        await self._bus.settle(self._queue, message, "abandon")

    async def dead_letter_message(
        self, message: FakeMessage, reason: str | None = None, error_description: str | None = None
    ) -> None:
        message.dead_letter_reason = reason
        message.dead_letter_error_description = error_description
        await self._bus.settle(self._queue, message, "dead-letter")


# --- builders ---------------------------------------------------------------------------------------
REQUESTS, REPLIES, ALERTS = "agent-requests", "agent-replies", "operator-alerts"


def make_request(
    order_id: str = "order-1",
    step: StepName = StepName.RESERVE_INVENTORY,
    attempt: int = 1,
    deadline: datetime | None = None,
    **overrides: Any,
) -> AgentRequest:
    fields: dict[str, Any] = dict(
        instance_id=f"{order_id}:{attempt}",
        order_id=order_id,
        attempt=attempt,
        step=step,
        idempotency_key=idempotency_key(order_id, step.value),
        deadline=deadline or START + timedelta(seconds=30),
        reply_to=REPLIES,
        payload={"items": 2},
    )
    fields.update(overrides)
    return AgentRequest(**fields)


def request_message(request: AgentRequest) -> ServiceBusMessage:
    return ServiceBusMessage(request.to_json(), session_id=request.order_id, message_id=request.message_id())


def raw_message(body: str | bytes, session_id: str = "order-1", message_id: str = "poison-1") -> ServiceBusMessage:
    return ServiceBusMessage(body, session_id=session_id, message_id=message_id)


def agent_config(**overrides: Any) -> AgentConfig:
    env = {
        "AGENT_RECEIVE_WAIT_MS": "50",
        "AGENT_BACKOFF_BASE_MS": "10",
        "AGENT_BACKOFF_MAX_MS": "50",
        "AGENT_SHUTDOWN_GRACE_MS": "2000",
    }
    base = config_from_env(env)
    return AgentConfig(**{**base.__dict__, **overrides})
