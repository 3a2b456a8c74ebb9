"""Peek-lock conformance: locks, settlement, delivery count, MaxDeliveryCount, dead-lettering, lock loss.

Source: https://learn.microsoft.com/azure/service-bus-messaging/message-transfers-locks-settlement
("Peek-lock", "Settling receive operations") and .../service-bus-dead-letter-queues; SDK behaviour from
azure/servicebus/_servicebus_receiver.py and _common/receiver_mixins.py (`_check_message_alive`).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from azure.servicebus import ServiceBusReceiveMode, ServiceBusSubQueue
from azure.servicebus.exceptions import (
    MessageAlreadySettled,
    MessageLockLostError,
    ServiceBusAuthenticationError,
    ServiceBusError,
)

from orderflow.embedded.client import ServiceBusClient, ServiceBusMessage

SHORT = 0.05  # max_wait_time for "nothing is there" checks


def _send(client, queue: str, *bodies: str) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(b) for b in bodies])


def test_locked_message_is_invisible_and_complete_deletes_it(client, queue):
    q = queue()
    _send(client, q, "a")
    first, second = client.get_queue_receiver(q), client.get_queue_receiver(q)
    [msg] = first.receive_messages(max_wait_time=SHORT)
    assert second.receive_messages(max_wait_time=SHORT) == []  # locked → invisible to other receivers
    first.complete_message(msg)
    assert client.broker.counts(q).active == 0


def test_abandon_redelivers_with_delivery_count_plus_one(client, queue):
    # SDK docstring: "The count is incremented when a message lock expires or the message is explicitly
    # abandoned" (ServiceBusReceivedMessage.delivery_count); the first delivery reports 0.
    q = queue()
    _send(client, q, "a")
    receiver = client.get_queue_receiver(q)
    [msg] = receiver.receive_messages(max_wait_time=SHORT)
    assert msg.delivery_count == 0
    receiver.abandon_message(msg)
    [again] = receiver.receive_messages(max_wait_time=SHORT)
    assert (again.message_id, again.delivery_count) == (msg.message_id, 1)


def test_redelivery_after_lock_expiry(client, queue, clock):
    q = queue(lock_duration="PT30S")
    _send(client, q, "a")
    receiver = client.get_queue_receiver(q)
    [msg] = receiver.receive_messages(max_wait_time=SHORT)
    assert msg.locked_until_utc == clock.now + timedelta(seconds=30)
    clock.advance(29)
    assert receiver.receive_messages(max_wait_time=SHORT) == []
    clock.advance(1)
    [again] = receiver.receive_messages(max_wait_time=SHORT)
    assert again.sequence_number == msg.sequence_number and again.delivery_count == 1


def test_renew_message_lock_extends_the_lock(client, queue, clock):
    q = queue(lock_duration="PT30S")
    _send(client, q, "a")
    receiver = client.get_queue_receiver(q)
    [msg] = receiver.receive_messages(max_wait_time=SHORT)
    clock.advance(20)
    until = receiver.renew_message_lock(msg)
    assert until == clock.now + timedelta(seconds=30) == msg.locked_until_utc
    clock.advance(20)  # 40 s after receive: past the first lock, inside the renewed one
    assert client.get_queue_receiver(q).receive_messages(max_wait_time=SHORT) == []
    receiver.complete_message(msg)


def test_settle_after_lock_lost_raises_sdk_exception(client, queue, clock):
    q = queue(lock_duration="PT10S")
    _send(client, q, "a")
    receiver = client.get_queue_receiver(q)
    [msg] = receiver.receive_messages(max_wait_time=SHORT)
    clock.advance(11)
    with pytest.raises(MessageLockLostError):
        receiver.complete_message(msg)
    with pytest.raises(MessageLockLostError):
        receiver.renew_message_lock(msg)
    [again] = receiver.receive_messages(max_wait_time=SHORT)  # someone else's lock now
    with pytest.raises(MessageLockLostError):
        receiver.abandon_message(msg)  # the old lock token is not the current one
    receiver.complete_message(again)


def test_settling_twice_raises_message_already_settled(client, queue):
    q = queue()
    _send(client, q, "a")
    receiver = client.get_queue_receiver(q)
    [msg] = receiver.receive_messages(max_wait_time=SHORT)
    receiver.complete_message(msg)
    with pytest.raises(MessageAlreadySettled):
        receiver.complete_message(msg)
    assert msg.lock_token is None and msg.locked_until_utc is None


def test_max_delivery_count_moves_to_dead_letter_with_reason(client, queue):
    # service-bus-dead-letter-queues: "Maximum delivery count ... MaxDeliveryCountExceeded".
    q = queue(max_delivery_count=3)
    _send(client, q, "poison")
    receiver = client.get_queue_receiver(q)
    for expected_count in range(3):
        [msg] = receiver.receive_messages(max_wait_time=SHORT)
        assert msg.delivery_count == expected_count
        receiver.abandon_message(msg)
    assert receiver.receive_messages(max_wait_time=SHORT) == []
    dlq = client.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    [dead] = dlq.receive_messages(max_wait_time=SHORT)
    assert str(dead) == "poison"
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert dead.dead_letter_error_description == "Message could not be consumed after 3 delivery attempts."
    dlq.complete_message(dead)
    assert client.broker.counts(q).dead_lettered == 0


def test_lock_expiry_counts_toward_max_delivery_count(client, queue, clock):
    q = queue(max_delivery_count=2, lock_duration="PT5S")
    _send(client, q, "a")
    receiver = client.get_queue_receiver(q)
    for _ in range(2):
        assert len(receiver.receive_messages(max_wait_time=SHORT)) == 1
        clock.advance(6)
    assert receiver.receive_messages(max_wait_time=SHORT) == []
    assert client.broker.counts(q).dead_lettered == 1


def test_dead_letter_message_reason_and_description_readable_from_dlq(client, queue):
    q = queue()
    _send(client, q, "bad")
    receiver = client.get_queue_receiver(q)
    [msg] = receiver.receive_messages(max_wait_time=SHORT)
    receiver.dead_letter_message(msg, reason="ConflictingOrder", error_description="same OrderID, other data")
    with client.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        [dead] = dlq.receive_messages(max_wait_time=SHORT)
    assert (dead.dead_letter_reason, dead.dead_letter_error_description) == (
        "ConflictingOrder",
        "same OrderID, other data",
    )
    assert dead.message_id == msg.message_id and dead.dead_letter_source is None


def test_peek_does_not_lock_and_peeked_messages_cannot_be_settled(client, queue):
    q = queue()
    _send(client, q, "a", "b")
    receiver = client.get_queue_receiver(q)
    peeked = receiver.peek_messages(5)
    assert [str(m) for m in peeked] == ["a", "b"]
    with pytest.raises(ValueError):
        receiver.complete_message(peeked[0])
    assert len(receiver.receive_messages(5, max_wait_time=SHORT)) == 2


def test_receive_and_delete_removes_on_receive(client, queue):
    q = queue()
    _send(client, q, "a")
    receiver = client.get_queue_receiver(q, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE)
    [msg] = receiver.receive_messages(max_wait_time=SHORT)
    with pytest.raises(ValueError):
        receiver.complete_message(msg)
    assert client.broker.counts(q).active == 0


def test_deferred_message_only_by_sequence_number(client, queue):
    q = queue()
    _send(client, q, "a")
    receiver = client.get_queue_receiver(q)
    [msg] = receiver.receive_messages(max_wait_time=SHORT)
    receiver.defer_message(msg)
    assert receiver.receive_messages(max_wait_time=SHORT) == []
    assert client.broker.counts(q).deferred == 1
    [deferred] = receiver.receive_deferred_messages([msg.sequence_number])
    receiver.complete_message(deferred)
    assert client.broker.counts(q).total == 0


def test_batch_receive_is_fifo_and_bounded(client, queue):
    q = queue()
    _send(client, q, *[str(i) for i in range(5)])
    receiver = client.get_queue_receiver(q)
    assert [str(m) for m in receiver.receive_messages(3, max_wait_time=SHORT)] == ["0", "1", "2"]
    assert [str(m) for m in receiver.receive_messages(10, max_wait_time=SHORT)] == ["3", "4"]


def test_unknown_queue_fails_when_the_link_opens(broker):
    # As the SDK: handlers are made without a call to the service; the link's put-token fails on first use
    # (azure/servicebus/_servicebus_sender.py and _servicebus_receiver.py `_open`), answered 404 and raised as
    # ServiceBusAuthenticationError (_pyamqp/cbs.py `handle_token`). Its retries: test_bus_sdk_parity.py.
    with ServiceBusClient(broker, retry_total=0) as client:
        sender = client.get_queue_sender("no-such-queue")
        with pytest.raises(ServiceBusAuthenticationError):
            sender.send_messages(ServiceBusMessage("x"))
        with pytest.raises(ServiceBusAuthenticationError):
            sender.__enter__()
        with pytest.raises(ServiceBusAuthenticationError):
            client.get_queue_receiver("no-such-queue").receive_messages(max_wait_time=SHORT)


def test_closed_receiver_refuses_to_work(client, queue):
    q = queue()
    receiver = client.get_queue_receiver(q)
    receiver.close()
    with pytest.raises(ValueError):
        receiver.receive_messages(max_wait_time=SHORT)


def test_lock_lost_error_is_the_sdk_class():
    assert issubclass(MessageLockLostError, ServiceBusError)  # callers catch ServiceBusError as with Azure
