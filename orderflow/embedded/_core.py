"""Client-side logic shared by the sync and aio embedded clients: argument checks the SDK makes, session
acquisition, settlement dispatch, message batches, connection strings, and one look of a waiting receive
(`ReceiverCore.look`: the notify protocol's register / look / leave steps). No blocking happens here; the sync
and aio receivers differ only in how they sleep between looks (`notify.Waiter.wait` / `wait_async`)."""

from __future__ import annotations

import dataclasses
import os
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus import ServiceBusMessage as SdkServiceBusMessage
from azure.servicebus import ServiceBusMessageBatch as SdkServiceBusMessageBatch
from azure.servicebus.exceptions import (
    MessageAlreadySettled,
    MessageSizeExceededError,
    OperationTimeoutError,
    ServiceBusError,
)

from . import notify
from .broker import ACTIVE, DEAD_LETTER, EmbeddedBroker, QueueCounts, SessionLock
from .broker._schema import _MIN_WAIT
from .connection import EMBEDDED_SCHEME
from .message import Envelope, ServiceBusMessage, ServiceBusReceivedMessage, to_envelope

DEFAULT_RECEIVE_WAIT_TIME_SECS = 60  # azure/servicebus/_common/constants.py
MAX_MESSAGE_SIZE_BYTES = 256 * 1024  # Standard tier (service-bus-quotas)
AnyMessage = ServiceBusMessage | SdkServiceBusMessage
T = TypeVar("T")


# -- connection strings --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbeddedConnection:
    """A parsed `Endpoint=embedded://<db path>[;ConfigFile=<config path>][;DuplicateDelivery=true]` connection
    string. `DuplicateDelivery` is a fault-injection switch (orderflow/embedded/broker/): every message completed in
    peek-lock mode is delivered a second time."""

    db_path: str
    config_file: str | None
    duplicate_delivery: bool = False


def parse_connection_string(conn_str: str) -> dict[str, str]:
    """`Key=Value;...` → dict with lower-cased keys (values keep their case; '=' allowed in values)."""
    pairs = (part.split("=", 1) for part in conn_str.split(";") if part.strip())
    return {key.strip().lower(): value.strip() for key, value in pairs}


def parse_embedded(conn_str: str) -> EmbeddedConnection:
    parts = parse_connection_string(conn_str)
    endpoint = parts.get("endpoint", "")
    if not endpoint.lower().startswith(EMBEDDED_SCHEME):
        raise ValueError("not an embedded connection string: Endpoint must start with embedded://")
    path = endpoint[len(EMBEDDED_SCHEME) :]
    if not path:
        raise ValueError("embedded connection string needs a database path: Endpoint=embedded://<path>")
    config = parts.get("configfile")
    duplicate = parts.get("duplicatedelivery", "false").lower()
    if duplicate not in ("true", "false"):
        raise ValueError(f"DuplicateDelivery must be true or false, got {duplicate!r}")
    return EmbeddedConnection(
        os.path.abspath(path), os.path.abspath(config) if config else None, duplicate_delivery=duplicate == "true"
    )


def broker_from_connection_string(conn_str: str, **kwargs: Any) -> EmbeddedBroker:
    connection = parse_embedded(conn_str)
    return EmbeddedBroker(
        connection.db_path, config=connection.config_file, duplicate_delivery=connection.duplicate_delivery, **kwargs
    )


# -- sending -------------------------------------------------------------------------------------------------


class ServiceBusMessageBatch:
    """A batch of messages sent atomically; same surface as the SDK's ServiceBusMessageBatch."""

    def __init__(self, max_size_in_bytes: int | None = None) -> None:
        self.max_size_in_bytes = max_size_in_bytes or MAX_MESSAGE_SIZE_BYTES
        self._messages: list[AnyMessage] = []
        self._size = 0

    def add_message(self, message: AnyMessage) -> None:
        size = len(to_envelope(message).body)
        if self._size + size > self.max_size_in_bytes:
            raise MessageSizeExceededError(
                message=f"ServiceBusMessageBatch has reached its size limit: {self.max_size_in_bytes}"
            )
        self._messages.append(message)
        self._size += size

    @property
    def size_in_bytes(self) -> int:
        return self._size

    def __len__(self) -> int:
        return len(self._messages)


