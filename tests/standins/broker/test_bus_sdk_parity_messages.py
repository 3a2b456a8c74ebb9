"""Conformance of the embedded client to azure-servicebus 7.15 (site-packages/azure/servicebus), messages: the
whole-message size of sends and batches, dead-letter reasons as application properties, the settlement errors, and
the received message itself. Each test names the SDK file and function (or the learn.microsoft.com page) it
follows; sizes are compared with the real SDK's `ServiceBusMessageBatch` on the same messages."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import azure.servicebus as sdk
import pytest
from azure.servicebus import ServiceBusMessageState, ServiceBusReceiveMode, ServiceBusSubQueue
from azure.servicebus.exceptions import (
    MessageAlreadySettled,
    MessageLockLostError,
    MessageSizeExceededError,
    SessionLockLostError,
)

from orderflow.embedded.client import ServiceBusMessage

SHORT = 0.05
LIMIT = 256 * 1024  # Service Bus Standard's max-message-size; the SDK's MAX_BATCH_SIZE_STANDARD


def _received(client, q: str, *messages, **receiver_options):
    client.get_queue_sender(q).send_messages(list(messages))
    return client.get_queue_receiver(q, **receiver_options).receive_messages(len(messages), max_wait_time=SHORT)


def _heavy(n: int) -> ServiceBusMessage:
    """A small body with large application properties and system properties."""
    return ServiceBusMessage(
        "b" * 10,
        message_id=f"m-{n}",
        session_id=None,
        subject="s" * 100,
        application_properties={f"key-{i}": "v" * 1000 for i in range(n)},
    )


# -- 4. whole-message size ------------------------------------------------------------------------------------


def test_a_batch_sizes_whole_messages_as_the_sdk_batch_does(client, queue):
    # _common/message.py ServiceBusMessageBatch._add: the encoded size of the whole AMQP message
    # (get_message_encoded_size: header, properties, application properties, body) plus 5 or 8 bytes, on top of the
    # empty batch's own size; past max_size_in_bytes, MessageSizeExceededError.
    ours = client.get_queue_sender(queue()).create_message_batch()
    theirs = sdk.ServiceBusMessageBatch(max_size_in_bytes=LIMIT)
    assert (ours.size_in_bytes, ours.max_size_in_bytes) == (theirs.size_in_bytes, theirs.max_size_in_bytes)
    added = 0
    while True:
        message = _heavy(20)
        try:
            theirs.add_message(message)
        except MessageSizeExceededError as refused:
            with pytest.raises(MessageSizeExceededError) as also:
                ours.add_message(_heavy(20))
            assert str(also.value) == str(refused) == f"ServiceBusMessageBatch has reached its size limit: {LIMIT}"
            break
        ours.add_message(_heavy(20))
        added += 1
        assert ours.size_in_bytes == theirs.size_in_bytes
    assert added == len(ours) == len(theirs) and added < LIMIT // (20 * 1000)  # the properties were counted


def test_one_message_over_the_limit_is_refused_with_its_properties_counted(client, queue):
    # A single message is not sized by the SDK but by the service, against the link's max-message-size: condition
    # amqp:link:message-size-exceeded, which _transport/_pyamqp_transport.py maps to MessageSizeExceededError.
    q = queue()
    sender = client.get_queue_sender(q)
    with pytest.raises(MessageSizeExceededError) as refused:
        sender.send_messages(_heavy(300))  # a 10-byte body
    assert str(refused.value).endswith("Error condition: amqp:link:message-size-exceeded.")
    overhead = len(_encoded(ServiceBusMessage(b"x" * 1000, message_id="m"))) - 1000  # by the SDK's own encoder
    body = LIMIT - overhead  # the largest body that fits: the whole message is exactly the limit
    fits = ServiceBusMessage(b"x" * body, message_id="m")
    assert len(_encoded(fits)) == LIMIT
    sender.send_messages(fits)
    with pytest.raises(MessageSizeExceededError):
        sender.send_messages(ServiceBusMessage(b"x" * (body + 1), message_id="m"))
    assert client.broker.counts(q).active == 1


def _encoded(message: ServiceBusMessage) -> bytes:
    from azure.servicebus._pyamqp._encode import encode_payload
    from azure.servicebus._transport._pyamqp_transport import PyamqpTransport

    out = bytearray()
    encode_payload(out, PyamqpTransport.to_outgoing_amqp_message(message.raw_amqp_message))
    return bytes(out)


def test_a_list_is_sent_as_one_batch_and_sized_as_one(client, queue):
    # _servicebus_sender.py send_messages: a list becomes `create_message_batch()` + `_from_list`.
    q = queue()
    with pytest.raises(MessageSizeExceededError, match=f"ServiceBusMessageBatch has reached its size limit: {LIMIT}"):
        client.get_queue_sender(q).send_messages([_heavy(100), _heavy(100), _heavy(100)])
    assert client.broker.counts(q).active == 0  # all or nothing
    client.get_queue_sender(q).send_messages([])  # an empty list sends nothing
    assert client.broker.counts(q).active == 0


def test_a_batch_larger_than_the_link_allows_is_refused(client, queue):
    # _servicebus_sender.py create_message_batch.
    with pytest.raises(ValueError) as refused:
        client.get_queue_sender(queue()).create_message_batch(max_size_in_bytes=LIMIT + 1)
    assert (
        str(refused.value)
        == f"Max message size: {LIMIT + 1} is too large, acceptable max batch size is: {LIMIT} bytes."
    )


# -- 5. dead-letter reason and description ----------------------------------------------------------------------


def test_the_dead_letter_reason_and_description_are_application_properties(client, queue):
    # Service Bus stores them as the application properties DeadLetterReason and DeadLetterErrorDescription
    # (learn.microsoft.com/azure/service-bus-messaging/service-bus-dead-letter-queues); the SDK reads them there
    # (_common/message.py dead_letter_reason: application_properties.get(b"DeadLetterReason").decode()), and keys and
    # strings come off the wire as bytes (_pyamqp/_decode.py).
    q = queue()
    [msg] = _received(client, q, ServiceBusMessage("x", application_properties={"tenant": "contoso"}))
    client.get_queue_receiver(q).dead_letter_message(msg, reason="BadInput", error_description="field x")
    [dead] = client.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER).receive_messages(
        max_wait_time=SHORT
    )
    assert dead.application_properties == {
        b"tenant": b"contoso",
        b"DeadLetterReason": b"BadInput",
        b"DeadLetterErrorDescription": b"field x",
    }
    assert (dead.dead_letter_reason, dead.dead_letter_error_description) == ("BadInput", "field x")


def test_max_delivery_count_dead_letters_with_its_reason_in_the_properties(client, queue):
    # service-bus-dead-letter-queues: MaxDeliveryCountExceeded.
    q = queue(max_delivery_count=1)
    [msg] = _received(client, q, ServiceBusMessage("x"))
    client.get_queue_receiver(q).abandon_message(msg)
    [dead] = client.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER).peek_messages()
    assert dead.application_properties[b"DeadLetterReason"] == b"MaxDeliveryCountExceeded"


def test_a_reason_over_4096_characters_is_sent_as_the_python_sdk_sends_it(client, queue):
    # The Python SDK does not bound the reason (_servicebus_receiver.py dead_letter_message; no 4096 in the package),
    # unlike Azure.Messaging.ServiceBus (ArgumentOutOfRangeException past 4096); what the service does with a longer
    # one is not documented, and the mirror keeps it whole. orderflow bounds its own (orderflow/text.py).
    q = queue()
    [msg] = _received(client, q, ServiceBusMessage("x"))
    client.get_queue_receiver(q).dead_letter_message(msg, reason="r" * 5000)
    [dead] = client.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER).peek_messages()
    assert dead.dead_letter_reason == "r" * 5000


# -- 6. settlement errors -------------------------------------------------------------------------------------


def test_settling_twice_raises_message_already_settled_with_the_sdk_action_names(client, queue):
    # exceptions.py MessageAlreadySettled; the action names are _common/constants.py MESSAGE_* ("dead-letter").
    q = queue()
    receiver = client.get_queue_receiver(q)
    first, second = _received(client, q, ServiceBusMessage("a"), ServiceBusMessage("b"))
    receiver.complete_message(first)
    receiver.dead_letter_message(second)
    with pytest.raises(MessageAlreadySettled) as twice:
        receiver.complete_message(first)
    assert str(twice.value) == "Unable to complete message; The message has either been deleted or already settled."
    with pytest.raises(MessageAlreadySettled, match="^Unable to dead-letter message;"):
        receiver.dead_letter_message(second)


def test_receive_and_delete_and_peeked_messages_cannot_be_settled(client, queue):
    # receiver_mixins.py `_check_message_alive` (its texts, the missing space included).
    q = queue()
    [deleted] = _received(client, q, ServiceBusMessage("a"), receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE)
    with pytest.raises(ValueError) as refused:
        client.get_queue_receiver(q, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE).complete_message(deleted)
    assert str(refused.value) == "The operation complete is not supported in 'RECEIVE_AND_DELETE' receive mode."
    client.get_queue_sender(q).send_messages(ServiceBusMessage("b"))
    receiver = client.get_queue_receiver(q)
    [peeked] = receiver.peek_messages()
    with pytest.raises(ValueError) as refused:
        receiver.dead_letter_message(peeked)
    assert str(refused.value) == (
        "The operation dead-letter is not supported for peeked messages."
        "Only messages received using receive methods in PEEK_LOCK mode can be settled."
    )


def test_a_lost_message_lock_raises_message_lock_lost_with_the_sdk_text(client, queue, clock):
    # _servicebus_receiver.py `_settle_message_with_retry` (local expiry check) for every settlement.
    q = queue(lock_duration="PT30S")
    receiver = client.get_queue_receiver(q)
    messages = _received(client, q, *[ServiceBusMessage(str(i)) for i in range(4)])
    clock.advance(30)
    settle = [receiver.complete_message, receiver.abandon_message, receiver.defer_message]
    for action, msg in zip([*settle, receiver.dead_letter_message], messages, strict=True):
        with pytest.raises(MessageLockLostError) as lost:
            action(msg)
        assert str(lost.value) == "The lock on the message lock has expired."


def test_a_lock_taken_by_another_receiver_is_the_service_s_answer(client, queue, clock):
    # Settlement outcomes are awaited (receiver_mixins.py `_await_settlement_outcome` for PEEK_LOCK): the service's
    # refusal of a lock another receiver now holds is the call's MessageLockLostError.
    q = queue(lock_duration="PT30S")
    [msg] = _received(client, q, ServiceBusMessage("a"))
    clock.advance(31)
    [again] = client.get_queue_receiver(q).receive_messages(max_wait_time=SHORT)
    msg._expiry = clock.now + timedelta(seconds=30)  # as if renewed locally: only the service can say no
    with pytest.raises(MessageLockLostError):
        client.get_queue_receiver(q).complete_message(msg)
    client.get_queue_receiver(q).complete_message(again)


def test_session_settlement_and_renewal_errors(client, queue, clock):
    # _servicebus_receiver.py renew_message_lock (TypeError in a session, its text without the space) and
    # `_check_live` (SessionLockLostError) before a settlement of a session message.
    q = queue(requires_session=True, lock_duration="PT30S")
    client.get_queue_sender(q).send_messages(ServiceBusMessage("a", session_id="A"))
    receiver = client.get_queue_receiver(q, session_id="A")
    [msg] = receiver.receive_messages(max_wait_time=SHORT)
    with pytest.raises(TypeError) as refused:
        receiver.renew_message_lock(msg)
    assert str(refused.value) == (
        "Renewing message lock is an invalid operation when working with sessions."
        "Please renew the session lock instead."
    )
    clock.advance(30)
    with pytest.raises(SessionLockLostError):
        receiver.abandon_message(msg)


def test_a_closed_receiver_refuses_before_it_looks_at_the_message(client, queue):
    # `_check_live` comes first in `_settle_message_with_retry`: a closed handler, even for a settled message.
    q = queue()
    receiver = client.get_queue_receiver(q)
    [msg] = _received(client, q, ServiceBusMessage("a"))
    receiver.complete_message(msg)
    receiver.close()
    with pytest.raises(ValueError, match="^The handler has already been shutdown"):
        receiver.complete_message(msg)
    with pytest.raises(ValueError, match="^The timeout must be greater than 0."):
        client.get_queue_sender(q).send_messages(ServiceBusMessage("b"), timeout=0)


# -- 7. the received message is the SDK's --------------------------------------------------------------------


def test_a_received_message_is_the_sdk_s_own_with_its_types(client, queue, clock):
    # _common/message.py ServiceBusReceivedMessage: lock_token a UUID (from the delivery), state a
    # ServiceBusMessageState, times from millisecond annotations, delivery_count from the header.
    clock.now = datetime(2030, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)
    q = queue()
    [msg] = _received(client, q, ServiceBusMessage("a", time_to_live=timedelta(minutes=5)))
    assert isinstance(msg, sdk.ServiceBusReceivedMessage)
    assert isinstance(msg.lock_token, uuid.UUID) and msg.state is ServiceBusMessageState.ACTIVE
    assert msg.enqueued_time_utc == datetime(2030, 1, 1, 0, 0, 0, 123000, tzinfo=UTC)
    assert msg.expires_at_utc == msg.enqueued_time_utc + timedelta(minutes=5)
    assert msg.delivery_count == 0 and msg.locked_until_utc == msg.enqueued_time_utc + timedelta(minutes=1)
    receiver = client.get_queue_receiver(q)
    receiver.defer_message(msg)
    [deferred] = receiver.receive_deferred_messages([msg.sequence_number])
    assert deferred.state is ServiceBusMessageState.DEFERRED
