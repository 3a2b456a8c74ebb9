"""AMQP messages and the broker's records: entity addresses, inbound messages and Service Bus batches to
envelopes, stored messages to the annotated AMQP messages Service Bus delivers, lock tokens and .NET ticks.
Mapping and sources: docs/modules-product.md."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from proton import Data, Message, ProtonException, int32, symbol, timestamp

from orderflow.embedded.broker import ACTIVE, DEAD_LETTER
from orderflow.embedded.message import Envelope, StoredMessage

from ._errors import NOT_IMPLEMENTED, AmqpError

MAX_MESSAGE_SIZE = 256 * 1024  # Standard tier: service-bus-quotas, "Maximum message size"
_DOTNET_EPOCH = datetime(1, 1, 1, tzinfo=UTC)  # .NET ticks count 100 ns from here (DATETIMEOFFSET_EPOCH in the SDK)
_DEAD_LETTER_SUFFIX = "/$deadletterqueue"
_MANAGEMENT_SUFFIX = "/$management"
# Section descriptors of the AMQP message format (amqp-core-messaging 3.2): header .. footer.
_HEADER, _ANNOTATIONS, _PROPERTIES, _APPLICATION_PROPERTIES = 0x70, 0x72, 0x73, 0x74
_DATA, _SEQUENCE, _VALUE, _FOOTER = 0x75, 0x76, 0x77, 0x78
_STATE_ACTIVE, _STATE_DEFERRED, _STATE_SCHEDULED = 0, 1, 2  # x-opt-message-state (ServiceBusMessageState)


@dataclass(frozen=True)
class Address:
    """What a link address names: a queue (or its dead-letter queue), or its `$management` node."""

    queue: str
    sub_queue: str = ACTIVE
    management: bool = False


def parse_address(address: str | None) -> Address | None:
    """`amqps://host:port/q`, `sb://host/q`, `q`, `q/$DeadLetterQueue` and either with `/$management`; None if empty."""
    if not address:
        return None
    path = urlsplit(address).path if "://" in address else address
    path = path.strip("/")
    management = path.lower().endswith(_MANAGEMENT_SUFFIX)
    if management:
        path = path[: -len(_MANAGEMENT_SUFFIX)]
    sub_queue = ACTIVE
    if path.lower().endswith(_DEAD_LETTER_SUFFIX):
        path, sub_queue = path[: -len(_DEAD_LETTER_SUFFIX)], DEAD_LETTER
    return Address(path, sub_queue, management) if path else None


# -- time -------------------------------------------------------------------------------------------------------


def to_ticks(moment: datetime) -> int:
    """A UTC moment as .NET ticks (100 ns since 0001-01-01), as `com.microsoft:locked-until-utc` carries it."""
    return (moment - _DOTNET_EPOCH) // timedelta(microseconds=1) * 10


def to_timestamp(moment: datetime) -> timestamp:
    """A moment as an AMQP timestamp (milliseconds since the Unix epoch)."""
    return timestamp(int(moment.timestamp() * 1000))


def from_timestamp(value: int) -> datetime:
    return datetime.fromtimestamp(int(value) / 1000, UTC)


def delivery_tag(lock_token: str) -> bytes:
    """The delivery tag of a locked message: its lock token as a .NET Guid's bytes, which the SDK reads back with
    `uuid.UUID(bytes_le=tag)` (azure/servicebus/_common/message.py `lock_token`)."""
    return uuid.UUID(lock_token).bytes_le


# -- inbound: what a client sends -------------------------------------------------------------------------------


def owned(value: Any) -> Any:
    """A decoded value with its binaries copied out (proton's memoryviews point into its own, freed, buffers)."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, list):
        return [owned(item) for item in value]
    if isinstance(value, dict):
        return {owned(key): owned(item) for key, item in value.items()}
    return value


def _sections(payload: bytes) -> list[tuple[int, Any]]:
    """The top-level sections of an encoded AMQP message: (descriptor code, value), in order."""
    sections: list[tuple[int, Any]] = []
    position = 0
    while position < len(payload):
        data = Data()
        used = data.decode(payload[position:])
        if used <= 0:
            raise ValueError("not an AMQP message")
        data.rewind()
        if not data.next() or not data.is_described():
            raise ValueError("not an AMQP message section")
        data.enter()
        data.next()
        code = data.get_object()
        data.next()
        value = owned(data.get_object())
        data.exit()
        if not isinstance(code, int) or not _HEADER <= code <= _FOOTER:
            raise ValueError("not an AMQP message section")
        sections.append((int(code), value))
        position += used
    return sections


def _is_message(payload: bytes) -> bool:
    try:
        codes = [code for code, _ in _sections(payload)]
    except (ValueError, KeyError, TypeError, ProtonException):
        return False
    return bool(codes) and any(code in (_DATA, _SEQUENCE, _VALUE) for code in codes)


def decode_transfer(payload: bytes) -> list[Envelope]:
    """One transfer → the envelopes to store: one message, or the messages of a Service Bus batch (a message
    whose data sections each hold an encoded message; the SDKs mark it with message-format 0x80013700, which
    proton does not expose, so the content decides). Raises AmqpError for a body the broker cannot store."""
    try:
        sections = _sections(payload)
    except (ValueError, KeyError, TypeError, ProtonException) as exc:
        raise AmqpError("amqp:decode-error", f"The message could not be decoded: {exc}") from exc
    data = [bytes(value) for code, value in sections if code == _DATA]
    bodies = [code for code, _ in sections if code in (_DATA, _SEQUENCE, _VALUE)]
    if data and len(data) == len(bodies) and all(_is_message(item) for item in data):
        return [_envelope(_sections(item)) for item in data]
    return [_envelope(sections)]


def _field(values: Any, index: int) -> Any:
    return values[index] if isinstance(values, list) and index < len(values) else None


def _envelope(sections: list[tuple[int, Any]]) -> Envelope:
    """One message from its sections (read here, not through proton's Message, which turns an absent
    content-type into the symbol 'None')."""
    if any(code in (_SEQUENCE, _VALUE) for code, _ in sections):
        raise AmqpError(NOT_IMPLEMENTED, "The local endpoint stores data bodies only (amqp-value/sequence body).")
    by_code = {code: value for code, value in sections if code != _DATA}
    header, props = by_code.get(_HEADER), by_code.get(_PROPERTIES)
    annotations = {str(k): v for k, v in (by_code.get(_ANNOTATIONS) or {}).items()}
    scheduled = annotations.get("x-opt-scheduled-enqueue-time")
    ttl = _field(header, 2)
    return Envelope(
        body=b"".join(bytes(value) for code, value in sections if code == _DATA),
        message_id=_text(_field(props, 0)) or uuid.uuid4().hex,
        to=_text(_field(props, 2)),
        subject=_text(_field(props, 3)),
        reply_to=_text(_field(props, 4)),
        correlation_id=_text(_field(props, 5)),
        content_type=_text(_field(props, 6)),
        session_id=_text(_field(props, 10)),
        reply_to_session_id=_text(_field(props, 12)),
        partition_key=_text(annotations.get("x-opt-partition-key")),
        application_properties=application_properties(by_code.get(_APPLICATION_PROPERTIES)),
        scheduled_enqueue_time_utc=from_timestamp(scheduled) if scheduled is not None else None,
        time_to_live=timedelta(milliseconds=int(ttl)) if ttl else None,
    )


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).hex()
    return str(value)