def envelopes_of(message: Any, schedule_time_utc: datetime | None = None) -> list[Envelope]:
    """One message, a list of them, or a batch (ours or the SDK's) → envelopes to store."""
    if isinstance(message, (ServiceBusMessageBatch, SdkServiceBusMessageBatch)):
        items: Iterable[Any] = message._messages
    elif isinstance(message, (list, tuple)):
        items = message
    else:
        items = [message]
    envelopes = [to_envelope(item) for item in items]
    for env in envelopes:
        if len(env.body) > MAX_MESSAGE_SIZE_BYTES:
            raise MessageSizeExceededError(message=f"message of {len(env.body)} bytes exceeds the size limit")
    if schedule_time_utc is not None:
        envelopes = [dataclasses.replace(env, scheduled_enqueue_time_utc=schedule_time_utc) for env in envelopes]
    return envelopes


# -- receiving -----------------------------------------------------------------------------------------------


def _sub_queue_name(sub_queue: ServiceBusSubQueue | str | None) -> str:
    if sub_queue is None:
        return ACTIVE
    if ServiceBusSubQueue(sub_queue) == ServiceBusSubQueue.DEAD_LETTER:
        return DEAD_LETTER
    raise ValueError("the embedded broker has no transfer dead-letter queue (no forwarding)")


