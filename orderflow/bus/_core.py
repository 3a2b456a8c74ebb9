"""Client-side logic shared by the sync and aio embedded clients: argument checks the SDK makes, session
acquisition, settlement dispatch, message batches and connection strings. No waiting happens here; the sync
and aio receivers differ only in how they wait between attempts (`notify.Waiter.wait` / `wait_async`)."""

from __future__ import annotations

import dataclasses
import os
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

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

from .broker import ACTIVE, DEAD_LETTER, EmbeddedBroker, QueueCounts, SessionLock
from .message import Envelope, ServiceBusMessage, ServiceBusReceivedMessage, to_envelope

EMBEDDED_SCHEME = "embedded://"
DEFAULT_RECEIVE_WAIT_TIME_SECS = 60  # azure/servicebus/_common/constants.py
MAX_MESSAGE_SIZE_BYTES = 256 * 1024  # Standard tier (service-bus-quotas)
AnyMessage = ServiceBusMessage | SdkServiceBusMessage


# -- connection strings --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbeddedConnection:
    """A parsed `Endpoint=embedded://<db path>[;ConfigFile=<config path>]` connection string."""

    db_path: str
    config_file: str | None


def parse_connection_string(conn_str: str) -> dict[str, str]:
    """`Key=Value;...` → dict with lower-cased keys (values keep their case; '=' allowed in values)."""
    pairs = (part.split("=", 1) for part in conn_str.split(";") if part.strip())
    return {key.strip().lower(): value.strip() for key, value in pairs}


def is_embedded(conn_str: str) -> bool:
    return parse_connection_string(conn_str).get("endpoint", "").lower().startswith(EMBEDDED_SCHEME)


def parse_embedded(conn_str: str) -> EmbeddedConnection:
    parts = parse_connection_string(conn_str)
    endpoint = parts.get("endpoint", "")
    if not endpoint.lower().startswith(EMBEDDED_SCHEME):
        raise ValueError("not an embedded connection string: Endpoint must start with embedded://")
    path = endpoint[len(EMBEDDED_SCHEME) :]
    if not path:
        raise ValueError("embedded connection string needs a database path: Endpoint=embedded://<path>")
    config = parts.get("configfile")
    return EmbeddedConnection(os.path.abspath(path), os.path.abspath(config) if config else None)


def broker_from_connection_string(conn_str: str, **kwargs: Any) -> EmbeddedBroker:
    connection = parse_embedded(conn_str)
    return EmbeddedBroker(connection.db_path, config=connection.config_file, **kwargs)


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
        envelopes = [
            dataclasses.replace(env, scheduled_enqueue_time_utc=schedule_time_utc) for env in envelopes
        ]
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
        return self.lock is not None

    @staticmethod
    def no_session_error() -> OperationTimeoutError:
        return OperationTimeoutError(message="No session available to receive from within max_wait_time.")

    def batch_size(self, max_message_count: int | None) -> int:
        if max_message_count is not None and max_message_count <= 0:
            raise ValueError("The max_message_count must be greater than 0")
        return max_message_count if max_message_count is not None else self.prefetch_count

    def try_receive(self, count: int) -> list[ServiceBusReceivedMessage]:
        delete = self.receive_mode == ServiceBusReceiveMode.RECEIVE_AND_DELETE
        stored = self.broker.receive(self.queue, count, sub_queue=self.sub, session=self.lock, delete=delete)
        return [ServiceBusReceivedMessage(s, receiver=self.owner, settled=delete) for s in stored]

    def receive_deferred(self, sequence_numbers: int | Sequence[int]) -> list[ServiceBusReceivedMessage]:
        numbers = [sequence_numbers] if isinstance(sequence_numbers, int) else list(sequence_numbers)
        stored = self.broker.receive_deferred(self.queue, numbers, session=self.lock)
        return [ServiceBusReceivedMessage(s, receiver=self.owner) for s in stored]

    def peek(self, max_message_count: int, sequence_number: int) -> list[ServiceBusReceivedMessage]:
        self.check_live()
        start = sequence_number or self._last_peeked + 1
        stored = self.broker.peek(
            self.queue, start, max_message_count, sub_queue=self.sub, session_id=self.session_id
        )
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
        data = (
            state.encode("utf-8") if isinstance(state, str) else (bytes(state) if state is not None else None)
        )
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
            self.broker, queue_name, session_id=session_id, sub_queue=sub_queue, receive_mode=receive_mode,
            max_wait_time=max_wait_time, prefetch_count=prefetch_count,
        )
        self._handlers.add(receiver)
        return receiver
