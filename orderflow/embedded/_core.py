"""Client-side logic shared by the sync and aio embedded clients: the checks the SDK makes on the client (arguments,
message sizes, the local session-lock check, settlement), session acquisition with the SDK's retries, settlement
dispatch, connection strings, and one look of a waiting receive (`ReceiverCore.look`: the notify protocol's register /
look / leave steps). Nothing blocks here; the sync and aio receivers differ only in how they sleep (`_retry.Timer`).
Sources (the SDK's files and functions) and figures: docs/modules-product.md, section orderflow/embedded/_core.py."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus._pyamqp.error import TokenAuthFailure
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from azure.servicebus.exceptions import (
    MessageAlreadySettled,
    MessageLockLostError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusError,
    SessionLockLostError,
)

from . import notify
from ._access import authorize
from ._connection_string import broker_from_connection_string
from ._retry import Attempts, RetryPolicy, Timer
from .broker import ACTIVE, DEAD_LETTER, EmbeddedBroker, QueueCounts, SessionLock
from .broker._schema import _MIN_WAIT
from .config import QueueProperties
from .message import MAX_MESSAGE_SIZE_BYTES as MAX_MESSAGE_SIZE_BYTES  # re-exported
from .message import (
    ServiceBusReceivedMessage,
    StoredMessage,
    received_message,
)

DEFAULT_RECEIVE_WAIT_TIME_SECS = 60  # azure/servicebus/_common/constants.py
# The SDK lets the service wait this long for a NEXT_AVAILABLE_SESSION when the receiver has no max_wait_time
# (azure/servicebus/_transport/_pyamqp_transport.py `create_receive_client`).
DEFAULT_SESSION_ACCEPT_WAIT_SECS = 65
_TIMEOUT_CONDITION = b"com.microsoft:timeout"
NO_SESSION_DESCRIPTION = "No session available to receive from within max_wait_time."
LINK_OPEN_TIMEOUT = "Timed out waiting for the AMQP link to open."  # _common/utils.py check_link_ready_deadline
SHUTDOWN = "The handler has already been shutdown. Please use ServiceBusClient to create a new instance."
T = TypeVar("T")
_LOG = logging.getLogger("azure.servicebus")


def check_timeout(timeout: float | None) -> float | None:
    """The SDK's check of an operation's `timeout` keyword (the budget of all its attempts)."""
    if timeout is not None and timeout <= 0:
        raise ValueError("The timeout must be greater than 0.")
    return timeout


def check_entity(
    broker: EmbeddedBroker, queue: str, entity_path: str | None = None, claim: str = "Listen"
) -> QueueProperties:
    """What opening a link learns of its entity. Service Bus answers the put-token of a queue that does not exist
    with 404, which the SDK raises as a retryable ServiceBusAuthenticationError carrying a TokenAuthFailure
    (_pyamqp/cbs.py `handle_token`, _pyamqp_transport.py `create_servicebus_exception`): built by the SDK's code.
    Then the link needs `claim` (Send, Listen) on the queue: `_access.authorize`."""
    try:
        properties = broker.queue_properties(queue)
    except MessagingEntityNotFoundError:
        text = f"The messaging entity 'sb://embedded/{entity_path or queue}' could not be found."
        failure = TokenAuthFailure(404, text.encode())  # type: ignore[no-untyped-call]
        raise PyamqpTransport.create_servicebus_exception(_LOG, failure) from None
    authorize(broker, queue, claim, entity_path)
    return properties


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
        timer: Timer | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        if max_wait_time is not None and max_wait_time <= 0:
            raise ValueError("The max_wait_time must be greater than 0.")
        self.broker, self.queue, self.owner = broker, queue_name, owner
        self.sub = _sub_queue_name(sub_queue)
        self.receive_mode = ServiceBusReceiveMode(receive_mode)
        self.max_wait_time = max_wait_time
        self.prefetch_count = prefetch_count
        self.session_target = session_id
        self.timer = timer or Timer(lambda: broker.clock())
        self.retry = retry or RetryPolicy()
        self.lock: SessionLock | None = None
        self.lock_lost = False  # the service said the session lock is lost: the receiver is done (SDK `_lock_lost`)
        self.auto_renew_error: Exception | None = None
        self.running = True
        self._linked = False
        self._last_peeked = 0
        self._waiter: notify.Waiter | None = None
        self._key = ""
        self._holder = False
        self._more: bool | None = None  # whether ready messages remained after the last take (None: unknown)
        self._left = 0  # the last wait session that ended through `_leave` (not cut short)
        self.expect_idle = False  # the last receive left nothing ready: the next one will most likely wait

    def link(self) -> None:
        """What attaching the receive link checks, at the first operation as in the SDK (not when the receiver is
        made): the entity exists (`check_entity`), and its session-ness matches the receiver's."""
        if self._linked:
            return
        path = self.queue if self.sub == ACTIVE else f"{self.queue}/$DeadLetterQueue"
        requires_session = check_entity(self.broker, self.queue, path).requires_session
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
        self._linked = True

    @property
    def is_session(self) -> bool:
        return self.session_target is not None

    @property
    def opened(self) -> bool:
        return self._linked and (not self.is_session or self.lock is not None)

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
        """azure/servicebus/_base_handler.py `_check_live`: a closed receiver refuses; a session receiver whose
        lock was lost, or whose lock expiry has passed on the LOCAL clock, raises SessionLockLostError before it
        calls the service (`_servicebus_session.py` BaseSession._lock_expired: locked_until_utc <= utc_now())."""
        if not self.running:
            raise ValueError(SHUTDOWN)
        if self.is_session and (self.lock_lost or self.session_lock_expired()):
            raise SessionLockLostError(error=self.auto_renew_error)

    def session_lock_expired(self) -> bool:
        return self.lock is not None and self.lock.locked_until <= self.timer.now()

    @contextmanager
    def _session_call(self) -> Iterator[None]:
        """A call that may learn from the service that the session lock is lost: from then on every operation raises
        SessionLockLostError (_base_handler.py `_handle_exception`: `_session._lock_lost = True`)."""
        try:
            yield
        except SessionLockLostError:
            if self.lock is not None:
                self.lock_lost = True
            raise

    # -- accepting a session, with the SDK's retries ------------------------------------------------------------

    def attempts(self, budget: float | None) -> Attempts:
        """The attempts of one link open (`_open_with_retry`, or the first receive's, bounded by its wait)."""
        return Attempts(self.retry, self.timer, budget, self.session_target)

    def accept_wait(self, attempt_timeout: float | None) -> tuple[float, bool]:
        """How long one attempt waits for a session, and whether the client's own deadline (not the service's
        wait) ends it. A named session answers at once; for NEXT_AVAILABLE_SESSION the service waits the receiver's
        max_wait_time (the link's timeout property, `create_receive_client`) or its default."""
        if self.session_target is not NEXT_AVAILABLE_SESSION:
            return 0.0, False
        service = self.max_wait_time or DEFAULT_SESSION_ACCEPT_WAIT_SECS
        if attempt_timeout is not None and attempt_timeout < service:
            return max(attempt_timeout, 0.0), True
        return service, False

    @staticmethod
    def accept_timeout(client_deadline: bool) -> OperationTimeoutError:
        """The error of an attempt that found no session: the client's link deadline (`check_link_ready_deadline`),
        or the service's com.microsoft:timeout (the description is this mirror's)."""
        if client_deadline:
            return OperationTimeoutError(message=LINK_OPEN_TIMEOUT)
        return OperationTimeoutError(message=NO_SESSION_DESCRIPTION, condition=_TIMEOUT_CONDITION)

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
        if register_first and deadline > self.timer.monotonic():
            waiter.ensure_registered(self._key, epoch)
        result = attempt()
        remaining = deadline - self.timer.monotonic()
        if not result and remaining > 0 and waiter.ensure_registered(self._key, epoch):
            result = attempt()
            remaining = deadline - self.timer.monotonic()
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

    def batch_size(self, max_message_count: int | None) -> int:
        if max_message_count is not None and max_message_count <= 0:
            raise ValueError("The max_message_count must be greater than 0")
        return max_message_count if max_message_count is not None else self.prefetch_count

    def _received(self, stored: StoredMessage, **how: bool) -> ServiceBusReceivedMessage:
        return received_message(stored, self.owner, receive_mode=self.receive_mode, **how)

    def try_receive(self, count: int) -> list[ServiceBusReceivedMessage]:
        delete = self.receive_mode == ServiceBusReceiveMode.RECEIVE_AND_DELETE
        with self._session_call():
            taken = self.broker.take(self.queue, count, sub_queue=self.sub, session=self.lock, delete=delete)
        self._more = taken.more_ready
        self.expect_idle = not taken.more_ready
        return [self._received(s) for s in taken.messages]

    def receive_deferred(self, sequence_numbers: int | Sequence[int]) -> list[ServiceBusReceivedMessage]:
        numbers = [sequence_numbers] if isinstance(sequence_numbers, int) else list(sequence_numbers)
        if not numbers:
            return []  # _servicebus_receiver.py receive_deferred_messages: no-op on an empty list
        with self._session_call():
            stored = self.broker.receive_deferred(self.queue, numbers, session=self.lock)
        return [self._received(s, deferred=True) for s in stored]

    def peek(self, max_message_count: int, sequence_number: int) -> list[ServiceBusReceivedMessage]:
        if int(max_message_count) < 0:  # _servicebus_receiver.py peek_messages
            raise ValueError("max_message_count must be 1 or greater.")
        start = sequence_number or self._last_peeked + 1
        stored = self.broker.peek(self.queue, start, max_message_count, sub_queue=self.sub, session_id=self.session_id)
        if stored:
            self._last_peeked = stored[-1].sequence_number
        now = self.broker.clock()
        return [self._received(s, peeked=True, scheduled=s.enqueued_time_utc > now) for s in stored]

    def settle(self, message: ServiceBusReceivedMessage, action: str, checked: bool = False, **details: Any) -> None:
        """complete / abandon / defer / dead-letter, with the SDK's checks first (`check_settle`, unless `checked`).
        The outcome is awaited: the broker's answer (MessageLockLostError, SessionLockLostError) is the call's."""
        if not checked:
            self.check_settle(message, action)
        args = (self.queue, message._stored.sequence_number, _lock_token(message))
        with self._session_call():
            if action == MESSAGE_DEAD_LETTER:
                self.broker.dead_letter(
                    *args,
                    session=self.lock,
                    reason=details.get("reason"),
                    error_description=details.get("error_description"),
                )
            else:
                getattr(self.broker, action)(*args, session=self.lock)
        message._settled = True

    def check_settle(self, message: ServiceBusReceivedMessage, action: str) -> None:
        """The SDK's checks, in its order, before it calls the service (_servicebus_receiver.py
        `_settle_message_with_retry`): `_check_live` (closed; session lock lost or expired on the local clock), the
        message's type, `_check_message_alive` (receiver_mixins.py), then for a message of a non-session receiver
        its lock expiry on the local clock (`message._lock_expired`)."""
        self.check_live()
        if not isinstance(message, ServiceBusReceivedMessage):
            raise TypeError("Parameter 'message' must be of type ServiceBusReceivedMessage")
        self._check_message_alive(message, action)
        if not self.is_session and self._message_lock_expired(message):
            raise MessageLockLostError(
                message="The lock on the message lock has expired.", error=message.auto_renew_error
            )

    def _message_lock_expired(self, message: ServiceBusReceivedMessage) -> bool:
        until = message.locked_until_utc
        return until is not None and until <= self.timer.now()

    def _check_message_alive(self, message: ServiceBusReceivedMessage, action: str) -> None:
        """receiver_mixins.py `_check_message_alive` (its texts, missing spaces included)."""
        if message._is_peeked_message:
            raise ValueError(
                f"The operation {action} is not supported for peeked messages."
                "Only messages received using receive methods in PEEK_LOCK mode can be settled."
            )
        if self.receive_mode == ServiceBusReceiveMode.RECEIVE_AND_DELETE:
            raise ValueError(f"The operation {action} is not supported in 'RECEIVE_AND_DELETE' receive mode.")
        if message._settled:
            raise MessageAlreadySettled(action=action)

    def renew_message_lock(self, message: ServiceBusReceivedMessage, timeout: float | None = None) -> datetime:
        """_servicebus_receiver.py `renew_message_lock`: no local expiry check (the service answers)."""
        if self.is_session:
            raise TypeError(
                "Renewing message lock is an invalid operation when working with sessions."
                "Please renew the session lock instead."
            )
        self.check_live()
        self._check_message_alive(message, MESSAGE_RENEW_LOCK)
        if not message.lock_token:
            raise ValueError("Unable to renew lock - no lock token found.")
        check_timeout(timeout)
        until = _to_ms(
            self.broker.renew_message_lock(self.queue, message._stored.sequence_number, _lock_token(message))
        )
        message._expiry = until
        return until

    def renew_session_lock(self) -> datetime:
        with self._session_call():
            self.lock = self.broker.renew_session_lock(self.queue, self._held())
        return self.lock.locked_until

    def get_state(self) -> bytes | None:
        with self._session_call():
            return self.broker.get_session_state(self.queue, self._held())

    def set_state(self, state: str | bytes | bytearray | None) -> None:
        data = state.encode("utf-8") if isinstance(state, str) else (bytes(state) if state is not None else None)
        with self._session_call():
            self.broker.set_session_state(self.queue, self._held(), data)

    def _held(self) -> SessionLock:
        if self.lock is None:
            raise ValueError("The session has not been accepted yet; receive first or open the receiver.")
        return self.lock

    def close(self) -> None:
        """Release the session and stop: its unsettled messages count no delivery, unless its lock had expired
        (the broker's `release_session`, as Service Bus) or was lost (its connection dropped: left to expire)."""
        if self.lock is not None and not self.lock_lost:
            self.broker.release_session(self.queue, self.lock)
        self.running = False


