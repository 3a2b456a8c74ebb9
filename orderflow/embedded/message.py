"""Messages of the embedded broker, as azure-servicebus has them: what is sent is the SDK's own `ServiceBusMessage`
(re-exported, so its checks and encoding apply), and what is received is the SDK's own `ServiceBusReceivedMessage`,
built from the AMQP message Service Bus would deliver (header, x-opt-* annotations, properties, application
properties with the dead-letter reason and description, one data section) and decoded by the SDK's AMQP decoder,
so every property reads as the SDK reads it (bytes keys and string values, a UUID lock token, ms timestamps).
`encoded_size` is the SDK's size of a message on the wire. Sources: docs/modules-product.md."""

from __future__ import annotations

import base64
import dataclasses
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch, ServiceBusMessageState, ServiceBusReceiveMode
from azure.servicebus import ServiceBusReceivedMessage as SdkServiceBusReceivedMessage
from azure.servicebus._common.constants import (
    _X_OPT_DEAD_LETTER_SOURCE,
    _X_OPT_ENQUEUE_SEQUENCE_NUMBER,
    _X_OPT_ENQUEUED_TIME,
    _X_OPT_LOCKED_UNTIL,
    _X_OPT_PARTITION_KEY,
    _X_OPT_SCHEDULED_ENQUEUE_TIME,
    _X_OPT_SEQUENCE_NUMBER,
    MESSAGE_STATE_NAME,
    PROPERTIES_DEAD_LETTER_ERROR_DESCRIPTION,
    PROPERTIES_DEAD_LETTER_REASON,
)
from azure.servicebus._common.utils import transform_outbound_messages
from azure.servicebus._pyamqp import utils as amqp_utils
from azure.servicebus._pyamqp._decode import decode_payload
from azure.servicebus._pyamqp._encode import encode_payload
from azure.servicebus._pyamqp.error import ErrorCondition
from azure.servicebus._pyamqp.message import Header, Message, Properties
from azure.servicebus._pyamqp.types import TYPE, VALUE, AMQPTypes
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from azure.servicebus.amqp import AmqpMessageBodyType
from azure.servicebus.exceptions import MessageSizeExceededError

from .config import QueueProperties

__all__ = ["Envelope", "ServiceBusMessage", "ServiceBusReceivedMessage", "SizeLimits", "StoredMessage", "encoded_size"]
PrimitiveTypes = int | float | bool | str | bytes | uuid.UUID | datetime | None
_UINT_MAX = 2**32 - 1  # the AMQP header's ttl is a uint of milliseconds
# Service Bus Standard: max-message-size announced on a sender link and the batch limit the SDK derives from it
# (azure/servicebus/_common/constants.py MAX_BATCH_SIZE_STANDARD; service-bus-quotas); a Premium-sized queue has its
# own (`SizeLimits`, from orderflow/embedded/config.py).
MAX_MESSAGE_SIZE_BYTES = 256 * 1024


@dataclass(frozen=True)
class Envelope:
    """What the broker stores for one sent message (everything but broker-assigned fields)."""

    body: bytes
    message_id: str
    session_id: str | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    reply_to_session_id: str | None = None
    subject: str | None = None
    content_type: str | None = None
    to: str | None = None
    partition_key: str | None = None
    application_properties: dict[str, Any] = field(default_factory=dict)
    scheduled_enqueue_time_utc: datetime | None = None
    time_to_live: timedelta | None = None


@dataclass(frozen=True)
class StoredMessage:
    """One message as the broker hands it out (a received, peeked or dead-lettered message)."""

    envelope: Envelope
    sequence_number: int
    enqueued_time_utc: datetime
    expires_at_utc: datetime | None
    delivery_count: int
    lock_token: str | None
    locked_until_utc: datetime | None
    dead_letter_reason: str | None
    dead_letter_error_description: str | None
    dead_letter_source: str | None
    state: str


class ServiceBusReceivedMessage(SdkServiceBusReceivedMessage):
    """The SDK's received message, plus the broker's record of it (`_stored`: sequence number and lock token)."""

    _stored: StoredMessage


def received_message(
    stored: StoredMessage,
    receiver: Any,
    *,
    receive_mode: ServiceBusReceiveMode = ServiceBusReceiveMode.PEEK_LOCK,
    peeked: bool = False,
    deferred: bool = False,
    scheduled: bool = False,
) -> ServiceBusReceivedMessage:
    """The SDK's `ServiceBusReceivedMessage` of a stored message, through the SDK's AMQP encoder and decoder (as
    `ServiceBusReceivedMessage.from_bytes` builds one); the lock token goes in as the transport passes it."""
    output = bytearray()
    encode_payload(output, _amqp_message(stored, scheduled))
    token = stored.lock_token
    message = ServiceBusReceivedMessage(
        decode_payload(memoryview(output)),
        receive_mode=receive_mode,
        receiver=receiver,
        lock_token=uuid.UUID(token) if token and not peeked else None,
        is_peeked_message=peeked,
        is_deferred_message=deferred,
    )
    message._stored = stored
    return message