def application_properties(properties: Mapping[Any, Any] | None) -> dict[str, Any]:
    """AMQP application properties → the primitives the broker stores (str, int, float, bool, bytes, UUID,
    datetime, None); anything else is refused, as Service Bus refuses non-primitive properties."""
    return {str(key): primitive(value) for key, value in (properties or {}).items()}


def primitive(value: Any) -> Any:
    if value is None or isinstance(value, (bool, float, uuid.UUID)):
        return value
    if isinstance(value, timestamp):
        return from_timestamp(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytes, memoryview, bytearray)):
        return bytes(value)
    raise AmqpError("amqp:invalid-field", f"Application property values must be primitive, not {type(value)}.")


# -- outbound: what a client receives -------------------------------------------------------------------------


def encode_stored(
    stored: StoredMessage,
    *,
    now: datetime,
    lock_token: str | None = None,
    locked_until: datetime | None = None,
) -> bytes:
    """A stored message as Service Bus delivers it: the properties the sender set, the broker's annotations
    (sequence number, enqueued time, lock token and locked-until, state), the delivery count in the header, and
    a dead letter's reason and description as application properties."""
    env = stored.envelope
    message: Any = Message(body=env.body, inferred=True)  # proton's annotations type these fields too narrowly
    message.id = env.message_id
    message.group_id = env.session_id
    message.correlation_id = env.correlation_id
    message.reply_to = env.reply_to
    message.reply_to_group_id = env.reply_to_session_id
    message.subject = env.subject
    if env.content_type is not None:
        message.content_type = symbol(env.content_type)
    message.address = env.to
    message.properties = outbound_properties(stored)
    message.annotations = _annotations(stored, now, lock_token, locked_until)
    return _header(stored) + _without_header(bytes(message.encode()))