MESSAGE_DEAD_LETTER, MESSAGE_RENEW_LOCK = "dead-letter", "renew"  # azure/servicebus/_common/constants.py


def _to_ms(moment: datetime) -> datetime:
    """A time as the SDK reads it from the service: milliseconds (utc_from_timestamp(ms / 1000.0))."""
    return datetime.fromtimestamp(int(moment.timestamp() * 1000) / 1000.0, UTC)


def _lock_token(message: ServiceBusReceivedMessage) -> str:
    token = message._stored.lock_token
    if not token:
        raise ValueError("Unable to renew lock - no lock token found.")
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
    sender and receiver classes and add close / context management in their own (sync or async) style.

    Keywords as the SDK's client: `retry_total`, `retry_backoff_factor`, `retry_backoff_max`, `retry_mode` (its
    defaults). `local_clock` (a callable returning an aware datetime): the client machine's clock, which the SDK
    compares lock expiry with (default: the broker's clock, one machine); `_timer` replaces the whole `Timer`."""

    sender_class: Any = None
    receiver_class: Any = None

    def __init__(
        self,
        broker: EmbeddedBroker,
        *,
        _owns_broker: bool = False,
        local_clock: Callable[[], datetime] | None = None,
        _timer: Timer | None = None,
        **options: Any,
    ) -> None:
        self.broker = broker
        self.fully_qualified_namespace = "embedded"
        self._owns_broker = _owns_broker
        self._timer = _timer or Timer(local_clock or (lambda: broker.clock()))  # read late: a test may set it
        self._retry = RetryPolicy().updated(options)
        # Weak, like the SDK's handler set: a long-running process that opens a receiver per session must not keep
        # every closed receiver alive.
        self._handlers: weakref.WeakSet[Any] = weakref.WeakSet()

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> Any:
        """`Endpoint=embedded://<db path>[;ConfigFile=<config path>]`; `clock=` (the broker's) may be passed for
        tests, and the client's keywords (`local_clock=`, `retry_total=`, ...)."""
        clock, infra = kwargs.pop("clock", None), kwargs.pop("infra", None)
        return cls(broker_from_connection_string(conn_str, clock=clock, infra=infra), _owns_broker=True, **kwargs)

    def get_queue_sender(self, queue_name: str, **kwargs: Any) -> Any:
        sender = self.sender_class(self.broker, queue_name, timer=self._timer, retry=self._retry.updated(kwargs))
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
            timer=self._timer,
            retry=self._retry.updated(kwargs),
        )
        self._handlers.add(receiver)
        return receiver
