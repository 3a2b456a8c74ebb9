"""The Service Bus behaviours every client path is held to, as a table of scenarios: each a function of a `Bus`
(a client factory, and a clock when the scenario needs time to pass) and fresh `Queues`. The unmodified
azure-servicebus SDK runs them against the AMQP endpoint (tests/standins/amqp/, `SdkBus`), the embedded client on the
broker file (tests/standins/broker/test_bus_scenarios_embedded.py, `EmbeddedBus`), each sync and aio, concurrently
(`run_concurrently`). Each scenario names the Azure source of what it expects."""

from __future__ import annotations

import logging
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage, ServiceBusMessageState, ServiceBusReceiveMode
from azure.servicebus._pyamqp.error import TokenAuthFailure
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from azure.servicebus.exceptions import (
    MessageLockLostError,
    MessageSizeExceededError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    ServiceBusError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

from orderflow.embedded.broker import EmbeddedBroker
from support.aio_bridge import LoopThread, Synced

LOCK_SECONDS = 30  # every queue's LockDuration: long against the test, short against the clock's steps
MAX_DELIVERY_COUNT = 5
# Queue roles → Config.json `Properties` (the emulator's format, orderflow/embedded/config.py).
QUEUE_PROPERTIES: dict[str, dict[str, Any]] = {
    "plain": {"LockDuration": f"PT{LOCK_SECONDS}S", "MaxDeliveryCount": MAX_DELIVERY_COUNT},
    "sessions": {"RequiresSession": True, "LockDuration": f"PT{LOCK_SECONDS}S", "MaxDeliveryCount": MAX_DELIVERY_COUNT},
    "dedup": {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT10M"},
    "premium": {"MaxMessageSizeInKilobytes": 1024},  # a Premium entity's own limit (Premium's default, 1 MB)
}


@dataclass(frozen=True)
class Queues:
    """Fresh queue names for one scenario, one per role of QUEUE_PROPERTIES, and a name no queue has."""

    plain: str
    sessions: str
    dedup: str
    premium: str
    missing: str

    @classmethod
    def fresh(cls) -> Queues:
        tag = uuid.uuid4().hex[:10]
        return cls(f"plain-{tag}", f"sessions-{tag}", f"dedup-{tag}", f"premium-{tag}", f"missing-{tag}")

    def config(self) -> dict[str, Any]:
        """These queues as a Config.json document."""
        queues = [{"Name": getattr(self, role), "Properties": props} for role, props in QUEUE_PROPERTIES.items()]
        return {"UserConfig": {"Namespaces": [{"Name": "scenarios", "Queues": queues}]}}


class Bus(Protocol):
    """What a scenario runs against: `client()` gives a ServiceBusClient (sync surface, a context manager);
    `advance(seconds)` moves the broker's clock (only on a bus whose `controls_clock` is true)."""

    controls_clock: bool

    def client(self) -> Any: ...

    def advance(self, seconds: float) -> None: ...


def declare(db_path: Path, queues: Queues) -> Queues:
    """Declare `queues` in the broker file `db_path` (what every bus of the scenarios serves)."""
    broker = EmbeddedBroker(db_path)
    broker.load_config(queues.config())
    broker.close()
    return queues


class OffsetClock:
    """The real time plus an offset the test moves: a client's own clock checks stay coherent with the broker's."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


FLAVORS = ("sync", "aio")


class FlavoredBus:
    """A `Bus` on a client library's sync client, or its aio client driven through support.aio_bridge; `clock` is
    the broker's when the test moves it. Subclasses make the two clients."""

    flavor: str
    loop: LoopThread
    clock: OffsetClock | None

    @property
    def controls_clock(self) -> bool:
        return self.clock is not None

    def sync_client(self) -> Any:
        raise NotImplementedError

    def aio_client(self) -> Any:
        raise NotImplementedError

    def client(self) -> Any:
        if self.flavor == "sync":
            return self.sync_client()
        return Synced(self.loop.call(self.aio_client), self.loop)  # made on the loop, as an aio client expects

    def advance(self, seconds: float) -> None:
        assert self.clock is not None, "this bus does not control the broker's clock"
        self.clock.advance(seconds)


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[Bus, Queues], None]
    source: str
    needs_clock: bool = False


SCENARIOS: list[Scenario] = []


def scenario(source: str, *, needs_clock: bool = False) -> Callable[[Callable[[Bus, Queues], None]], Any]:
    def register(function: Callable[[Bus, Queues], None]) -> Callable[[Bus, Queues], None]:
        SCENARIOS.append(Scenario(function.__name__, function, source, needs_clock))
        return function

    return register


# -- helpers ------------------------------------------------------------------------------------------------


def text(value: Any) -> Any:
    """pyamqp hands string properties back as bytes (keys and values); the mirror as str. Compare as str."""
    return value.decode() if isinstance(value, bytes) else value


def props(message: Any) -> dict[str, Any]:
    return {text(k): text(v) for k, v in (message.application_properties or {}).items()}


def receive(receiver: Any, count: int, wait: float = 5.0) -> list[Any]:
    """Receive until `count` messages arrived or `wait` seconds passed (each call bounded)."""
    got: list[Any] = []
    deadline = time.monotonic() + wait
    while len(got) < count and time.monotonic() < deadline:
        got += receiver.receive_messages(max_message_count=count - len(got), max_wait_time=1)
    return got


def nothing_more(receiver: Any) -> None:
    assert receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []


def put_token_refused(status: int, entity: str = "sb://example.servicebus.windows.net/nowhere") -> ServiceBusError:
    """What the SDK raises when a link's put-token is answered `status` (404: no such queue), built by its own code:
    _pyamqp/cbs.py `handle_token` raises TokenAuthFailure, _pyamqp_transport.py `create_servicebus_exception` maps
    it (ServiceBusAuthenticationError)."""
    failure = TokenAuthFailure(status, f"The messaging entity '{entity}' could not be found.".encode())
    return PyamqpTransport.create_servicebus_exception(logging.getLogger("azure.servicebus"), failure)


# -- sending and receiving --------------------------------------------------------------------------------------


@scenario("azure/servicebus/_common/message.py ServiceBusReceivedMessage properties; service-bus-messages-payloads")
def send_and_receive_properties(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.plain) as sender:
            sender.send_messages(
                ServiceBusMessage(
                    "hello",
                    message_id="m-1",
                    subject="order.submitted",
                    correlation_id="c-1",
                    content_type="application/json",
                    reply_to="replies",
                    to="someone",
                    time_to_live=timedelta(minutes=5),
                    application_properties={"tenant": "contoso", "n": 7},
                )
            )
        with client.get_queue_receiver(q.plain) as receiver:
            [message] = receive(receiver, 1)
            assert str(message) == "hello"
            assert (message.message_id, message.subject, message.correlation_id) == ("m-1", "order.submitted", "c-1")
            assert (message.content_type, message.reply_to, message.to) == ("application/json", "replies", "someone")
            assert message.time_to_live == timedelta(minutes=5)
            assert props(message) == {"tenant": "contoso", "n": 7}
            assert message.sequence_number >= 1 and message.enqueued_sequence_number == message.sequence_number
            assert abs(message.enqueued_time_utc - datetime.now(UTC)) < timedelta(minutes=1)
            assert message.delivery_count == 0  # pyamqp reports the AMQP header: 0 on the first delivery
            assert message.lock_token is not None and message.locked_until_utc > datetime.now(UTC)
            receiver.complete_message(message)
            nothing_more(receiver)


@scenario("azure/servicebus/_servicebus_sender.py create_message_batch; one transfer, message-format 0x80013700")
def batch_send(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.plain) as sender:
            batch = sender.create_message_batch()
            for i in range(3):
                batch.add_message(ServiceBusMessage(f"b{i}", subject=f"s{i}"))
            sender.send_messages(batch)
            sender.send_messages([ServiceBusMessage("l0"), ServiceBusMessage("l1")])  # a list is sent as a batch
        with client.get_queue_receiver(q.plain, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
            got = receive(receiver, 5)
            assert [str(m) for m in got] == ["b0", "b1", "b2", "l0", "l1"]
            assert [m.subject for m in got[:3]] == ["s0", "s1", "s2"]


@scenario("message-transfers-locks-settlement: complete removes; abandon redelivers with delivery count + 1")
def complete_and_abandon(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.plain) as sender:
            sender.send_messages([ServiceBusMessage("done"), ServiceBusMessage("again")])
        with client.get_queue_receiver(q.plain) as receiver:
            first, second = receive(receiver, 2)
            receiver.complete_message(first)
            receiver.abandon_message(second)
            [redelivered] = receive(receiver, 1)
            assert str(redelivered) == "again" and redelivered.delivery_count == second.delivery_count + 1
            assert redelivered.sequence_number == second.sequence_number
            receiver.complete_message(redelivered)
            nothing_more(receiver)


@scenario("message-deferral: a deferred message comes back only by its sequence number")
def defer_and_receive_deferred(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.plain) as sender:
            sender.send_messages(ServiceBusMessage("later"))
        with client.get_queue_receiver(q.plain) as receiver:
            [message] = receive(receiver, 1)
            receiver.defer_message(message)
            nothing_more(receiver)
            [deferred] = receiver.receive_deferred_messages([message.sequence_number])
            assert str(deferred) == "later" and deferred.state == ServiceBusMessageState.DEFERRED
            assert deferred.lock_token is not None
            receiver.complete_message(deferred)
            assert receiver.peek_messages(5, sequence_number=1) == []


@scenario("service-bus-dead-letter-queues: reason and description, as DeadLetterReason/-ErrorDescription properties")
def dead_letter_with_reason(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.plain) as sender:
            sender.send_messages(ServiceBusMessage("poison", application_properties={"k": "v"}))
        with client.get_queue_receiver(q.plain) as receiver:
            [message] = receive(receiver, 1)
            receiver.dead_letter_message(message, reason="BadInput", error_description="field x is missing")
            nothing_more(receiver)
        with client.get_queue_receiver(q.plain, sub_queue="deadletter") as dead:
            [letter] = receive(dead, 1)
            assert str(letter) == "poison"
            assert letter.dead_letter_reason == "BadInput"
            assert letter.dead_letter_error_description == "field x is missing"
            assert props(letter) == {
                "k": "v",
                "DeadLetterReason": "BadInput",
                "DeadLetterErrorDescription": "field x is missing",
            }  # azure-sdk-for-python tests/test_sessions.py reads both from application_properties
            dead.complete_message(letter)


@scenario("message-transfers-locks-settlement: receive-and-delete settles on delivery")
def receive_and_delete(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.plain) as sender:
            sender.send_messages([ServiceBusMessage("x"), ServiceBusMessage("y")])
        mode = ServiceBusReceiveMode.RECEIVE_AND_DELETE
        with client.get_queue_receiver(q.plain, receive_mode=mode) as receiver:
            got = receive(receiver, 2)
            assert [str(m) for m in got] == ["x", "y"] and got[0].lock_token is None
            with pytest.raises(ValueError):  # receiver_mixins.py _check_message_alive
                receiver.complete_message(got[0])
        with client.get_queue_receiver(q.plain) as receiver:
            nothing_more(receiver)


@scenario("_servicebus_receiver.py peek_messages: browse without locking, from a sequence number")
def peek(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.plain) as sender:
            sender.send_messages([ServiceBusMessage("p0"), ServiceBusMessage("p1"), ServiceBusMessage("p2")])
        with client.get_queue_receiver(q.plain) as receiver:
            peeked = receiver.peek_messages(2, sequence_number=1)
            assert [str(m) for m in peeked] == ["p0", "p1"] and all(m.lock_token is None for m in peeked)
            more = receiver.peek_messages(5)  # continues after the last one peeked
            assert [str(m) for m in more] == ["p2"]
            assert [str(m) for m in receive(receiver, 3)] == ["p0", "p1", "p2"]  # peeking locked nothing


# Timed: the service sets the lock to its now + LockDuration in milliseconds, so a renew within the receive's
# millisecond (the in-process embedded client manages that most of the time) returns the very same time. The clock
# moves a second between the two, well inside the lock, and the lock must move with it.
@scenario("_servicebus_receiver.py renew_message_lock: the lock moves forward", needs_clock=True)
def renew_message_lock(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.plain) as sender:
            sender.send_messages(ServiceBusMessage("long job"))
        with client.get_queue_receiver(q.plain) as receiver:
            [message] = receive(receiver, 1)
            before = message.locked_until_utc
            bus.advance(1)
            renewed = receiver.renew_message_lock(message)
            assert renewed > before and message.locked_until_utc == renewed
            receiver.complete_message(message)


@scenario("duplicate-detection: a MessageId seen within the window is accepted and dropped")
def duplicate_detection(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.dedup) as sender:
            sender.send_messages(ServiceBusMessage("once", message_id="same-id"))
            sender.send_messages(ServiceBusMessage("twice", message_id="same-id"))
            sender.send_messages(ServiceBusMessage("other", message_id="other-id"))
        with client.get_queue_receiver(q.dedup, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
            assert [str(m) for m in receive(receiver, 2)] == ["once", "other"]
            nothing_more(receiver)


@scenario("message-sequencing: scheduled messages are peekable as scheduled and cancellable")
def schedule_and_cancel(bus: Bus, q: Queues) -> None:
    at = datetime.now(UTC) + timedelta(hours=1)
    with bus.client() as client:
        with client.get_queue_sender(q.plain) as sender:
            [seq] = sender.schedule_messages(ServiceBusMessage("tomorrow"), at)
            with client.get_queue_receiver(q.plain) as receiver:
                [peeked] = receiver.peek_messages(1, sequence_number=seq)
                assert peeked.state == ServiceBusMessageState.SCHEDULED
                assert abs(peeked.scheduled_enqueue_time_utc - at) < timedelta(seconds=1)
                nothing_more(receiver)
                sender.cancel_scheduled_messages(seq)
                assert receiver.peek_messages(5, sequence_number=seq) == []


@scenario("service-bus-quotas: 256 KB per message (Standard); MessageSizeExceededError")
def message_size_limit(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.plain) as sender:
            with pytest.raises(MessageSizeExceededError):
                sender.send_messages(ServiceBusMessage(b"x" * (300 * 1024)))
            batch = sender.create_message_batch()
            assert batch.max_size_in_bytes == 256 * 1024  # what the link's attach announced
            batch.add_message(ServiceBusMessage(b"y" * (200 * 1024)))
            with pytest.raises(MessageSizeExceededError):
                batch.add_message(ServiceBusMessage(b"z" * (100 * 1024)))
            sender.send_messages(ServiceBusMessage("small"))  # the link is still usable
        with client.get_queue_receiver(q.plain, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
            assert [str(m) for m in receive(receiver, 1)] == ["small"]


@scenario("service-bus-quotas: the message size includes the size of properties (system and user) and the payload")
def message_size_counts_properties(bus: Bus, q: Queues) -> None:
    body = b"b" * (200 * 1024)
    # Two properties of 30,000 characters: within the service's 32 KB per property and 64 KB for the whole header.
    heavy = {"note-1": "n" * 30_000, "note-2": "m" * 30_000}
    with bus.client() as client:
        with client.get_queue_sender(q.plain) as sender:
            sender.send_messages(ServiceBusMessage(body, message_id="body-only"))
            with pytest.raises(MessageSizeExceededError):  # the body fits; with its properties the message does not
                sender.send_messages(
                    ServiceBusMessage(body, message_id="with-properties", application_properties=heavy)
                )
            with pytest.raises(MessageSizeExceededError):
                sender.schedule_messages(
                    ServiceBusMessage(body, application_properties=heavy), datetime.now(UTC) + timedelta(hours=1)
                )
        with client.get_queue_receiver(q.plain, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
            assert [m.message_id for m in receive(receiver, 1)] == ["body-only"]
            nothing_more(receiver)


@scenario(
    "service-bus-premium-messaging, large messages: the entity's maxMessageSizeInKilobytes; _servicebus_sender.py"
)
def premium_message_size(bus: Bus, q: Queues) -> None:
    # The link announces the entity's 1 MB; the SDK then makes batches of MAX_BATCH_SIZE_PREMIUM (1 MB:
    # _servicebus_sender.py `_open`), and the service refuses a single message past the entity's limit.
    big = b"p" * (600 * 1024)  # over Standard's 256 KB
    with bus.client() as client:
        with client.get_queue_sender(q.premium) as sender:
            assert sender.create_message_batch().max_size_in_bytes == 1024 * 1024
            with pytest.raises(ValueError):
                sender.create_message_batch(max_size_in_bytes=1024 * 1024 + 1)
            sender.send_messages(ServiceBusMessage(big, message_id="large"))
            with pytest.raises(MessageSizeExceededError):
                sender.send_messages(ServiceBusMessage(b"q" * (1024 * 1024), message_id="too-large"))
            with pytest.raises(MessageSizeExceededError):  # a list is one batch, of at most 1 MB
                sender.send_messages([ServiceBusMessage(big), ServiceBusMessage(big)])
        with client.get_queue_receiver(q.premium, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
            [message] = receive(receiver, 1)
            assert message.message_id == "large" and b"".join(message.body) == big
            nothing_more(receiver)


@scenario("service-bus-quotas: MessageId, SessionId 128 characters; _common/message.py ServiceBusMessage setters")
def message_and_session_id_lengths(bus: Bus, q: Queues) -> None:
    longest = "i" * 128
    for field in ("message_id", "session_id", "partition_key"):
        with pytest.raises(ValueError, match=f"{field} cannot be longer than 128 characters"):
            ServiceBusMessage("x", **{field: "i" * 129})
    with bus.client() as client:
        with client.get_queue_sender(q.sessions) as sender:
            sender.send_messages(ServiceBusMessage("x", message_id=longest, session_id=longest))
        with client.get_queue_receiver(q.sessions, session_id=longest) as receiver:
            [message] = receive(receiver, 1)
            assert (message.message_id, message.session_id, receiver.session.session_id) == (longest,) * 3
            receiver.complete_message(message)


@scenario("azure-sdk-for-python tests/test_sessions.py test_session_connection_failure_is_idempotent: put-token 404")
def entity_not_found(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with pytest.raises(ServiceBusAuthenticationError) as sending:
            with client.get_queue_sender(q.missing) as sender:
                sender.send_messages(ServiceBusMessage("nowhere"))
        with pytest.raises(ServiceBusAuthenticationError) as receiving:
            with client.get_queue_receiver(q.missing) as receiver:
                receiver.receive_messages(max_wait_time=0.5)
    for caught in (sending, receiving):  # the SDK's TokenAuthFailure carries the put-token's status
        assert getattr(caught.value.inner_exception, "status_code", None) == 404


# -- sessions -------------------------------------------------------------------------------------------------


@scenario("message-sessions: a named session's messages, first in first out, and only its own")
def session_fifo(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.sessions) as sender:
            sender.send_messages(ServiceBusMessage("b0", session_id="B"))  # the oldest message is another session's
            sender.send_messages([ServiceBusMessage(f"a{i}", session_id="A") for i in range(3)])
            sender.send_messages(ServiceBusMessage("b1", session_id="B"))
            sender.send_messages(ServiceBusMessage("a3", session_id="A"))
        with client.get_queue_receiver(q.sessions, session_id="A") as receiver:
            assert receiver.session.session_id == "A"
            got = receive(receiver, 4)
            assert [str(m) for m in got] == ["a0", "a1", "a2", "a3"] and {m.session_id for m in got} == {"A"}
            for message in got:
                receiver.complete_message(message)
            nothing_more(receiver)


@scenario("message-sessions: NEXT_AVAILABLE_SESSION accepts a session with messages, and reports its id")
def next_available_session(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.sessions) as sender:
            sender.send_messages([ServiceBusMessage("one", session_id="S1"), ServiceBusMessage("two", session_id="S2")])
        seen = []
        for _ in range(2):
            with client.get_queue_receiver(q.sessions, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5) as receiver:
                session_id = receiver.session.session_id
                [message] = receive(receiver, 1)
                assert message.session_id == session_id and receiver.session.locked_until_utc is not None
                receiver.complete_message(message)
                seen.append(session_id)
        assert sorted(seen) == ["S1", "S2"]


@scenario("_pyamqp_transport.py create_receive_client: com.microsoft:timeout → OperationTimeoutError")
def no_session_available(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with pytest.raises(OperationTimeoutError):
            with client.get_queue_receiver(q.sessions, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1) as receiver:
                receiver.receive_messages(max_wait_time=1)


@scenario("message-sessions: a session is locked by one receiver; SessionCannotBeLockedError")
def session_exclusive(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.sessions) as sender:
            sender.send_messages(ServiceBusMessage("mine", session_id="X"))
        with client.get_queue_receiver(q.sessions, session_id="X") as holder:
            [message] = receive(holder, 1)
            with pytest.raises(SessionCannotBeLockedError):
                with client.get_queue_receiver(q.sessions, session_id="X", max_wait_time=1) as other:
                    other.receive_messages(max_wait_time=1)
            holder.complete_message(message)


@scenario("_servicebus_session.py renew_lock, get_state, set_state")
def session_renew_and_state(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.sessions) as sender:
            sender.send_messages(ServiceBusMessage("s", session_id="ST"))
        with client.get_queue_receiver(q.sessions, session_id="ST") as receiver:
            assert receiver.session.get_state() is None
            receiver.session.set_state(b"step-2")
            assert receiver.session.get_state() == b"step-2"
            before = receiver.session.locked_until_utc
            renewed = receiver.session.renew_lock()
            assert renewed > before and receiver.session.locked_until_utc == renewed
        with client.get_queue_receiver(q.sessions, session_id="ST") as receiver:
            assert receiver.session.get_state() == b"step-2"  # the state outlives the lock
            receiver.session.set_state(None)
            assert receiver.session.get_state() is None


@scenario("message-sessions, Impact of delivery count: a session closed with its messages unsettled counts none")
def session_close_counts_no_delivery(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.sessions) as sender:
            sender.send_messages(ServiceBusMessage("unsettled", session_id="C"))
        with client.get_queue_receiver(q.sessions, session_id="C") as receiver:
            [first] = receive(receiver, 1)
        with client.get_queue_receiver(q.sessions, session_id="C") as receiver:
            [again] = receive(receiver, 1)
            assert again.sequence_number == first.sequence_number and again.delivery_count == first.delivery_count
            receiver.complete_message(again)


# -- time passing (a bus that controls the broker's clock) ---------------------------------------------------------


@scenario("message-transfers-locks-settlement: an expired lock is lost; redelivery counts", needs_clock=True)
def message_lock_expiry(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.plain) as sender:
            sender.send_messages(ServiceBusMessage("slow"))
        with client.get_queue_receiver(q.plain) as receiver:
            [message] = receive(receiver, 1)
            bus.advance(LOCK_SECONDS + 1)
            with pytest.raises(MessageLockLostError):
                receiver.complete_message(message)
            [again] = receive(receiver, 1)
            assert again.sequence_number == message.sequence_number
            assert again.delivery_count == message.delivery_count + 1
            receiver.complete_message(again)


@scenario("message-sessions, Impact of delivery count: an expired session lock counts one", needs_clock=True)
def session_lock_expiry(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.sessions) as sender:
            sender.send_messages(ServiceBusMessage("held", session_id="E"))
        with client.get_queue_receiver(q.sessions, session_id="E") as receiver:
            [message] = receive(receiver, 1)
            bus.advance(LOCK_SECONDS + 1)
            with pytest.raises(SessionLockLostError):
                receiver.complete_message(message)
        with client.get_queue_receiver(q.sessions, session_id="E") as receiver:
            [again] = receive(receiver, 1)
            assert again.delivery_count == message.delivery_count + 1  # a lost lock is a failed delivery
            receiver.complete_message(again)


@scenario("message-sequencing: a scheduled message is delivered once its time comes", needs_clock=True)
def scheduled_delivery(bus: Bus, q: Queues) -> None:
    with bus.client() as client:
        with client.get_queue_sender(q.plain) as sender:
            sender.schedule_messages(ServiceBusMessage("at noon"), datetime.now(UTC) + timedelta(minutes=10))
        with client.get_queue_receiver(q.plain) as receiver:
            nothing_more(receiver)
            bus.advance(11 * 60)
            [message] = receive(receiver, 1)
            assert str(message) == "at noon"
            receiver.complete_message(message)


# -- running them ------------------------------------------------------------------------------------------------

SCENARIO_TIMEOUT = 90.0
Outcome = tuple[BaseException, str] | None


def run_concurrently(jobs: dict[tuple[str, str], Callable[[], None]]) -> dict[tuple[str, str], Outcome]:
    """Run every job at once, each on its own thread (the clients spend most of a scenario waiting); what each
    raised, with its traceback, or None."""

    def outcome(job: Callable[[], None]) -> Outcome:
        try:
            job()
        except BaseException as exc:  # noqa: BLE001 - reported by the test of that scenario
            return exc, traceback.format_exc()
        return None

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {key: pool.submit(outcome, job) for key, job in jobs.items()}
        return {key: future.result(SCENARIO_TIMEOUT) for key, future in futures.items()}


def report(outcome: Outcome) -> None:
    """Fail the calling test with what its scenario raised."""
    if outcome is not None:
        exc, trace = outcome
        raise AssertionError(f"{type(exc).__name__}: {exc}\n\n{trace}") from exc
