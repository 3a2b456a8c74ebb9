"""The embedded Service Bus broker: queues, peek-locks, sessions and dead-lettering in one SQLite file.

Several OS processes may use the same file at once (devhost, the Agent worker, a CLI): WAL mode, one
`BEGIN IMMEDIATE` transaction per state change, and cross-process wake-ups through `notify` (one idle waiter per
message, not every waiter). Semantics follow Service Bus (https://learn.microsoft.com/azure/service-bus-messaging/):
peek-lock and redelivery, dead-letter queues, sessions, duplicate detection, scheduled messages and TTL. Time comes
from an injectable `clock`. Split on its seams: `_schema`, `_base`, `_send`, `_receive`, `_sessions`, `_faults`,
`_bus_faults` and `_waiting`; this package re-exports what callers use. Notes: docs/modules-product.md."""

from __future__ import annotations

from orderflow.embedded.message import StoredMessage

from ._bus_faults import BusFaults, InjectedFault
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
    "BusFaults",
    "DEAD_LETTER",
    "MAX_DELIVERY_REASON",
    "TTL_DESCRIPTION",
    "TTL_REASON",
    "WAKE_BOUND",
    "Clock",
    "EmbeddedBroker",
    "InjectedFault",
    "QueueCounts",
    "SessionLock",
    "StoredMessage",
    "Taken",
    "utc_now",
]


class EmbeddedBroker(Receiving, Sending):
    """Service Bus queues in a SQLite file. Thread-safe; safe for several processes on the same file."""