class ReceiverCore:
    """State and broker calls of one receiver; `owner` is the public receiver the messages point back to."""

    def __init__(
        self,
        broker: EmbeddedBroker,
        queue_name: str,
        owner: Any,
        *,
        session_id: str | Any = None,
        sub_queue: ServiceBusSubQueue | str | None = None,
        receive_mode: ServiceBusReceiveMode | str = ServiceBusReceiveMode.PEEK_LOCK,
        max_wait_time: float | None = None,
        prefetch_count: int = 0,
    ) -> None:
        if max_wait_time is not None and max_wait_time <= 0:
            raise ValueError("The max_wait_time must be greater than 0.")
        self.broker, self.queue, self.owner = broker, queue_name, owner
        self.sub = _sub_queue_name(sub_queue)
        self.receive_mode = ServiceBusReceiveMode(receive_mode)
        self.max_wait_time = max_wait_time
        self.prefetch_count = prefetch_count
        self.session_target = session_id
        self.lock: SessionLock | None = None
        self.running = True
        self._last_peeked = 0
        self._waiter: notify.Waiter | None = None
        self._key = ""
        self._holder = False
        self._more: bool | None = None  # whether ready messages remained after the last take (None: unknown)
        self._left = 0  # the last wait session that ended through `_leave` (not cut short)
        self.expect_idle = False  # the last receive left nothing ready: the next one will most likely wait
        self._check_entity(broker.queue_properties(queue_name).requires_session)

    def _check_entity(self, requires_session: bool) -> None:
        """Service Bus refuses a receiver whose session-ness does not match the entity."""
        sessionful = self.session_target is not None
        if self.sub != ACTIVE:
            if sessionful:
                raise ServiceBusError("A sub-queue (dead-letter queue) does not support sessions.")
        elif requires_session and not sessionful:
            raise ServiceBusError(
                f"It is not possible for an entity that requires sessions ({self.queue}) to create a "
                "non-sessionful message receiver."
            )
        elif sessionful and not requires_session:
            raise ServiceBusError(
                f"It is not possible for an entity that does not require sessions ({self.queue}) to create a "
                "session receiver."
            )

    @property
    def is_session(self) -> bool:
        return self.session_target is not None

    @property
    def opened(self) -> bool:
        return not self.is_session or self.lock is not None

    @property
    def session_id(self) -> str | None:
        if self.lock is not None:
            return self.lock.session_id
        return None if self.session_target is NEXT_AVAILABLE_SESSION else self.session_target

    def default_wait(self, max_wait_time: float | None) -> float:
        if max_wait_time is not None and max_wait_time <= 0:
            raise ValueError("The max_wait_time must be greater than 0.")
        if max_wait_time is not None:
            return max_wait_time
        return self.max_wait_time if self.max_wait_time is not None else DEFAULT_RECEIVE_WAIT_TIME_SECS

    def check_live(self) -> None:
        if not self.running:
            raise ValueError(
                "The handler has already been shutdown. Please use ServiceBusClient to create a new instance."
            )

    def try_open(self) -> bool:
        """Acquire the session lock (once); False while no session is available for NEXT_AVAILABLE_SESSION."""
        if self.opened:
            return True
        wanted = None if self.session_target is NEXT_AVAILABLE_SESSION else str(self.session_target)
        self.lock = self.broker.accept_session(self.queue, wanted)
        self._more = None
        return self.lock is not None

    # -- waiting (see notify for the protocol and why it loses no wake-up) -------------------------------------

    @property
    def waiter(self) -> notify.Waiter:
        if self._waiter is None:
            self._waiter = self.broker.new_waiter()
        return self._waiter

    def begin_wait(self) -> int:
        """Start a waiting receive (or session accept); returns the wait session's number for `look`/`end_wait`."""
        self._key = self.broker.wake_key(self.queue, self.sub, self.lock)
        self._holder = self.lock is not None
        return self.waiter.start()

    def look(
        self, attempt: Callable[[], T | None], deadline: float, epoch: int, *, register_first: bool = False
    ) -> tuple[T | None, float | None]:
        """One look of a waiting receive: (result, None) when the wait is over, else (None, seconds to sleep).

        Registered before it looks, a send committed after the look claims it (or another waiter). By default it
        looks first without registering (a busy receiver finds work and never becomes a waiter), and if it found
        nothing registers and looks again; `register_first` (the last receive left nothing ready) saves that
        second look. Runs in the caller's thread (for aio, one worker thread per look, database and files)."""
        waiter = self.waiter
        if waiter.drain() or waiter.claimed:  # pokes so far are answered by this look; a later one cuts the sleep
            waiter.notice_claim(epoch)
        if register_first and deadline > time.monotonic():
            waiter.ensure_registered(self._key, epoch)
        result = attempt()
        remaining = deadline - time.monotonic()
        if not result and remaining > 0 and waiter.ensure_registered(self._key, epoch):
            result = attempt()
            remaining = deadline - time.monotonic()
        if result or remaining <= 0:
            return self._leave(attempt, result, epoch), None
        return None, self._publish_wake(remaining, epoch)

    def _leave(self, attempt: Callable[[], T | None], result: T | None, epoch: int) -> T | None:
        """Unregister; answer a claim that found us on the way out; hand the timer role over if we had it."""
        broker, waiter = self.broker, self.waiter
        claimed_late = waiter.unregister(epoch)
        fresh = True  # whether what our last look saw is later than every claim that reached us
        if claimed_late and not result:
            result = attempt()  # claimed after our last look: its message may be ours to take
        elif claimed_late:
            fresh = False
        last, waiter.last_wake_at = waiter.last_wake_at, None
        if self._holder:
            return result  # a session's holder is its key's only waiter: nobody to wake in its place
        if result and waiter.claimed:
            # Woken for work: the claim's message may be one we did not take. Wake the next waiter if more is ready.
            more = self._more if fresh and self._more is not None else broker.has_ready(self.queue, self.sub)
            if more:
                notify.claim(broker.notify_dir, self._key, 1)
        if last is not None and notify.needs_cover(broker.notify_dir, self._key, last):
            due = broker.due_at(self.queue)  # we may have been the waiter due to wake first: pass that on
            if due is not None:
                notify.cover(broker.notify_dir, self._key, due)
        self._left = epoch
        return result

    def _publish_wake(self, remaining: float, epoch: int) -> float:
        """How long to sleep: until the deadline, or until the next due moment when no other waiter of the key
        wakes by then (one timer wake-up per due moment, not one per waiter); published in the socket file."""
        broker = self.broker
        now = broker.now_ts()
        wake_at, sleep = now + remaining, remaining
        due = broker.due_at(self.queue, self.lock if self._holder else None)
        if (
            due is not None
            and due < wake_at
            and (self._holder or not notify.covered(broker.notify_dir, self._key, due))
        ):
            wake_at, sleep = due, max(due - now, _MIN_WAIT)
        if not self.waiter.set_wake_at(wake_at, epoch):
            return 0.0  # claimed meanwhile: look again at once
        return sleep

    def end_wait(self, epoch: int) -> None:
        """End a wait session. One cut short by an exception or a cancellation did not leave through `_leave`: then,
        without the database, a claim that reached it or the timer role it may have had goes to another waiter."""
        if self._waiter is None:
            return
        key, claimed, last = self._waiter.stop(epoch)
        if self._left == epoch or key is None or self._holder:
            return
        claimed = claimed or self._waiter.claimed
        if claimed or (last is not None and notify.needs_cover(self.broker.notify_dir, key, last)):
            notify.claim(self.broker.notify_dir, key, 1)

    def close_waiter(self) -> None:
        if self._waiter is not None:
            self._waiter.close()
            self._waiter = None

    @staticmethod
    def no_session_error() -> OperationTimeoutError:
        return OperationTimeoutError(message="No session available to receive from within max_wait_time.")

    def batch_size(self, max_message_count: int | None) -> int:
        if max_message_count is not None and max_message_count <= 0:
            raise ValueError("The max_message_count must be greater than 0")
        return max_message_count if max_message_count is not None else self.prefetch_count

    def try_receive(self, count: int) -> list[ServiceBusReceivedMessage]:
        delete = self.receive_mode == ServiceBusReceiveMode.RECEIVE_AND_DELETE
        taken = self.broker.take(self.queue, count, sub_queue=self.sub, session=self.lock, delete=delete)
        self._more = taken.more_ready
        self.expect_idle = not taken.more_ready
        return [ServiceBusReceivedMessage(s, receiver=self.owner, settled=delete) for s in taken.messages]

    def receive_deferred(self, sequence_numbers: int | Sequence[int]) -> list[ServiceBusReceivedMessage]:
        numbers = [sequence_numbers] if isinstance(sequence_numbers, int) else list(sequence_numbers)
        stored = self.broker.receive_deferred(self.queue, numbers, session=self.lock)
        return [ServiceBusReceivedMessage(s, receiver=self.owner) for s in stored]

    def peek(self, max_message_count: int, sequence_number: int) -> list[ServiceBusReceivedMessage]:
        self.check_live()
        start = sequence_number or self._last_peeked + 1
        stored = self.broker.peek(self.queue, start, max_message_count, sub_queue=self.sub, session_id=self.session_id)
        if stored:
            self._last_peeked = stored[-1].sequence_number
        return [ServiceBusReceivedMessage(s, receiver=self.owner, peeked=True) for s in stored]

    def settle(self, message: ServiceBusReceivedMessage, action: str, **details: str | None) -> None:
        """complete / abandon / defer / dead_letter, with the checks the SDK makes before it calls the service
        (azure/servicebus/_common/receiver_mixins.py `_check_message_alive`)."""
        self.check_live()
        self._check_settleable(message, action)
        args = (self.queue, message.sequence_number, _lock_token(message))
        if action == "dead_letter":
            self.broker.dead_letter(
                *args,
                session=self.lock,
                reason=details.get("reason"),
                error_description=details.get("error_description"),
            )
        else:
            getattr(self.broker, action)(*args, session=self.lock)
        message._settled = True

    def _check_settleable(self, message: ServiceBusReceivedMessage, action: str) -> None:
        if not isinstance(message, ServiceBusReceivedMessage):
            raise TypeError("Parameter 'message' must be of type ServiceBusReceivedMessage")
        if message._is_peeked_message:
            raise ValueError(f"The operation {action} is not supported for peeked messages.")
        if self.receive_mode == ServiceBusReceiveMode.RECEIVE_AND_DELETE:
            raise ValueError(f"The operation {action} is not supported in 'RECEIVE_AND_DELETE' receive mode.")
        if message._settled:
            raise MessageAlreadySettled(action=action)

    def renew_message_lock(self, message: ServiceBusReceivedMessage) -> datetime:
        if self.is_session:
            raise TypeError(
                "Renewing message lock is an invalid operation when working with sessions. "
                "Please renew the session lock instead."
            )
        self.check_live()
        self._check_settleable(message, "renew_lock")
        until = self.broker.renew_message_lock(self.queue, message.sequence_number, _lock_token(message))
        message._expiry = until
        return until

    def renew_session_lock(self) -> datetime:
        self.lock = self.broker.renew_session_lock(self.queue, self._held())
        return self.lock.locked_until

    def get_state(self) -> bytes | None:
        return self.broker.get_session_state(self.queue, self._held())

    def set_state(self, state: str | bytes | bytearray | None) -> None:
        data = state.encode("utf-8") if isinstance(state, str) else (bytes(state) if state is not None else None)
        self.broker.set_session_state(self.queue, self._held(), data)

    def _held(self) -> SessionLock:
        if self.lock is None:
            raise ValueError("The session has not been accepted yet; receive first or open the receiver.")
        return self.lock

    def close(self) -> None:
        """Release the session (its unsettled messages count as failed deliveries) and stop."""
        if self.lock is not None:
            self.broker.release_session(self.queue, self.lock)
        self.running = False