def _without_header(encoded: bytes) -> bytes:
    """proton's encoding less the (empty) header section it always writes: the SDKs read the last header."""
    if not encoded.startswith(b"\x00\x53\x70"):
        return encoded
    return encoded[Data().decode(encoded) :]


def _header(stored: StoredMessage) -> bytes:
    """The header section, written here: proton leaves out a delivery-count of 0 (and with it the header), and
    the SDKs read `delivery_count` from it (None without it). Durable, as Service Bus stores every message."""
    ttl = stored.envelope.time_to_live
    data = Data()
    data.put_described()
    data.enter()
    data.put_ulong(_HEADER)
    data.put_list()
    data.enter()
    data.put_bool(True)  # durable
    data.put_ubyte(4)  # priority (the default)
    if ttl is None:
        data.put_null()
    else:
        data.put_uint(min(int(ttl.total_seconds() * 1000), 2**32 - 1))
    data.put_bool(False)  # first-acquirer
    data.put_uint(stored.delivery_count)
    data.exit()
    data.exit()
    return bytes(data.encode())


def outbound_properties(stored: StoredMessage) -> dict[str, Any] | None:
    properties: dict[str, Any] = {
        key: to_timestamp(value) if isinstance(value, datetime) else value
        for key, value in stored.envelope.application_properties.items()
    }
    if stored.dead_letter_reason is not None:
        properties["DeadLetterReason"] = stored.dead_letter_reason
    if stored.dead_letter_error_description is not None:
        properties["DeadLetterErrorDescription"] = stored.dead_letter_error_description
    return properties or None


def _annotations(
    stored: StoredMessage, now: datetime, lock_token: str | None, locked_until: datetime | None
) -> dict[symbol, Any]:
    env = stored.envelope
    if stored.state == "deferred":
        state = _STATE_DEFERRED
    else:
        state = _STATE_SCHEDULED if stored.enqueued_time_utc > now else _STATE_ACTIVE
    annotations: dict[symbol, Any] = {
        symbol("x-opt-sequence-number"): stored.sequence_number,
        symbol("x-opt-enqueue-sequence-number"): stored.sequence_number,
        symbol("x-opt-enqueued-time"): to_timestamp(stored.enqueued_time_utc),
        symbol("x-opt-message-state"): int32(state),
    }
    if lock_token is not None:
        annotations[symbol("x-opt-lock-token")] = uuid.UUID(lock_token)
    if locked_until is not None:
        annotations[symbol("x-opt-locked-until")] = to_timestamp(locked_until)
    if env.partition_key is not None:
        annotations[symbol("x-opt-partition-key")] = env.partition_key
    if env.scheduled_enqueue_time_utc is not None:
        annotations[symbol("x-opt-scheduled-enqueue-time")] = to_timestamp(env.scheduled_enqueue_time_utc)
    if stored.dead_letter_source is not None:
        annotations[symbol("x-opt-deadletter-source")] = stored.dead_letter_source
    return annotations
