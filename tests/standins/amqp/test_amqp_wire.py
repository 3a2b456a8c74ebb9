"""The AMQP endpoint seen below the SDKs, with proton's blocking client: the size limit and its condition (and the
link staying usable), the max-message-size an attach announces, refused attaches, dispositions that count no
delivery, pre-settled receive-and-delete, and the identity CBS records per connection."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from proton import Delivery, Message, Timeout
from proton.reactor import AtMostOnce
from proton.utils import BlockingConnection, BlockingReceiver, LinkDetached, SendException
from support.amqp_endpoint import InProcess
from support.bus_scenarios import Queues

from orderflow.embedded.amqp._codec import MAX_MESSAGE_SIZE

TIMEOUT = 10


@pytest.fixture
def queues(in_process: InProcess) -> Queues:
    return in_process.declare(Queues.fresh())


@pytest.fixture
def connection(in_process: InProcess) -> Iterator[BlockingConnection]:
    conn = BlockingConnection(f"amqp://127.0.0.1:{in_process.port}", timeout=TIMEOUT)
    yield conn
    conn.close()


def _annotation(message: Message, name: str) -> object:
    return {str(k): v for k, v in (message.annotations or {}).items()}.get(name)


def test_a_message_over_256_kib_is_rejected_with_message_size_exceeded_and_the_link_stays(
    connection: BlockingConnection, queues: Queues
) -> None:
    sender = connection.create_sender(queues.plain)
    assert sender.link.remote_max_message_size == MAX_MESSAGE_SIZE  # announced on attach (the SDK sizes batches)
    with pytest.raises(SendException) as rejected:
        sender.send(Message(body=b"x" * (MAX_MESSAGE_SIZE + 1), inferred=True))
    assert rejected.value.state == Delivery.REJECTED
    sender.send(Message(body=b"fits", inferred=True))  # the same link goes on: Service Bus rejects the transfer only
    receiver = connection.create_receiver(queues.plain)
    assert bytes(receiver.receive(TIMEOUT).body) == b"fits"
    receiver.accept()


def test_an_attach_to_a_missing_queue_is_refused_with_not_found(connection: BlockingConnection, queues: Queues) -> None:
    with pytest.raises(LinkDetached) as refused:
        connection.create_sender(queues.missing)
    assert refused.value.condition == "amqp:not-found"
    with pytest.raises(LinkDetached) as refused:
        connection.create_receiver(queues.missing)
    assert refused.value.condition == "amqp:not-found"


def test_a_receiver_without_a_session_filter_on_a_session_queue_is_refused(
    connection: BlockingConnection, queues: Queues
) -> None:
    with pytest.raises(LinkDetached) as refused:
        connection.create_receiver(queues.sessions)
    assert refused.value.condition == "amqp:not-allowed"


def _receive_one(receiver: BlockingReceiver) -> tuple[Message, int]:
    message = receiver.receive(TIMEOUT)
    return message, message.delivery_count


def test_released_counts_no_delivery_and_modified_counts_one_with_or_without_delivery_failed(
    connection: BlockingConnection, queues: Queues
) -> None:
    connection.create_sender(queues.plain).send(Message(body=b"m", inferred=True))
    receiver = connection.create_receiver(queues.plain)
    first, count = _receive_one(receiver)
    assert count == 0 and _annotation(first, "x-opt-lock-token") is not None
    receiver.release(delivered=False)  # released: the SDK releases what arrives outside a receive call
    _, count = _receive_one(receiver)
    assert count == 0
    receiver.release(delivered=True)  # modified, delivery-failed false: @azure/service-bus's abandon
    _, count = _receive_one(receiver)
    assert count == 1
    receiver.fetcher.unsettled[0].local.failed = True  # modified, delivery-failed: pyamqp's abandon
    receiver.settle(Delivery.MODIFIED)
    again, count = _receive_one(receiver)
    assert count == 2 and _annotation(again, "x-opt-sequence-number") == _annotation(first, "x-opt-sequence-number")
    receiver.accept()


def test_a_pre_settled_receiver_receives_and_deletes(connection: BlockingConnection, queues: Queues) -> None:
    connection.create_sender(queues.plain).send(Message(body=b"gone", inferred=True))
    receiver = connection.create_receiver(queues.plain, options=AtMostOnce())
    message = receiver.receive(TIMEOUT)
    assert bytes(message.body) == b"gone" and _annotation(message, "x-opt-lock-token") is None
    receiver.close()
    check = connection.create_receiver(queues.plain)
    with pytest.raises(Timeout):
        check.receive(0.5)


def test_cbs_keeps_the_key_name_and_the_audience_of_each_connection(in_process: InProcess, queues: Queues) -> None:
    with ServiceBusClient.from_connection_string(in_process.connection_string, retry_total=0) as client:
        with client.get_queue_sender(queues.plain) as sender:
            sender.send_messages(ServiceBusMessage("authenticated"))
            [identity] = [i for i in in_process.endpoint.identities() if i.tokens]
    [token] = identity.tokens.values()
    assert token.key_name == "RootManageSharedAccessKey"
    assert token.audience == f"sb://127.0.0.1:{in_process.port}/{queues.plain}"
    assert token.resource == token.audience and token.expires_at is not None
    assert identity.for_address(f"sb://127.0.0.1:{in_process.port}/{queues.plain}") == token


def test_a_drain_gives_the_unused_credit_back(connection: BlockingConnection, queues: Queues) -> None:
    connection.create_sender(queues.plain).send(Message(body=b"one", inferred=True))
    receiver = connection.create_receiver(queues.plain, credit=0)
    receiver.link.drain(5)  # as the SDK does when it closes a peek-lock receiver (drain_and_release_messages)
    connection.wait(lambda: not receiver.link.draining(), timeout=TIMEOUT, msg="draining")
    assert receiver.link.credit == 0 and receiver.fetcher.has_message  # one delivered, four given back