def _ms(moment: datetime | None) -> dict[str, Any] | None:
    if moment is None:
        return None
    return {TYPE: AMQPTypes.timestamp, VALUE: int(_aware(moment).timestamp() * 1000)}  # type: ignore[union-attr]


def _amqp_message(stored: StoredMessage, scheduled: bool) -> Message:
    """What Service Bus delivers for a stored message (the annotations the SDK reads: _common/message.py)."""
    env = stored.envelope
    ttl = env.time_to_live  # a message TTL over the queue's default is cut to it, as Service Bus adjusts it
    if ttl is not None and stored.expires_at_utc is not None:
        ttl = min(ttl, stored.expires_at_utc - stored.enqueued_time_utc)
    ttl_ms = int(ttl.total_seconds() * 1000) if ttl is not None else None
    state = ServiceBusMessageState.DEFERRED if stored.state == "deferred" else ServiceBusMessageState.ACTIVE
    annotations: dict[bytes, Any] = {
        _X_OPT_ENQUEUED_TIME: _ms(stored.enqueued_time_utc),
        _X_OPT_SEQUENCE_NUMBER: {TYPE: AMQPTypes.long, VALUE: stored.sequence_number},
        # No auto-forwarding here: the sequence number of the first enqueue is the message's own.
        _X_OPT_ENQUEUE_SEQUENCE_NUMBER: {TYPE: AMQPTypes.long, VALUE: stored.sequence_number},
        _X_OPT_LOCKED_UNTIL: _ms(stored.locked_until_utc),
        _X_OPT_SCHEDULED_ENQUEUE_TIME: _ms(env.scheduled_enqueue_time_utc),
        _X_OPT_PARTITION_KEY: env.partition_key,
        _X_OPT_DEAD_LETTER_SOURCE: stored.dead_letter_source,
        MESSAGE_STATE_NAME: int(ServiceBusMessageState.SCHEDULED if scheduled else state),
    }
    properties: dict[Any, Any] = dict(env.application_properties)
    # Service Bus keeps a dead-letter reason and description as application properties (service-bus-dead-letter-
    # queues); the SDK reads them there (_common/message.py dead_letter_reason).
    for key, value in (
        (PROPERTIES_DEAD_LETTER_REASON, stored.dead_letter_reason),
        (PROPERTIES_DEAD_LETTER_ERROR_DESCRIPTION, stored.dead_letter_error_description),
    ):
        if value is not None:
            properties[key.decode()] = value
    return Message(
        header=Header(
            delivery_count=stored.delivery_count,
            ttl=ttl_ms if ttl_ms is not None and 0 < ttl_ms <= _UINT_MAX else None,
        ),
        message_annotations={k: v for k, v in annotations.items() if v is not None},
        properties=Properties(
            message_id=env.message_id,
            to=env.to,
            subject=env.subject,
            reply_to=env.reply_to,
            correlation_id=env.correlation_id,
            content_type=env.content_type,
            group_id=env.session_id,
            reply_to_group_id=env.reply_to_session_id,
        ),
        application_properties=properties or None,
        data=[env.body],
    )


def encoded_size(message: ServiceBusMessage) -> int:
    """The size of `message` as the SDK encodes it for a transfer (`get_message_encoded_size`): body, header,
    properties, annotations and application properties."""
    outgoing = PyamqpTransport.to_outgoing_amqp_message(message.raw_amqp_message)
    return int(amqp_utils.get_message_encoded_size(outgoing))  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class SizeLimits:
    """What a sender's link allows: one message (the entity's max-message-size, announced on attach) and one batch
    (the SDK's `_max_batch_size_on_link`, derived from it: orderflow/embedded/config.py)."""

    message: int = MAX_MESSAGE_SIZE_BYTES
    batch: int = MAX_MESSAGE_SIZE_BYTES

    @classmethod
    def of(cls, properties: QueueProperties) -> SizeLimits:
        return cls(properties.max_message_size_bytes, properties.max_batch_size_bytes)


STANDARD = SizeLimits()


def new_batch(max_size_in_bytes: int | None = None, limits: SizeLimits = STANDARD) -> ServiceBusMessageBatch:
    """`create_message_batch`: the SDK's own batch, sized as it sizes one (azure/servicebus/_servicebus_sender.py
    `create_message_batch`, against the link's max batch size)."""
    if max_size_in_bytes and max_size_in_bytes > limits.batch:
        raise ValueError(
            f"Max message size: {max_size_in_bytes} is too large, acceptable max batch size is: {limits.batch} bytes."
        )
    return ServiceBusMessageBatch(max_size_in_bytes=max_size_in_bytes or limits.batch)


