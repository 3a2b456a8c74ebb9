"""Dead-letter queues for operators: list, show and replay (`orderflow dlq list|show|replay QUEUE`), and their depth
for the ops summary.

Everything goes through the azure-servicebus aio API (Azure's client, or the embedded broker's aio client locally).
Reading needs Azure Service Bus Data Receiver on the queue; a replay also needs Data Sender. A replay sends a copy of
the dead-lettered message to its queue (body, SessionId, Subject, ContentType, CorrelationId, application
properties, plus the `orderflowReplay*` marker), then completes the dead-lettered one. The copy's MessageId is
`<original>:replay:<dead-letter sequence number>`, so a repeated replay is absorbed (why: docs/modules-product.md)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue

from orderflow.ports import BusClient
from orderflow.records import format_utc

PEEK_PAGE = 100
MESSAGE_ID_MAX = 128  # Service Bus: "MessageId ... maximum length is 128 characters"
REPLAY_OF = "orderflowReplayOf"
REPLAY_MARKERS = (REPLAY_OF, "orderflowReplayedBy", "orderflowReplayedAt", "orderflowOriginalMessageId")


class DeadLetterNotFound(LookupError):
    """No dead-lettered message with that sequence number on that queue."""


@dataclass(frozen=True)
class Depth:
    """Dead-lettered messages on one queue; `capped` when counting stopped at the cap (there are at least `count`)."""

    count: int
    capped: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "capped": self.capped}


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _when(value: Any) -> str | None:
    return format_utc(value) if isinstance(value, datetime) else None


def _properties(message: Any) -> dict[str, Any]:
    props = getattr(message, "application_properties", None) or {}
    return {_text(k) or "": (_text(v) if isinstance(v, bytes) else v) for k, v in props.items()}


def row(message: Any) -> dict[str, Any]:
    """One dead-lettered message as `dlq list` prints it (no body)."""
    return {
        "sequenceNumber": int(message.sequence_number),
        "messageId": _text(message.message_id),
        "sessionId": _text(message.session_id),
        "subject": _text(message.subject),
        "enqueuedTime": _when(message.enqueued_time_utc),
        "deliveryCount": message.delivery_count,
        "deadLetterReason": _text(message.dead_letter_reason),
        "deadLetterErrorDescription": _text(message.dead_letter_error_description),
        "deadLetterSource": _text(getattr(message, "dead_letter_source", None)),
    }


def detail(message: Any) -> dict[str, Any]:
    """One dead-lettered message whole, as `dlq show` prints it: the row, its properties and its body (JSON when it
    parses, else text)."""
    raw = b"".join(message.body) if not isinstance(message.body, bytes) else message.body
    text = raw.decode("utf-8", "replace")
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = text
    return {
        **row(message),
        "contentType": _text(message.content_type),
        "correlationId": _text(message.correlation_id),
        "applicationProperties": _properties(message),
        "body": body,
    }


async def peek(bus: BusClient, queue: str, limit: int, start: int = 0) -> list[Any]:
    """Up to `limit` dead-lettered messages of `queue` from sequence number `start`, oldest first (nothing is
    locked or removed)."""
    found: list[Any] = []
    async with bus.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
        while len(found) < limit:
            page = await receiver.peek_messages(
                max_message_count=min(PEEK_PAGE, limit - len(found)), sequence_number=start
            )
            found.extend(page)
            if not page:
                break
            start = int(page[-1].sequence_number) + 1
    return found[:limit]


async def show(bus: BusClient, queue: str, sequence_number: int) -> dict[str, Any]:
    page = await peek(bus, queue, 1, sequence_number)
    if not page or int(page[0].sequence_number) != sequence_number:
        raise DeadLetterNotFound(f"no dead-lettered message with sequence number {sequence_number} on {queue}")
    return detail(page[0])


async def depth(bus: BusClient, queue: str, cap: int = 1000) -> Depth:
    """How many messages `queue`'s dead-letter queue holds: the broker's own count where the client has one (the
    embedded broker), else counted by peeking, at most `cap` (peeking needs the Data Receiver role; the exact runtime
    count is the control plane's, orderflow/azure/queue_counts.py)."""
    broker = getattr(bus, "broker", None)
    if broker is not None and queue in broker.queue_names():
        return Depth(int(broker.counts(queue).dead_lettered))
    counted = len(await peek(bus, queue, cap + 1))
    return Depth(min(counted, cap), counted > cap)


def replay_message_id(original: str | None, sequence_number: int) -> str:
    """`<original>:replay:<seq>`, shortened with a hash when it would pass Service Bus's 128 characters."""
    message_id = f"{original or ''}:replay:{sequence_number}"
    if len(message_id) <= MESSAGE_ID_MAX:
        return message_id
    digest = hashlib.sha256(message_id.encode()).hexdigest()[:32]
    return f"{message_id[: MESSAGE_ID_MAX - 33]}~{digest}"


def replay_copy(message: Any, queue: str, by: str, now: datetime) -> ServiceBusMessage:
    """The copy a replay sends: the original's body and properties plus the replay marker (module docstring)."""
    seq = int(message.sequence_number)
    raw = b"".join(message.body) if not isinstance(message.body, bytes) else message.body
    props: dict[str | bytes, Any] = {k: v for k, v in _properties(message).items() if k not in REPLAY_MARKERS}
    props.update(
        {
            REPLAY_OF: f"{queue}/$deadletterqueue/{seq}",
            "orderflowReplayedBy": by,
            "orderflowReplayedAt": format_utc(now),
            "orderflowOriginalMessageId": _text(message.message_id) or "",
        }
    )
    return ServiceBusMessage(
        raw,
        message_id=replay_message_id(_text(message.message_id), seq),
        session_id=_text(message.session_id),
        subject=_text(message.subject),
        content_type=_text(message.content_type),
        correlation_id=_text(message.correlation_id),
        application_properties=props,
    )


async def replay(
    bus: BusClient,
    queue: str,
    sequence_numbers: Iterable[int] | None,
    by: str,
    now: datetime,
    limit: int = 500,
    max_wait: float = 2.0,
) -> list[dict[str, Any]]:
    """Replay the dead-lettered messages of `queue` with these sequence numbers (None: every one, at most `limit`).
    Each is sent, then completed; the others are abandoned untouched. Returns one row per replayed message, with its
    new MessageId. Raises DeadLetterNotFound naming any sequence number it did not find (after replaying the others).
    """
    wanted = None if sequence_numbers is None else set(sequence_numbers)
    done: list[dict[str, Any]] = []
    held: list[Any] = []
    seen: set[int] = set()
    async with (
        bus.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=max_wait) as receiver,
        bus.get_queue_sender(queue) as sender,
    ):
        try:
            while len(done) < limit and (wanted is None or len(done) < len(wanted)):
                batch = await receiver.receive_messages(
                    max_message_count=min(PEEK_PAGE, limit - len(done)), max_wait_time=max_wait
                )
                fresh = [m for m in batch if int(m.sequence_number) not in seen]
                if not fresh:
                    held.extend(batch)
                    break
                for message in fresh:
                    seq = int(message.sequence_number)
                    seen.add(seq)
                    if (wanted is not None and seq not in wanted) or len(done) >= limit:
                        held.append(message)
                        continue
                    copy = replay_copy(message, queue, by, now)
                    await sender.send_messages(copy)
                    await receiver.complete_message(message)
                    done.append({**row(message), "replayedAs": copy.message_id})
        finally:
            for message in held:
                await receiver.abandon_message(message)
    missing = sorted(wanted - {r["sequenceNumber"] for r in done}) if wanted is not None else []
    if missing:
        raise DeadLetterNotFound(
            f"no dead-lettered message with sequence number {', '.join(map(str, missing))} "
            f"on {queue}" + (f" (replayed {len(done)})" if done else "")
        )
    return done
