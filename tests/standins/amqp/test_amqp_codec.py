"""The AMQP endpoint's pure parts: addresses, .NET ticks, delivery tags, batch detection, and the broker's errors as
Service Bus's conditions (with the status codes `$management` answers with)."""

from __future__ import annotations

import sqlite3
import uuid
from datetime import UTC, datetime

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from azure.servicebus.exceptions import MessageLockLostError, MessagingEntityNotFoundError, SessionLockLostError
from proton import Message

from orderflow.embedded.amqp._codec import Address, decode_transfer, delivery_tag, parse_address, to_ticks
from orderflow.embedded.amqp._errors import AmqpError, classify
from orderflow.embedded.broker import ACTIVE, DEAD_LETTER


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("amqps://127.0.0.1:5672/orders", Address("orders")),  # what pyamqp attaches to (receiver_mixins.py)
        ("sb://ns.servicebus.windows.net/orders", Address("orders")),
        ("orders/$management", Address("orders", ACTIVE, True)),
        ("orders/$DeadLetterQueue", Address("orders", DEAD_LETTER)),
        ("amqps://h/orders/$deadletterqueue/$management", Address("orders", DEAD_LETTER, True)),
        ("", None),
    ],
)
def test_addresses(address: str, expected: Address | None) -> None:
    assert parse_address(address) == expected


def test_ticks_are_what_the_sdk_turns_back_into_the_moment() -> None:
    moment = datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    # azure/servicebus/_transport/_pyamqp_transport.py on_attach: (ticks - DATETIMEOFFSET_EPOCH) / 10**7
    assert (to_ticks(moment) - 621355968000000000) / 10**7 == moment.timestamp()


def test_the_delivery_tag_is_the_lock_token_the_sdk_reads_back() -> None:
    token = str(uuid.uuid4())
    assert uuid.UUID(bytes_le=delivery_tag(token)) == uuid.UUID(token)  # _common/message.py lock_token


def _encoded(message: ServiceBusMessage) -> bytes:
    return PyamqpTransport.encode_message(message)


def test_an_sdk_batch_is_split_into_its_messages_and_a_single_message_is_one() -> None:
    from azure.servicebus._pyamqp._encode import encode_payload
    from azure.servicebus._pyamqp.message import BatchMessage

    inner = []
    for body, subject in (("b0", "s0"), ("b1", None)):
        message = ServiceBusMessage(body, subject=subject, session_id="S")
        message._message = PyamqpTransport.to_outgoing_amqp_message(message._raw_amqp_message)
        inner.append(_encoded(message))
    batch = bytes(encode_payload(bytearray(), BatchMessage(data=inner)))
    assert [(e.body, e.subject, e.session_id) for e in decode_transfer(batch)] == [
        (b"b0", "s0", "S"),
        (b"b1", None, "S"),
    ]
    single = Message(body=b'{"json": true}', inferred=True, subject="x")
    assert [(e.body, e.subject, e.content_type) for e in decode_transfer(bytes(single.encode()))] == [
        (b'{"json": true}', "x", None)
    ]


def test_a_value_body_is_refused() -> None:
    with pytest.raises(AmqpError) as refused:
        decode_transfer(bytes(Message(body="a string value").encode()))
    assert refused.value.condition == "amqp:not-implemented"


@pytest.mark.parametrize(
    ("exc", "condition", "status"),
    [
        (MessageLockLostError(), "com.microsoft:message-lock-lost", 410),
        (SessionLockLostError(), "com.microsoft:session-lock-lost", 410),
        (MessagingEntityNotFoundError(message="gone"), "amqp:not-found", 404),
        (sqlite3.OperationalError("database is locked"), "com.microsoft:server-busy", 503),
        (RuntimeError("boom"), "amqp:internal-error", 500),
    ],
)
def test_broker_errors_map_to_service_bus_conditions(exc: BaseException, condition: str, status: int) -> None:
    error = classify(exc)
    assert (error.condition, error.status) == (condition, status)
    assert error.to_condition().info  # never empty: pyamqp reads the error's third field
