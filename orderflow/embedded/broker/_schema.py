"""The embedded broker's tables, SQL, constants and records, and the codec of a stored row."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from orderflow.embedded.message import Envelope, StoredMessage, decode_properties, encode_properties

Clock = Callable[[], datetime]
ACTIVE = ""
DEAD_LETTER = "deadletter"
STATE_ACTIVE, STATE_DEFERRED = 0, 1
# Reasons and descriptions Service Bus writes (service-bus-dead-letter-queues#dlq-message-count).
MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"
TTL_REASON = "TTLExpiredException"
TTL_DESCRIPTION = "The message expired and was dead lettered."
_NO_SESSION_ID = (
    "The SessionId was not set on a message, and it cannot be sent to the entity. Entities that have session "
    "support enabled can only receive messages that have the SessionId set to a valid value."
)
_MIN_WAIT = 0.005  # floor of a computed wait, so a due time equal to "now" cannot spin
# Waiters one transaction wakes per key at most: a batch of 100 messages wakes this many at once; each woken waiter
# that takes messages and sees more ready wakes the next one (notify), so the rest follow without a herd.
WAKE_BOUND = 8

_SCHEMA = """
CREATE TABLE IF NOT EXISTS queues(name TEXT PRIMARY KEY, properties TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS messages(
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    sub TEXT NOT NULL DEFAULT '',
    state INTEGER NOT NULL DEFAULT 0,
    session_id TEXT,
    message_id TEXT NOT NULL,
    meta TEXT NOT NULL,
    body BLOB NOT NULL,
    visible_at REAL NOT NULL,
    expires_at REAL,
    delivery_count INTEGER NOT NULL DEFAULT 0,
    lock_token TEXT,
    locked_until REAL,
    dl_reason TEXT,
    dl_description TEXT,
    dl_source TEXT
);
CREATE INDEX IF NOT EXISTS ix_messages_fifo ON messages(queue, sub, seq);
CREATE INDEX IF NOT EXISTS ix_messages_session ON messages(queue, sub, session_id, seq);
CREATE INDEX IF NOT EXISTS ix_messages_due ON messages(queue, visible_at) WHERE sub = '';
CREATE INDEX IF NOT EXISTS ix_messages_locks ON messages(queue, locked_until) WHERE locked_until IS NOT NULL;
CREATE INDEX IF NOT EXISTS ix_messages_expiry ON messages(queue, expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS sessions(
    queue TEXT NOT NULL, session_id TEXT NOT NULL, lock_token TEXT, locked_until REAL, state BLOB,
    PRIMARY KEY(queue, session_id)
);
CREATE TABLE IF NOT EXISTS dedup(
    queue TEXT NOT NULL, message_id TEXT NOT NULL, expires_at REAL NOT NULL, PRIMARY KEY(queue, message_id)
);
CREATE INDEX IF NOT EXISTS ix_dedup_expiry ON dedup(queue, expires_at);
CREATE TABLE IF NOT EXISTS redeliveries(
    queue TEXT NOT NULL, seq INTEGER NOT NULL, message_id TEXT NOT NULL, PRIMARY KEY(queue, seq)
);
"""
_COUNTS_SQL = """
SELECT COALESCE(SUM(sub = '' AND state = 0 AND visible_at <= :now), 0),
       COALESCE(SUM(sub = '' AND state = 0 AND visible_at > :now), 0),
       COALESCE(SUM(sub = 'deadletter'), 0),
       COALESCE(SUM(sub = '' AND state = 1), 0),
       COALESCE(SUM(sub = '' AND lock_token IS NOT NULL), 0),
       COUNT(DISTINCT CASE WHEN sub = '' AND state = 0 AND visible_at <= :now THEN session_id END)
FROM messages WHERE queue = :queue
"""
_NEXT_DUE_SQL = """
SELECT MIN(t) FROM (
    SELECT MIN(visible_at) AS t FROM messages WHERE queue = :q AND sub = '' AND visible_at > :now
    UNION ALL SELECT MIN(locked_until) FROM messages WHERE queue = :q AND locked_until IS NOT NULL
    UNION ALL SELECT MIN(locked_until) FROM sessions WHERE queue = :q AND lock_token IS NOT NULL
    UNION ALL SELECT MIN(expires_at) FROM messages WHERE queue = :q AND expires_at IS NOT NULL
        AND lock_token IS NULL
)
"""
_SESSION_DUE_SQL = """
SELECT MIN(t) FROM (
    SELECT MIN(visible_at) AS t FROM messages
        WHERE queue = :q AND sub = '' AND session_id = :sid AND visible_at > :now
    UNION ALL SELECT locked_until FROM sessions WHERE queue = :q AND session_id = :sid AND lock_token IS NOT NULL
)
"""
_COLUMNS = (
    "seq, session_id, message_id, meta, body, visible_at, expires_at, delivery_count, lock_token, "
    "locked_until, dl_reason, dl_description, dl_source, state"
)


def _ready(alias: str = "") -> str:
    """SQL condition of a deliverable message: active, unlocked, visible (scheduled time passed), alive."""
    a = f"{alias}." if alias else ""
    return (
        f"{a}state = 0 AND {a}lock_token IS NULL AND {a}visible_at <= :now "
        f"AND ({a}expires_at IS NULL OR {a}expires_at > :now)"
    )


_READY = _ready()


def utc_now() -> datetime:
    return datetime.now(UTC)


def _dt(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


@dataclass(frozen=True)
class Taken:
    """What one receive took, and whether ready messages for the same receivers remained after it (as its
    transaction saw them): a woken receiver uses that to wake the next one, and to expect to wait next time."""

    messages: list[StoredMessage]
    more_ready: bool


@dataclass(frozen=True)
class SessionLock:
    """A session lock held by one receiver: the session id and the receiver's lock token."""

    session_id: str
    token: str
    locked_until: datetime


@dataclass(frozen=True)
class QueueCounts:
    """Message counts of one queue, as Service Bus' QueueRuntimeProperties reports them."""

    active: int
    scheduled: int
    dead_lettered: int
    deferred: int
    locked: int
    sessions_with_backlog: int

    @property
    def total(self) -> int:
        return self.active + self.scheduled + self.dead_lettered + self.deferred


@dataclass
class _Tx:
    """One write transaction and whom it must wake after COMMIT."""

    conn: sqlite3.Connection
    now: float
    wakes: Counter[str] = field(default_factory=Counter)  # key → messages made available to its waiters
    watches: set[str] = field(default_factory=set)  # observer keys to poke
    dues: dict[str, float] = field(default_factory=dict)  # key → earliest due moment created
    ready_sessions: set[tuple[str, str]] = field(default_factory=set)  # routed at the end: holder or acceptors
    session_dues: dict[tuple[str, str], float] = field(default_factory=dict)

    def due(self, key: str, at: float) -> None:
        self.dues[key] = min(self.dues.get(key, at), at)


def _encode_meta(env: Envelope) -> str:
    return json.dumps(
        {
            "correlation_id": env.correlation_id,
            "reply_to": env.reply_to,
            "reply_to_session_id": env.reply_to_session_id,
            "subject": env.subject,
            "content_type": env.content_type,
            "to": env.to,
            "partition_key": env.partition_key,
            "application_properties": encode_properties(env.application_properties),
            "scheduled": env.scheduled_enqueue_time_utc.isoformat() if env.scheduled_enqueue_time_utc else None,
            "ttl": env.time_to_live.total_seconds() if env.time_to_live is not None else None,
        }
    )


def _stored(row: tuple[Any, ...], *, lock_token: str | None, locked_until: float | None) -> StoredMessage:
    (
        seq,
        session_id,
        message_id,
        meta_text,
        body,
        visible_at,
        expires_at,
        delivery_count,
        _lock,
        _until,
        dl_reason,
        dl_description,
        dl_source,
        state,
    ) = row
    meta = json.loads(meta_text)
    envelope = Envelope(
        body=bytes(body),
        message_id=message_id,
        session_id=session_id,
        correlation_id=meta["correlation_id"],
        reply_to=meta["reply_to"],
        reply_to_session_id=meta["reply_to_session_id"],
        subject=meta["subject"],
        content_type=meta["content_type"],
        to=meta["to"],
        partition_key=meta["partition_key"],
        application_properties=decode_properties(meta["application_properties"]),
        scheduled_enqueue_time_utc=datetime.fromisoformat(meta["scheduled"]) if meta["scheduled"] else None,
        time_to_live=timedelta(seconds=meta["ttl"]) if meta["ttl"] is not None else None,
    )
    return StoredMessage(
        envelope=envelope,
        sequence_number=seq,
        enqueued_time_utc=_dt(visible_at),  # type: ignore[arg-type]
        expires_at_utc=_dt(expires_at),
        delivery_count=delivery_count,
        lock_token=lock_token,
        locked_until_utc=_dt(locked_until),
        dead_letter_reason=dl_reason,
        dead_letter_error_description=dl_description,
        dead_letter_source=dl_source,
        state="deferred" if state == STATE_DEFERRED else "active",
    )
