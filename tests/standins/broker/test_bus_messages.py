"""The message surface: SDK-shaped bodies and properties, and the real azure.servicebus.ServiceBusMessage.

Source: azure/servicebus/_common/message.py (ServiceBusMessage constructor keywords; `body` of a data message
is an iterable of bytes sections; `str(msg)` is the decoded body) and amqp/_amqp_message.py.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import azure.servicebus as sdk
import pytest

from orderflow.embedded.client import ServiceBusMessage

SHORT = 0.05


def _roundtrip(client, q: str, message):
    client.get_queue_sender(q).send_messages(message)
    [received] = client.get_queue_receiver(q).receive_messages(max_wait_time=SHORT)
    return received


@pytest.mark.parametrize("factory", [ServiceBusMessage, sdk.ServiceBusMessage], ids=["embedded", "sdk"])
def test_properties_and_body_round_trip(client, queue, factory):
    q = queue()
    when = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    token = uuid.uuid4()
    sent = factory(
        '{"orderId": "o-1"}',
        message_id="m-1",
        correlation_id="c-1",
        reply_to="app-status",
        reply_to_session_id="o-1",
        subject="SubmitOrder",
        content_type="application/json",
        application_properties={
            "schemaVersion": 1,
            "ratio": 0.5,
            "ok": True,
            "raw": b"\x00",
            "id": token,
            "at": when,
        },
        time_to_live=timedelta(hours=1),
    )
    got = _roundtrip(client, q, sent)
    assert b"".join(got.body) == b'{"orderId": "o-1"}' and str(got) == '{"orderId": "o-1"}'
    assert (got.message_id, got.correlation_id, got.reply_to, got.reply_to_session_id) == (
        "m-1",
        "c-1",
        "app-status",
        "o-1",
    )
    assert (got.subject, got.content_type, got.time_to_live) == (
        "SubmitOrder",
        "application/json",
        timedelta(hours=1),
    )
    # As the real SDK decodes them off the wire (azure/servicebus/_pyamqp/_decode.py; checked with
    # ServiceBusReceivedMessage.from_bytes): keys and strings as bytes, a timestamp as its milliseconds.
    assert got.application_properties == {
        b"schemaVersion": 1,
        b"ratio": 0.5,
        b"ok": True,
        b"raw": b"\x00",
        b"id": token,
        b"at": int(when.timestamp() * 1000),
    }
    assert got.sequence_number >= 1 and got.enqueued_time_utc is not None and got.lock_token


def test_bytes_body_and_generated_message_id(client, queue):
    got = _roundtrip(client, queue(), ServiceBusMessage(b"\xff\x00raw"))
    assert b"".join(got.body) == b"\xff\x00raw"
    assert got.message_id  # assigned when the sender left it empty


def test_body_can_be_read_more_than_once(client, queue):
    got = _roundtrip(client, queue(), ServiceBusMessage("abc"))
    assert list(got.body) == [b"abc"] and list(got.body) == [b"abc"]


def test_sdk_batch_of_our_messages(client, queue):
    q = queue()
    sender = client.get_queue_sender(q)
    batch = sender.create_message_batch()
    for body in ("1", "2"):
        batch.add_message(ServiceBusMessage(body))
    sender.send_messages(batch)
    assert [str(m) for m in client.get_queue_receiver(q).receive_messages(5, max_wait_time=SHORT)] == [
        "1",
        "2",
    ]


def test_non_message_is_rejected(client, queue):
    with pytest.raises(TypeError):
        client.get_queue_sender(queue()).send_messages("just a string")
