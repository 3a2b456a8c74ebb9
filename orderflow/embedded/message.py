"""Messages of the embedded broker, shaped like azure-servicebus' ServiceBusMessage and ReceivedMessage.

`ServiceBusMessage` takes the SDK constructor's keywords. `to_envelope` also accepts the real
`azure.servicebus.ServiceBusMessage`, so code written against the SDK sends through the embedded client
unchanged. `ServiceBusReceivedMessage` exposes the SDK's received-message properties; like the SDK, `body`
of a data message is an iterable of bytes sections (`b"".join(msg.body)`) and `str(msg)` is the decoded body.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.servicebus import ServiceBusMessage as SdkServiceBusMessage
from azure.servicebus.amqp import AmqpMessageBodyType

PrimitiveTypes = int | float | bool | str | bytes | uuid.UUID | datetime | None


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


class ServiceBusMessage:
    """An outgoing message; same constructor keywords as `azure.servicebus.ServiceBusMessage`."""

    def __init__(
        self,
        body: str | bytes | None,
        *,
        application_properties: dict[Any, PrimitiveTypes] | None = None,
        session_id: str | None = None,
        message_id: str | None = None,
        scheduled_enqueue_time_utc: datetime | None = None,
        time_to_live: timedelta | int | None = None,
        content_type: str | None = None,
        correlation_id: str | None = None,
        subject: str | None = None,
        partition_key: str | None = None,
        to: str | None = None,
        reply_to: str | None = None,
        reply_to_session_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        self._encoding: str = kwargs.pop("encoding", "UTF-8")
        if not (body is None or isinstance(body, (str, bytes))):
            raise TypeError("ServiceBusMessage body must be a string, bytes, or None.")
        self._body: bytes = body.encode(self._encoding) if isinstance(body, str) else (body or b"")
        self.application_properties = application_properties
        self.session_id = session_id
        self.message_id = message_id
        self.scheduled_enqueue_time_utc = scheduled_enqueue_time_utc
        self.time_to_live = timedelta(seconds=time_to_live) if isinstance(time_to_live, int) else time_to_live
        self.content_type = content_type
        self.correlation_id = correlation_id
        self.subject = subject
        self.partition_key = partition_key
        self.to = to
        self.reply_to = reply_to
        self.reply_to_session_id = reply_to_session_id

    @property
    def body(self) -> Iterator[bytes]:
        """The data body as the SDK returns it: an iterable of bytes sections."""
        return iter((self._body,))

    @property
    def body_type(self) -> AmqpMessageBodyType:
        return AmqpMessageBodyType.DATA

    def __str__(self) -> str:
        return self._body.decode(self._encoding)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(body={str(self)[:200]!r}, session_id={self.session_id!r}, "
            f"message_id={self.message_id!r}, subject={self.subject!r})"
        )


class ServiceBusReceivedMessage(ServiceBusMessage):
    """A message handed out by the embedded broker; settle it through the receiver that received it."""

    def __init__(self, stored: StoredMessage, *, receiver: Any, peeked: bool = False, settled: bool = False):
        env = stored.envelope
        super().__init__(
            env.body,
            application_properties=dict(env.application_properties) or None,
            session_id=env.session_id,
            message_id=env.message_id,
            scheduled_enqueue_time_utc=env.scheduled_enqueue_time_utc,
            time_to_live=env.time_to_live,
            content_type=env.content_type,
            correlation_id=env.correlation_id,
            subject=env.subject,
            partition_key=env.partition_key,
            to=env.to,
            reply_to=env.reply_to,
            reply_to_session_id=env.reply_to_session_id,
        )
        self._stored = stored
        self._receiver = receiver
        self._is_peeked_message = peeked
        self._settled = settled
        self._expiry: datetime | None = stored.locked_until_utc

    @property
    def delivery_count(self) -> int:
        """Deliveries attempted before this one (0 on the first delivery, as the SDK reports it)."""
        return self._stored.delivery_count

    @property
    def enqueued_time_utc(self) -> datetime:
        return self._stored.enqueued_time_utc

    @property
    def expires_at_utc(self) -> datetime | None:
        return self._stored.expires_at_utc

    @property
    def sequence_number(self) -> int:
        return self._stored.sequence_number

    @property
    def enqueued_sequence_number(self) -> int:
        return self._stored.sequence_number

    @property
    def lock_token(self) -> str | None:
        return None if self._settled or self._is_peeked_message else self._stored.lock_token

    @property
    def locked_until_utc(self) -> datetime | None:
        """None once settled and for session messages (their lock is the session's), as in the SDK."""
        return None if self._settled else self._expiry

    @property
    def dead_letter_reason(self) -> str | None:
        return self._stored.dead_letter_reason

    @property
    def dead_letter_error_description(self) -> str | None:
        return self._stored.dead_letter_error_description

    @property
    def dead_letter_source(self) -> str | None:
        return self._stored.dead_letter_source

    @property
    def state(self) -> str:
        return self._stored.state


def to_envelope(message: ServiceBusMessage | SdkServiceBusMessage) -> Envelope:
    """Normalise our message or the SDK's (data body only) into what the broker stores."""
    if isinstance(message, SdkServiceBusMessage):
        if message.body_type != AmqpMessageBodyType.DATA:
            raise TypeError("the embedded broker supports data bodies only (str or bytes)")
    elif not isinstance(message, ServiceBusMessage):
        raise TypeError(f"expected ServiceBusMessage, got {type(message).__name__}")
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