def _outgoing(message: Any, limits: SizeLimits) -> tuple[list[ServiceBusMessage], bool]:
    """What `send_messages` sends (azure/servicebus/_servicebus_sender.py `send_messages`): a batch as it is; a list
    made into one batch (MessageSizeExceededError past the batch limit, from the SDK's `ServiceBusMessageBatch`); one
    message as it is. A dict or AmqpAnnotatedMessage becomes a ServiceBusMessage as the SDK converts it."""
    if isinstance(message, ServiceBusMessageBatch):
        return list(message._messages), False
    converted = transform_outbound_messages(message, ServiceBusMessage, PyamqpTransport.to_outgoing_amqp_message)
    if isinstance(converted, list):
        batch = new_batch(limits=limits)
        batch._from_list(converted)
        return list(batch._messages), False
    return [converted], True


def _check_size(message: ServiceBusMessage, limit: int) -> None:
    """The service refuses a transfer over the link's max-message-size (amqp:link:message-size-exceeded), which the
    SDK raises as MessageSizeExceededError (_transport/_pyamqp_transport.py _ERROR_CODE_TO_ERROR_MAPPING). The
    description is this mirror's; the class and condition are the SDK's."""
    size = encoded_size(message)
    if size > limit:
        raise MessageSizeExceededError(
            message=f"The received message (size: {size} bytes) exceeds the limit ({limit} bytes) "
            "currently allowed on the link.",
            condition=ErrorCondition.LinkMessageSizeExceeded,
        )


def envelopes_of(
    message: Any, schedule_time_utc: datetime | None = None, limits: SizeLimits = STANDARD
) -> list[Envelope]:
    """What `send_messages` (or, with a time, `schedule_messages`) stores, sized as the SDK and the service size it:
    scheduled messages go in one management request, unbatched, each message within the link's limit."""
    try:
        if len(message) == 0:  # the SDK sends nothing for an empty list or batch
            return []
    except TypeError:
        pass
    if schedule_time_utc is None:
        outgoing, single = _outgoing(message, limits)
    else:
        converted = transform_outbound_messages(message, ServiceBusMessage, PyamqpTransport.to_outgoing_amqp_message)
        outgoing, single = (converted if isinstance(converted, list) else [converted]), True
    if single:  # a batch was sized by the SDK; each single transfer is sized by the service
        for item in outgoing:
            _check_size(item, limits.message)
    envelopes = [to_envelope(item) for item in outgoing]
    if schedule_time_utc is not None:
        envelopes = [dataclasses.replace(env, scheduled_enqueue_time_utc=schedule_time_utc) for env in envelopes]
    return envelopes


def to_envelope(message: ServiceBusMessage) -> Envelope:
    """An SDK message (data body only) → what the broker stores."""
    if not isinstance(message, ServiceBusMessage):
        raise TypeError(f"expected ServiceBusMessage, got {type(message).__name__}")
    if message.body_type != AmqpMessageBodyType.DATA:
        raise TypeError("the embedded broker supports data bodies only (str or bytes)")
    ttl = message.time_to_live
    return Envelope(
        body=b"".join(message.body),
        message_id=str(message.message_id) if message.message_id else uuid.uuid4().hex,
        session_id=message.session_id,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
        reply_to_session_id=message.reply_to_session_id,
        subject=message.subject,
        content_type=message.content_type,
        to=message.to,
        partition_key=message.partition_key,
        application_properties=_str_keys(message.application_properties),
        scheduled_enqueue_time_utc=_aware(message.scheduled_enqueue_time_utc),
        time_to_live=timedelta(seconds=ttl) if isinstance(ttl, (int, float)) else ttl,
    )


def _str_keys(properties: dict[Any, Any] | None) -> dict[str, Any]:
    if not properties:
        return {}
    return {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in properties.items()}


def _aware(moment: datetime | None) -> datetime | None:
    """Naive datetimes are UTC (the SDK documents `*_utc` values)."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def encode_properties(properties: dict[str, Any]) -> str:
    """Application properties → JSON, keeping the AMQP primitive types bytes, UUID and datetime."""
    return json.dumps({k: _encode_value(v) for k, v in properties.items()})


def decode_properties(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    return {k: _decode_value(v) for k, v in json.loads(text).items()}


def _encode_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode()}
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    if isinstance(value, datetime):
        return {"$datetime": _aware(value).isoformat()}  # type: ignore[union-attr]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"application property values must be AMQP primitives, got {type(value).__name__}")


def _decode_value(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    if "$bytes" in value:
        return base64.b64decode(value["$bytes"])
    if "$uuid" in value:
        return uuid.UUID(value["$uuid"])
    return datetime.fromisoformat(value["$datetime"])
