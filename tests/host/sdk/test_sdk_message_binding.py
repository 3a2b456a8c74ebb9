"""to_sdk_message: a broker message becomes the real azure.servicebus.ServiceBusReceivedMessage through the
extension's own decoder, with the host's model_binding_data layout (conformance tests; sources cited per
test)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import timedelta

import azurefunctions.extensions.bindings.servicebus as servicebus
import pytest
from azure.servicebus import ServiceBusReceivedMessage as SdkReceivedMessage
from support.servicebus_sdk import NOW, BrokerMessage

from devhost.sdk_servicebus import (
    BINDING_CONTENT_TYPE,
    BINDING_SOURCE,
    BINDING_VERSION,
    is_message_actions_type,
    is_sdk_batch_type,
    is_sdk_message_type,
    model_binding_data,
    to_sdk_message,
    to_sdk_messages,
)


def test_round_trip_keeps_body_ids_session_properties_and_lock_token() -> None:
    msg = BrokerMessage(body=iter([b'{"orderId": ', b'"o-1"}']), session_id="o-1")
    sdk = to_sdk_message(msg)

    assert type(sdk) is SdkReceivedMessage  # the real SDK class, not a look-alike
    assert b"".join(sdk.body) == b'{"orderId": "o-1"}'
    assert str(sdk) == '{"orderId": "o-1"}'
    assert (sdk.message_id, sdk.session_id, sdk.correlation_id) == ("m-1", "o-1", "corr-1")
    assert (sdk.reply_to, sdk.subject, sdk.content_type) == ("replies", "order.submitted", "application/json")
    # AMQP strings decode to bytes in application properties, as on Azure (the extension decodes with uamqp).
    assert sdk.application_properties == {b"tenant": b"contoso", b"n": 7}
    assert str(sdk.lock_token) == msg.lock_token
    assert isinstance(sdk.lock_token, uuid.UUID)


def test_round_trip_keeps_broker_annotations() -> None:
    # azure/servicebus/_common/message.py reads these from x-opt-* message annotations (ms since epoch).
    sdk = to_sdk_message(BrokerMessage())
    assert sdk.sequence_number == 42
    assert sdk.enqueued_time_utc == NOW
    assert sdk.locked_until_utc == NOW + timedelta(minutes=1)


def test_scheduled_enqueue_time_and_dead_letter_fields_are_carried() -> None:
    # Service Bus keeps DeadLetterReason / DeadLetterErrorDescription in application properties and the SDK
    # reads them there (azure/servicebus/_common/message.py: PROPERTIES_DEAD_LETTER_REASON).
    msg = BrokerMessage(
        scheduled_enqueue_time_utc=NOW + timedelta(seconds=30),
        dead_letter_reason="Conflict",
        dead_letter_error_description="different data",
    )
    sdk = to_sdk_message(msg)
    assert sdk.scheduled_enqueue_time_utc == NOW + timedelta(seconds=30)
    assert (sdk.dead_letter_reason, sdk.dead_letter_error_description) == ("Conflict", "different data")


def test_header_is_lost_as_on_azure_delivery_count_and_ttl_are_none() -> None:
    # Conformance with Azure: the extension's utils.get_decoded_message decodes from just after the first
    # b"x-opt-lock-token" (inside the delivery-annotations section), and the AMQP header section (delivery
    # count, TTL) precedes it, so on Azure `delivery_count` and `time_to_live` are None for this binding (same
    # result with the host-captured SERVICEBUS_SAMPLE_CONTENT in the extension's tests, whose header has
    # delivery-count 1).
    sdk = to_sdk_message(BrokerMessage(delivery_count=3, time_to_live=timedelta(hours=1)))
    assert sdk.delivery_count is None
    assert sdk.time_to_live is None


def test_model_binding_data_has_the_host_layout() -> None:
    # Host: ServiceBusExtensionConfigProvider.ConvertReceivedMessageToBindingData →
    # ParameterBindingData("1.0", "AzureServiceBusReceivedMessage", lockToken.ToByteArray() + AMQP bytes,
    # "application/octet-stream").
    msg = BrokerMessage()
    token = uuid.UUID(msg.lock_token)
    mbd = model_binding_data(msg)
    assert (mbd.version, mbd.source, mbd.content_type) == (
        BINDING_VERSION,
        BINDING_SOURCE,
        BINDING_CONTENT_TYPE,
    )
    assert (BINDING_VERSION, BINDING_SOURCE, BINDING_CONTENT_TYPE) == (
        "1.0",
        "AzureServiceBusReceivedMessage",
        "application/octet-stream",
    )
    assert mbd.content[:16] == token.bytes_le  # .NET Guid.ToByteArray() order; utils.get_lock_token reads bytes_le
    amqp = mbd.content[16:]
    assert amqp.startswith(b"\x00Sp")  # header section first (AMQP 1.0 §3.2), as in the host-captured sample
    annotations_at = amqp.index(b"\x00Sq")  # then delivery annotations holding the lock token as an AMQP uuid
    token_at = amqp.index(b"x-opt-lock-token")
    assert annotations_at < token_at
    assert amqp[token_at + 16 : token_at + 33] == b"\x98" + token.bytes


def test_body_given_as_bytes_is_accepted() -> None:
    assert b"".join(to_sdk_message(BrokerMessage(body=b"raw")).body) == b"raw"


def test_message_without_lock_token_is_refused() -> None:
    with pytest.raises(ValueError, match="lock token"):
        to_sdk_message(BrokerMessage(lock_token=None))


def test_batch_decodes_in_order_through_collection_model_binding_data() -> None:
    # serviceBusConverter.py: cardinality many arrives as collection_model_binding_data.
    msgs = [BrokerMessage(message_id=f"m-{i}", body=f"b{i}".encode()) for i in range(3)]
    sdk = to_sdk_messages(msgs)
    assert [m.message_id for m in sdk] == ["m-0", "m-1", "m-2"]
    assert [str(m.lock_token) for m in sdk] == [m.lock_token for m in msgs]


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (servicebus.ServiceBusReceivedMessage, True),
        (list[servicebus.ServiceBusReceivedMessage], True),
        (Iterable[servicebus.ServiceBusReceivedMessage], True),
        (SdkReceivedMessage, False),  # the plain SDK class is not the binding's type (serviceBusConverter.py)
        (servicebus.ServiceBusMessageActions, False),
        (str, False),
        (bytes, False),
        (None, False),
        ("servicebus.ServiceBusReceivedMessage", False),  # unresolved string annotation
        (servicebus.ServiceBusReceivedMessage | None, False),
    ],
)
def test_is_sdk_message_type(annotation: object, expected: bool) -> None:
    assert is_sdk_message_type(annotation) is expected


def test_batch_annotation_is_told_apart() -> None:
    assert is_sdk_batch_type(list[servicebus.ServiceBusReceivedMessage])
    assert not is_sdk_batch_type(servicebus.ServiceBusReceivedMessage)


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (servicebus.ServiceBusMessageActions, True),
        (servicebus.ServiceBusReceivedMessage, False),
        (str, False),
        (None, False),
        ("servicebus.ServiceBusMessageActions", False),
    ],
)
def test_is_message_actions_type(annotation: object, expected: bool) -> None:
    assert is_message_actions_type(annotation) is expected