def _lock_token(message: ServiceBusReceivedMessage) -> str:
    token = message._stored.lock_token
    if not token:
        raise ValueError("Unable to settle or renew the message - no lock token found.")
    return token


@dataclass(frozen=True)
class QueueRuntimeProperties:
    """The subset of azure.servicebus.management.QueueRuntimeProperties the embedded broker reports."""

    name: str
    active_message_count: int
    scheduled_message_count: int
    dead_letter_message_count: int
    total_message_count: int
    transfer_dead_letter_message_count: int = 0
    transfer_message_count: int = 0

    @classmethod
    def of(cls, name: str, counts: QueueCounts) -> QueueRuntimeProperties:
        return cls(name, counts.active, counts.scheduled, counts.dead_lettered, counts.total)


class ClientBase:
    """What the sync and aio embedded clients share: construction and handler creation. Subclasses name their
    sender and receiver classes and add close / context management in their own (sync or async) style."""

    sender_class: Any = None
    receiver_class: Any = None

    def __init__(self, broker: EmbeddedBroker, *, _owns_broker: bool = False) -> None:
        self.broker = broker
        self.fully_qualified_namespace = "embedded"
        self._owns_broker = _owns_broker
        # Weak, like the SDK's handler set: a long-running process that opens a receiver per session must not keep
        # every closed receiver alive.
        self._handlers: weakref.WeakSet[Any] = weakref.WeakSet()

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> Any:
        """`Endpoint=embedded://<db path>[;ConfigFile=<config path>]`; `clock=` may be passed for tests."""
        clock = kwargs.pop("clock", None)
        return cls(broker_from_connection_string(conn_str, clock=clock), _owns_broker=True)

    def get_queue_sender(self, queue_name: str, **kwargs: Any) -> Any:
        sender = self.sender_class(self.broker, queue_name)
        self._handlers.add(sender)
        return sender

    def get_queue_receiver(
        self,
        queue_name: str,
        *,
        session_id: str | Any = None,
        sub_queue: ServiceBusSubQueue | str | None = None,
        receive_mode: ServiceBusReceiveMode | str = ServiceBusReceiveMode.PEEK_LOCK,
        max_wait_time: float | None = None,
        prefetch_count: int = 0,
        **kwargs: Any,
    ) -> Any:
        receiver = self.receiver_class(
            self.broker,
            queue_name,
            session_id=session_id,
            sub_queue=sub_queue,
            receive_mode=receive_mode,
            max_wait_time=max_wait_time,
            prefetch_count=prefetch_count,
        )
        self._handlers.add(receiver)
        return receiver
