"""Session conformance: exclusive session locks, FIFO per session, session lock expiry/renewal, state.

Source: https://learn.microsoft.com/azure/service-bus-messaging/message-sessions ("exclusive lock",
"first-in, first-out", "Session state", "Session lock"); seed 002 (Sequential Convoy: SessionId = OrderID).
SDK: azure/servicebus/_servicebus_session.py (get_state/set_state/renew_lock), exceptions.py
(SessionCannotBeLockedError, SessionLockLostError, OperationTimeoutError for NEXT_AVAILABLE_SESSION).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import timedelta

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusSubQueue
from azure.servicebus.exceptions import (
    OperationTimeoutError,
    ServiceBusError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

from orderflow.embedded.client import ServiceBusMessage

SHORT = 0.05


def _send(client, q: str, session: str, *bodies: str) -> None:
    with client.get_queue_sender(q) as sender:
        sender.send_messages([ServiceBusMessage(b, session_id=session) for b in bodies])


def test_fifo_per_session_under_four_concurrent_consumers(client, queue):
    q = queue(requires_session=True)
    sessions, per_session = 12, 15
    with client.get_queue_sender(q) as sender:
        for i in range(per_session):  # interleaved across sessions, as orders arrive
            sender.send_messages([ServiceBusMessage(f"{s}:{i}", session_id=f"order-{s}") for s in range(sessions)])
    received: dict[str, list[int]] = defaultdict(list)
    guard = threading.Lock()
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            while True:
                try:
                    receiver = client.get_queue_receiver(
                        q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=0.2, retry_total=0
                    )
                    receiver.__enter__()
                except OperationTimeoutError:
                    return  # no session with messages left
                with receiver:
                    for msg in receiver.receive_messages(4, max_wait_time=SHORT):  # part of a session, then let go
                        with guard:
                            received[msg.session_id].append(int(str(msg).split(":")[1]))
                        receiver.complete_message(msg)
        except BaseException as exc:  # noqa: BLE001 - surfaced in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert set(received) == {f"order-{s}" for s in range(sessions)}
    for order in received.values():
        assert order == list(range(per_session))  # every message once, in send order


def test_session_is_locked_exclusively(client, queue):
    q = queue(requires_session=True)
    _send(client, q, "A", "a1")
    _send(client, q, "B", "b1")
    first = client.get_queue_receiver(q, session_id="A")
    first.__enter__()
    # retry_total=0: the SDK would retry these retryable errors 3 times first (test_bus_sdk_parity.py).
    with pytest.raises(SessionCannotBeLockedError):
        client.get_queue_receiver(q, session_id="A", retry_total=0).__enter__()
    with client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=SHORT) as other:
        assert other.session.session_id == "B"  # the locked session A is skipped
        with pytest.raises(OperationTimeoutError):  # and nothing else is available
            client.get_queue_receiver(
                q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=SHORT, retry_total=0
            ).__enter__()
    first.close()
    with client.get_queue_receiver(q, session_id="A") as again:  # released on close
        assert [str(m) for m in again.receive_messages(max_wait_time=SHORT)] == ["a1"]


def test_next_available_session_times_out_with_operation_timeout(client, queue):
    q = queue(requires_session=True)
    with pytest.raises(OperationTimeoutError):
        client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=SHORT).receive_messages()


def test_session_receiver_gets_only_its_session_in_order(client, queue):
    q = queue(requires_session=True)
    _send(client, q, "A", "a1")
    _send(client, q, "B", "b1")
    _send(client, q, "A", "a2", "a3")
    with client.get_queue_receiver(q, session_id="A") as receiver:
        first = receiver.receive_messages(1, max_wait_time=SHORT)
        rest = receiver.receive_messages(5, max_wait_time=SHORT)
        assert [str(m) for m in first + rest] == ["a1", "a2", "a3"]
        receiver.abandon_message(first[0])  # back to the head of the session
        assert [str(m) for m in receiver.receive_messages(5, max_wait_time=SHORT)] == ["a1"]


def test_session_lock_expires_and_another_receiver_takes_over(client, queue, clock):
    q = queue(requires_session=True, lock_duration="PT30S")
    _send(client, q, "A", "a1")
    stale = client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION)
    [msg] = stale.receive_messages(max_wait_time=SHORT)
    assert stale.session.locked_until_utc == clock.now + timedelta(seconds=30)
    assert msg.locked_until_utc is None  # a session message is held by the session lock (SDK)
    clock.advance(31)
    with client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=SHORT) as fresh:
        [again] = fresh.receive_messages(max_wait_time=SHORT)
        assert again.sequence_number == msg.sequence_number and again.delivery_count == 1
        with pytest.raises(SessionLockLostError):
            stale.complete_message(msg)
        with pytest.raises(SessionLockLostError):
            stale.session.renew_lock()
        fresh.complete_message(again)


def test_session_renew_lock_keeps_the_session(client, queue, clock):
    q = queue(requires_session=True, lock_duration="PT30S")
    _send(client, q, "A", "a1")
    with client.get_queue_receiver(q, session_id="A") as receiver:
        [msg] = receiver.receive_messages(max_wait_time=SHORT)
        clock.advance(20)
        assert receiver.session.renew_lock() == clock.now + timedelta(seconds=30)
        clock.advance(20)
        with pytest.raises(SessionCannotBeLockedError):
            client.get_queue_receiver(q, session_id="A", retry_total=0).__enter__()
        with pytest.raises(TypeError):  # SDK: message locks cannot be renewed in a session
            receiver.renew_message_lock(msg)
        receiver.complete_message(msg)


def test_session_state_roundtrip(client, queue):
    q = queue(requires_session=True)
    with client.get_queue_receiver(q, session_id="A") as receiver:
        assert receiver.session.get_state() is None
        receiver.session.set_state("step-2")
        assert receiver.session.get_state() == b"step-2"
    with client.get_queue_receiver(q, session_id="A") as receiver:
        assert receiver.session.get_state() == b"step-2"  # state outlives the lock
        receiver.session.set_state(None)
        assert receiver.session.get_state() is None


def test_send_without_session_id_to_session_queue_is_rejected(client, queue):
    q = queue(requires_session=True)
    with pytest.raises(ServiceBusError, match="SessionId was not set"):
        client.get_queue_sender(q).send_messages(ServiceBusMessage("x"))
    assert client.broker.counts(q).active == 0


def test_sessionless_receiver_on_session_queue_and_vice_versa_error(client, queue):
    # Refused when the link attaches (first use), as with the SDK, not when the receiver is made.
    sessionless = client.get_queue_receiver(queue(requires_session=True))
    with pytest.raises(ServiceBusError, match="requires sessions"):
        sessionless.receive_messages(max_wait_time=SHORT)
    with pytest.raises(ServiceBusError, match="does not require sessions"):
        client.get_queue_receiver(queue(), session_id="A").__enter__()


def test_dead_letter_queue_of_session_queue_is_sessionless(client, queue):
    q = queue(requires_session=True)
    _send(client, q, "A", "a1")
    with client.get_queue_receiver(q, session_id="A") as receiver:
        [msg] = receiver.receive_messages(max_wait_time=SHORT)
        receiver.dead_letter_message(msg, reason="r")
    [dead] = client.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER).receive_messages(
        max_wait_time=SHORT
    )
    assert (dead.session_id, dead.dead_letter_reason) == ("A", "r")


def test_counts_sessions_with_backlog(client, queue):
    q = queue(requires_session=True)
    _send(client, q, "A", "a1", "a2")
    _send(client, q, "B", "b1")
    counts = client.broker.counts(q)
    assert (counts.active, counts.sessions_with_backlog) == (3, 2)


def test_a_stale_session_receiver_cannot_release_the_new_holders_messages(client, queue, clock) -> None:  # type: ignore[no-untyped-def]
    # Service Bus: once a session lock expires and another receiver accepts the session, the old receiver can no
    # longer settle or release anything in it (message-sessions docs: the lock is exclusive to its holder).
    from azure.servicebus import NEXT_AVAILABLE_SESSION

    from orderflow.embedded.client import ServiceBusMessage

    q = queue(requires_session=True, max_delivery_count=5)
    with client.get_queue_sender(q) as sender:
        sender.send_messages(ServiceBusMessage(b"m1", session_id="S", message_id="m1"))
    stale = client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1)
    stale.__enter__()
    stale.receive_messages(max_message_count=1, max_wait_time=1)
    clock.advance(61)  # the first holder overran its session lock (LockDuration 60 s)
    holder = client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1)
    holder.__enter__()
    [message] = holder.receive_messages(max_message_count=1, max_wait_time=1)
    try:
        stale.close()
    except Exception:  # noqa: BLE001 - closing a receiver whose lock is lost may report it
        pass
    holder.complete_message(message)  # still the holder's: no MessageLockLostError
    holder.close()
    with client.get_queue_receiver(q, session_id="S", max_wait_time=0.2) as check:
        assert check.peek_messages(max_message_count=5) == []
