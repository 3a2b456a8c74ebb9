"""The Service Bus SDK-type binding on devhost: what the Functions host does for
`azurefunctions-extensions-bindings-servicebus`, so a function written for Azure runs here unchanged.

- **Input.** `to_sdk_message` builds the host's `model_binding_data` (the lock token, then the AMQP-encoded message)
  from a message of our broker client and decodes it with the extension's own `ServiceBusConverter.decode`, so a
  `ServiceBusReceivedMessage` parameter gets the real `azure.servicebus.ServiceBusReceivedMessage` (as in Azure, its
  `delivery_count` and `time_to_live` are None).
- **Settlement.** `SettlementServer` is the host's gRPC `Settlement` service that `ServiceBusMessageActions` calls;
  `configure_message_actions(port)` points the client at it; functions run off the host's loop (`WorkerLoop`). This
  half lives in `_sdk_settlement.py`; this module re-exports it. Sources and byte layout: docs/modules-host.md."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.servicebus import ServiceBusReceivedMessage as SdkReceivedMessage
from azure.servicebus._pyamqp._encode import (
    encode_annotations,
    encode_payload,
    encode_value,
)  # AMQP 1.0 encoder
from azure.servicebus._pyamqp.message import Header, Message, Properties
from azure.servicebus._pyamqp.types import TYPE, VALUE, AMQPTypes
from azurefunctions.extensions.base import Datum
from azurefunctions.extensions.bindings.servicebus import (
    ServiceBusConverter,
    ServiceBusMessageActions,
    ServiceBusReceivedMessage,
)

from ._sdk_settlement import (
    DEFAULT_GRPC_MAX_MESSAGE_LENGTH,
    SETTLE_TIMEOUT_S,
    DeliveryRegistry,
    SettlementServer,
    WorkerLoop,
    configure_message_actions,
    normalize_lock_token,
)

__all__ = [
    "BINDING_CONTENT_TYPE",
    "BINDING_SOURCE",
    "BINDING_VERSION",
    "DEFAULT_GRPC_MAX_MESSAGE_LENGTH",
    "SETTLE_TIMEOUT_S",
    "CollectionModelBindingData",
    "DeliveryRegistry",
    "ModelBindingData",
    "SettlementServer",
    "WorkerLoop",
    "configure_message_actions",
    "encode_amqp_message",
    "is_message_actions_type",
    "is_sdk_batch_type",
    "is_sdk_message_type",
    "model_binding_data",
    "normalize_lock_token",
    "to_sdk_message",
    "to_sdk_messages",
]

# model_binding_data of one received message (host:
# ServiceBusExtensionConfigProvider.ConvertReceivedMessageToBindingData).
BINDING_SOURCE = "AzureServiceBusReceivedMessage"
BINDING_VERSION = "1.0"
BINDING_CONTENT_TYPE = "application/octet-stream"

_LOCK_TOKEN = b"x-opt-lock-token"
_ENQUEUED_TIME = b"x-opt-enqueued-time"
_SEQUENCE_NUMBER = b"x-opt-sequence-number"
_LOCKED_UNTIL = b"x-opt-locked-until"
_SCHEDULED_ENQUEUE_TIME = b"x-opt-scheduled-enqueue-time"
_DELIVERY_ANNOTATIONS = 0x71  # AMQP 1.0 section descriptor amqp:delivery-annotations:map


# ----------------------------------------------------------------------------------------------------
# Annotations: which parameters the SDK-type binding serves
# ----------------------------------------------------------------------------------------------------


def is_sdk_message_type(annotation: Any) -> bool:
    """True for `servicebus.ServiceBusReceivedMessage` and iterables of it (`list[...]`, cardinality many),
    by the extension's own check (`ServiceBusConverter.check_input_type_annotation`). Pass resolved
    annotations (`typing.get_type_hints`), not the strings of `from __future__ import annotations`."""
    try:
        return bool(ServiceBusConverter.check_input_type_annotation(annotation))
    except TypeError:  # e.g. a typing construct issubclass() rejects
        return False


def is_message_actions_type(annotation: Any) -> bool:
    """True for a `servicebus.ServiceBusMessageActions` parameter (the worker injects `get_instance()`)."""
    return isinstance(annotation, type) and issubclass(annotation, ServiceBusMessageActions)


def is_sdk_batch_type(annotation: Any) -> bool:
    """True when the SDK-type parameter takes a batch (`list[ServiceBusReceivedMessage]`)."""
    return is_sdk_message_type(annotation) and not isinstance(annotation, type)


# ----------------------------------------------------------------------------------------------------
# Input: broker message -> model_binding_data -> the real azure.servicebus.ServiceBusReceivedMessage
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelBindingData:
    """The fields of the worker protocol's `ModelBindingData` that the extension reads
    (serviceBusReceivedMessage.py)."""

    version: str
    source: str
    content_type: str
    content: bytes


@dataclass(frozen=True)
class CollectionModelBindingData:
    """The worker protocol's `CollectionModelBindingData` (serviceBusConverter.py reads
    `.model_binding_data`)."""

    model_binding_data: list[ModelBindingData]


def _ms(moment: datetime | None) -> int | None:
    if moment is None:
        return None
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return int(round(aware.timestamp() * 1000))


def _timestamp(moment: datetime | None) -> dict[str, Any] | None:
    millis = _ms(moment)
    return None if millis is None else {TYPE: AMQPTypes.timestamp, VALUE: millis}


def _body(msg: Any) -> bytes:
    body = msg.body
    return bytes(body) if isinstance(body, (bytes, bytearray)) else b"".join(body)


def _ttl_ms(ttl: timedelta | int | float | None) -> int | None:
    if ttl is None:
        return None
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else float(ttl)
    return int(seconds * 1000)


def _application_properties(msg: Any) -> dict[str | bytes, Any] | None:
    """Application properties, plus the dead-letter reason/description that Service Bus stores there."""
    props: dict[str | bytes, Any] = {
        (k.decode() if isinstance(k, bytes) else str(k)): v
        for k, v in (getattr(msg, "application_properties", None) or {}).items()
    }
    for name, attr in (
        ("DeadLetterReason", "dead_letter_reason"),
        ("DeadLetterErrorDescription", "dead_letter_error_description"),
    ):
        value = getattr(msg, attr, None)
        if value is not None and name not in props:
            props[name] = value
    return props or None


def _message_annotations(msg: Any) -> dict[str | bytes, Any]:
    annotations: dict[str | bytes, Any] = {
        _ENQUEUED_TIME: _timestamp(getattr(msg, "enqueued_time_utc", None)),
        _LOCKED_UNTIL: _timestamp(getattr(msg, "locked_until_utc", None)),
        _SCHEDULED_ENQUEUE_TIME: _timestamp(getattr(msg, "scheduled_enqueue_time_utc", None)),
    }
    sequence_number = getattr(msg, "sequence_number", None)
    if sequence_number is not None:
        annotations[_SEQUENCE_NUMBER] = {TYPE: AMQPTypes.long, VALUE: int(sequence_number)}
    return {k: v for k, v in annotations.items() if v is not None}


def _properties(msg: Any, ttl_ms: int | None) -> Properties:
    created = _ms(getattr(msg, "enqueued_time_utc", None))
    return Properties(
        message_id=msg.message_id,
        to=getattr(msg, "to", None),
        subject=msg.subject,
        reply_to=msg.reply_to,
        correlation_id=msg.correlation_id,
        content_type=msg.content_type,
        creation_time=created,
        absolute_expiry_time=created + ttl_ms if created is not None and ttl_ms else None,
        group_id=msg.session_id,
        reply_to_group_id=getattr(msg, "reply_to_session_id", None),
    )


def _lock_token(msg: Any) -> uuid.UUID:
    token = getattr(msg, "lock_token", None)
    if not token:
        raise ValueError("the message has no lock token (peeked or already settled): the SDK-type binding needs one")
    return token if isinstance(token, uuid.UUID) else uuid.UUID(str(token))


def encode_amqp_message(msg: Any, lock_token: uuid.UUID) -> bytes:
    """The received message as AMQP 1.0 bytes, sections in spec order: header, delivery annotations (the lock
    token, as Service Bus delivers it), message annotations (x-opt-*), properties, application properties, one
    data section. The SDK reads these where `azure/servicebus/_common/message.py` says (delivery_count ←
    header, sequence_number / enqueued_time_utc / locked_until_utc ← x-opt-* annotations, session_id ←
    group_id)."""
    ttl_ms = _ttl_ms(getattr(msg, "time_to_live", None))
    output = bytearray()
    header = Header(delivery_count=int(msg.delivery_count or 0), ttl=ttl_ms)
    encode_payload(output, Message(header=header))
    encode_value(
        output,
        {
            TYPE: AMQPTypes.described,
            VALUE: (
                {TYPE: AMQPTypes.ulong, VALUE: _DELIVERY_ANNOTATIONS},
                encode_annotations({_LOCK_TOKEN: {TYPE: AMQPTypes.uuid, VALUE: lock_token}}),
            ),
        },
    )
    encode_payload(
        output,
        Message(
            message_annotations=_message_annotations(msg) or None,
            properties=_properties(msg, ttl_ms),
            application_properties=_application_properties(msg),
            data=[_body(msg)],
        ),
    )
    return bytes(output)


def model_binding_data(msg: Any) -> ModelBindingData:
    """The `model_binding_data` the host sends for one message: the lock token (`Guid.ToByteArray()`, i.e.
    UUID bytes_le), then the AMQP message."""
    token = _lock_token(msg)
    return ModelBindingData(
        version=BINDING_VERSION,
        source=BINDING_SOURCE,
        content_type=BINDING_CONTENT_TYPE,
        content=token.bytes_le + encode_amqp_message(msg, token),
    )


def to_sdk_message(msg: Any) -> SdkReceivedMessage:
    """One broker message, decoded by the extension's `ServiceBusConverter.decode` as the worker does."""
    datum = Datum(model_binding_data(msg), "model_binding_data")
    return ServiceBusConverter.decode(datum, trigger_metadata=None, pytype=ServiceBusReceivedMessage)


def to_sdk_messages(msgs: Iterable[Any]) -> list[SdkReceivedMessage]:
    """Cardinality many: one `collection_model_binding_data` decoded into a list, as the worker does."""
    collection = CollectionModelBindingData([model_binding_data(m) for m in msgs])
    datum = Datum(collection, "collection_model_binding_data")
    return ServiceBusConverter.decode(datum, trigger_metadata=None, pytype=list[ServiceBusReceivedMessage])
