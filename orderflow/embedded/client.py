"""Sync client of the embedded broker, mirroring `azure.servicebus.ServiceBusClient` (queues only).

Project code written against azure-servicebus runs on it unchanged: same method names, keywords,
exceptions (`azure.servicebus.exceptions`) and constants (`NEXT_AVAILABLE_SESSION`, `ServiceBusSubQueue`,
`ServiceBusReceiveMode` imported from `azure.servicebus`). Receives block event-driven (see `notify`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
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
from ._faulted import guard
from ._retry import Attempts, RetryPolicy, Timer
from ._session_view import SessionView
from .broker import EmbeddedBroker
from .config import QueueProperties
from .message import STANDARD, ServiceBusMessage, ServiceBusReceivedMessage, SizeLimits, envelopes_of, new_batch

__all__ = [
    "ServiceBusAdministrationClient",
    "ServiceBusClient",
    "ServiceBusMessage",
    "ServiceBusMessageBatch",
    "ServiceBusReceivedMessage",
    "ServiceBusReceiver",
    "ServiceBusSender",
    "ServiceBusSession",
]
T = TypeVar("T")


class ServiceBusClient(ClientBase):
    """Entry point, like `azure.servicebus.ServiceBusClient`, over an `EmbeddedBroker`."""

    # sender_class / receiver_class are set at the end of this module, once those classes exist.

    def close(self) -> None:
        for handler in list(self._handlers):
            handler.close()
        self._handlers.clear()
        if self._owns_broker:
            self.broker.close()

    def __enter__(self) -> ServiceBusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ServiceBusSender:
    """Sends to one queue; a send is durable once `send_messages` returns. As the SDK's, it checks the entity when
    its link opens (`__enter__` or the first operation, with the SDK's retries), not when it is made."""

    def __init__(self, broker: EmbeddedBroker, queue_name: str, *, timer: Timer, retry: RetryPolicy) -> None:
        self._broker, self.entity_name = broker, queue_name
        self._timer, self._retry = timer, retry
        self._running, self._linked = True, False
        self._limits = STANDARD  # what the link allows, once it is open (the entity's sizes)

    def _open(self, timeout: float | None = None) -> None:
        """`_open_with_retry` / `_do_retryable_operation(timeout=...)`: `check_entity` until the link opens."""
        if not self._running:
            raise ValueError(SHUTDOWN)
        check_timeout(timeout)
        attempts = Attempts(self._retry, self._timer, timeout)
        while not self._linked:
            try:
                guard(self._broker, self.entity_name, "open", attempts, self._timer)
                self._limits = SizeLimits.of(check_entity(self._broker, self.entity_name, claim="Send"))
                self._linked = True
            except ServiceBusError as error:
                self._timer.sleep(attempts.failed(error))

    def _guard(self, op: str, timeout: float | None) -> None:
        """The operation's injected faults, with the SDK's retries (`_do_retryable_operation(timeout=...)`)."""
        guard(self._broker, self.entity_name, op, Attempts(self._retry, self._timer, timeout), self._timer)

    def send_messages(self, message: Any, *, timeout: float | None = None, **kwargs: Any) -> None:
        self._open(timeout)
        envelopes = envelopes_of(message, limits=self._limits)
        if envelopes:
            self._guard("send", timeout)
            self._broker.send(self.entity_name, envelopes)

    def schedule_messages(
        self, messages: Any, schedule_time_utc: datetime, *, timeout: float | None = None, **kwargs: Any
    ) -> list[int]:
        self._open(timeout)
        envelopes = envelopes_of(messages, schedule_time_utc, self._limits)
        if envelopes:
            self._guard("schedule-message", timeout)
        numbers = self._broker.send(self.entity_name, envelopes) if envelopes else []
        return [n for n in numbers if n is not None]

    def cancel_scheduled_messages(
        self, sequence_numbers: int | Sequence[int], *, timeout: float | None = None, **kwargs: Any
    ) -> None:
        self._open(timeout)
        numbers = [sequence_numbers] if isinstance(sequence_numbers, int) else list(sequence_numbers)
        if numbers:
            self._guard("cancel-scheduled-message", timeout)
            self._broker.cancel_scheduled(self.entity_name, numbers)

    def create_message_batch(self, max_size_in_bytes: int | None = None) -> ServiceBusMessageBatch:
        self._open()
        return new_batch(max_size_in_bytes, self._limits)

    def close(self) -> None:
        self._running = False

    def __enter__(self) -> ServiceBusSender:
        self._open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ServiceBusSession(SessionView):
    """`receiver.session`: the locked session's id, lock and state. Every operation checks the session lock on the
    local clock first (`ServiceBusReceiver._check_live`), as the SDK's session does."""

    _receiver: ServiceBusReceiver

    def __init__(self, receiver: ServiceBusReceiver) -> None:
        self._receiver = receiver

    def get_state(self, *, timeout: float | None = None, **kwargs: Any) -> bytes | None:
        self._receiver._open(check_timeout(timeout))
        self._receiver._guard("get-session-state", timeout)
        return self._receiver._core.get_state()

    def set_state(self, state: str | bytes | bytearray | None, *, timeout: float | None = None, **kwargs: Any) -> None:
        self._receiver._open(check_timeout(timeout))
        self._receiver._guard("set-session-state", timeout)
        self._receiver._core.set_state(state)

    def renew_lock(self, *, timeout: float | None = None, **kwargs: Any) -> datetime:
        self._receiver._open(check_timeout(timeout))
        self._receiver._guard("renew-session-lock", timeout)
        return self._receiver._core.renew_session_lock()


class ServiceBusReceiver:
    """Receives from one queue, its dead-letter sub-queue, or one session of it."""

    def __init__(self, broker: EmbeddedBroker, queue_name: str, **options: Any) -> None:
        self._core = ReceiverCore(broker, queue_name, self, **options)
        self.entity_path = queue_name
        self._session = ServiceBusSession(self) if self._core.is_session else None

    @property
    def session(self) -> ServiceBusSession:
        return self._session  # type: ignore[return-value]  # None for a non-session receiver, as in the SDK

    def _wait_for(self, attempt: Callable[[], T | None], deadline: float, register_first: bool = False) -> T | None:
        """Retry `attempt` until it returns something or the deadline passes, sleeping on the receiver's socket
        (claimed and woken by a send from any process, see notify) or until a due moment it keeps."""
        core = self._core
        epoch = core.begin_wait()
        try:
            while True:
                result, sleep = core.look(attempt, deadline, epoch, register_first=register_first)
                register_first = False
                if sleep is None:
                    return result
                core.timer.wait(core.waiter, sleep)
        finally:
            core.end_wait(epoch)

    def _open(self, budget: float | None = None) -> None:
        """Open the link: check the entity and, for a session receiver, accept its session, with the SDK's retries
        (`_open_with_retry`; `budget` bounds them all, as the first receive's wait does)."""
        core = self._core
        core.check_live()
        if core.opened:
            return
        attempts = core.attempts(budget)
        while True:
            try:
                guard(core.broker, core.queue, "open", attempts, core.timer)
                core.link()
                if core.opened:
                    return
                wait, client_deadline = core.accept_wait(attempts.attempt_timeout())
                if self._wait_for(core.try_open, core.timer.monotonic() + wait):
                    return
                raise core.accept_timeout(client_deadline)
            except ServiceBusError as error:
                pause = attempts.failed(error)
            core.timer.sleep(pause)

    def receive_messages(
        self, max_message_count: int | None = 1, max_wait_time: float | None = None
    ) -> list[ServiceBusReceivedMessage]:
        """Up to `max_message_count` messages; waits up to `max_wait_time` for the first one. On a receiver not yet
        open, accepting its session is part of that one wait (_servicebus_receiver.py `_receive`)."""
        core = self._core
        core.check_live()
        wait = core.default_wait(max_wait_time)
        count = core.batch_size(max_message_count)
        deadline = core.timer.monotonic() + wait
        self._open(wait)
        if count == 0:
            return []
        self._guard("receive", wait)
        return self._wait_for(lambda: core.try_receive(count), deadline, core.expect_idle) or []

    def _guard(self, op: str, timeout: float | None) -> None:
        """The operation's injected faults, with the SDK's retries, after its local checks (`_check_live`)."""
        core = self._core
        core.check_live()
        guard(core.broker, core.queue, op, core.attempts(timeout), core.timer, core)

    def receive_deferred_messages(
        self, sequence_numbers: int | Sequence[int], *, timeout: float | None = None, **kwargs: Any
    ) -> list[ServiceBusReceivedMessage]:
        self._open(check_timeout(timeout))
        self._guard("receive-by-sequence-number", timeout)
        return self._core.receive_deferred(sequence_numbers)

    def peek_messages(
        self, max_message_count: int = 1, *, sequence_number: int = 0, timeout: float | None = None, **kwargs: Any
    ) -> list[ServiceBusReceivedMessage]:
        self._open(check_timeout(timeout))
        self._guard("peek-message", timeout)
        return self._core.peek(max_message_count, sequence_number)

    def _settle(self, message: ServiceBusReceivedMessage, action: str, **details: str | None) -> None:
        self._core.check_settle(message, action)
        self._guard(action, None)
        self._core.settle(message, action, checked=True, **details)

    def complete_message(self, message: ServiceBusReceivedMessage) -> None:
        self._settle(message, "complete")

    def abandon_message(self, message: ServiceBusReceivedMessage) -> None:
        self._settle(message, "abandon")

    def defer_message(self, message: ServiceBusReceivedMessage) -> None:
        self._settle(message, "defer")

    def dead_letter_message(
        self,
        message: ServiceBusReceivedMessage,
        reason: str | None = None,
        error_description: str | None = None,
    ) -> None:
        self._settle(message, MESSAGE_DEAD_LETTER, reason=reason, error_description=error_description)

    def renew_message_lock(
        self, message: ServiceBusReceivedMessage, *, timeout: float | None = None, **kwargs: Any
    ) -> datetime:
        if not self._core.is_session:  # a session receiver's TypeError comes first
            self._guard("renew-lock", timeout)
        return self._core.renew_message_lock(message, timeout)

    def __iter__(self) -> Iterator[ServiceBusReceivedMessage]:
        """Messages one by one until `max_wait_time` (of the receiver) passes without one; forever if None. The
        link opens first with the SDK's retries (`_iter_next`)."""
        self._open()
        while True:
            wait = self._core.max_wait_time or DEFAULT_ITER_WAIT
            messages = self.receive_messages(1, max_wait_time=wait)
            if messages:
                yield messages[0]
            elif self._core.max_wait_time is not None:
                return

    def close(self) -> None:
        if self._core.running:
            self._core.close()
        self._core.close_waiter()

    def __enter__(self) -> ServiceBusReceiver:
        self._open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


DEFAULT_ITER_WAIT = 3600.0


class ServiceBusAdministrationClient:
    """The part of `azure.servicebus.management.ServiceBusAdministrationClient` the embedded broker has."""

    def __init__(self, broker: EmbeddedBroker) -> None:
        self.broker = broker

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> ServiceBusAdministrationClient:
        return cls(broker_from_connection_string(conn_str, clock=kwargs.pop("clock", None)))

    def create_queue(self, queue_name: str, **properties: Any) -> QueueProperties:
        """Same keywords as the SDK's create_queue (requires_session, lock_duration, ...); idempotent."""
        return self.broker.declare_queue(queue_name, **properties)

    def get_queue_runtime_properties(self, queue_name: str, **kwargs: Any) -> QueueRuntimeProperties:
        return QueueRuntimeProperties.of(queue_name, self.broker.counts(queue_name))

    def list_queues(self) -> list[str]:
        return self.broker.queue_names()

    def close(self) -> None:
        self.broker.close()

    def __enter__(self) -> ServiceBusAdministrationClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


ServiceBusClient.sender_class = ServiceBusSender
ServiceBusClient.receiver_class = ServiceBusReceiver
