"""The embedded Service Bus broker: queues, peek-locks, sessions and dead-lettering in one SQLite file.

Several OS processes may use the same file at once (devhost, the Agent worker, a CLI): the database runs in
WAL mode, every state change is one `BEGIN IMMEDIATE` transaction, and a waiting receiver is woken across
processes by `notify`: each transaction notes which receivers can take what it made available (a queue's
receivers, its dead-letter receivers, a session's holder or, for a free session, the NEXT_AVAILABLE_SESSION
acceptors) and, after COMMIT, claims and wakes one idle waiter per message (at most `WAKE_BOUND` per
transaction and key), not every waiter. Due moments it creates (a scheduled message, a lock that will expire) are
`cover`ed: some idle waiter of the key wakes by then. Receivers look with a read before they take the write lock,
so one that finds nothing writes nothing.

Semantics follow Service Bus (https://learn.microsoft.com/azure/service-bus-messaging/):
message-transfers-locks-settlement (peek-lock, lock expiry → redelivery with delivery count + 1),
service-bus-dead-letter-queues (MaxDeliveryCountExceeded, TTLExpiredException, dead_letter_message),
message-sessions (exclusive session lock, FIFO in a session, session state), duplicate-detection,
message-sequencing (scheduled messages), message-expiration (TTL; expired messages are purged lazily
when a receiver pulls, as Service Bus does). Time comes from an injectable `clock`, so lock expiry, windows
and TTL are testable without sleeping.

The broker is split on its seams: `_schema` (tables, SQL, records), `_base` (connections, transactions,
wake-ups, entities, lock expiry), `_send`, `_receive` (receive and settle), `_sessions`, `_faults` (the
`duplicate_delivery` switch) and `_waiting` (counts, due moments, waiting); this package re-exports what callers use.
"""

from __future__ import annotations

from orderflow.embedded.message import StoredMessage

from ._receive import Receiving
from ._schema import (
    ACTIVE,
    DEAD_LETTER,
    MAX_DELIVERY_REASON,
    TTL_DESCRIPTION,
    TTL_REASON,
    WAKE_BOUND,
    Clock,
    QueueCounts,
    SessionLock,
    Taken,
    utc_now,
)
from ._send import Sending

__all__ = [
    "ACTIVE",
    "DEAD_LETTER",
    "MAX_DELIVERY_REASON",
    "TTL_DESCRIPTION",
    "TTL_REASON",
    "WAKE_BOUND",
    "Clock",
    "EmbeddedBroker",
    "QueueCounts",
    "SessionLock",
    "StoredMessage",
    "Taken",
    "utc_now",
]


class EmbeddedBroker(Receiving, Sending):
    """Service Bus queues in a SQLite file. Thread-safe; safe for several processes on the same file."""
