"""Observing and waiting on the embedded broker: counts, due moments, readiness, and a host's blocking wait."""

from __future__ import annotations

import time
from datetime import datetime

from orderflow.embedded import notify

from ._base import BrokerBase
from ._schema import (
    _COUNTS_SQL,
    _MIN_WAIT,
    _NEXT_DUE_SQL,
    _READY,
    _SESSION_DUE_SQL,
    ACTIVE,
    QueueCounts,
    SessionLock,
    _dt,
    _ready,
    _Tx,
)


class Waiting(BrokerBase):
    """counts, next_due, wait_seconds, has_ready, wait_for_activity and the keys and moments waiters use."""

    @staticmethod
    def _next_available_session(tx: _Tx, queue: str) -> str | None:
        row = tx.conn.execute(
            f"SELECT m.session_id FROM messages m LEFT JOIN sessions s "
            f"ON s.queue = m.queue AND s.session_id = m.session_id "
            f"WHERE m.queue = :queue AND m.sub = '' AND m.session_id IS NOT NULL AND {_ready('m')} "
            f"AND s.lock_token IS NULL ORDER BY m.seq LIMIT 1",
            {"queue": queue, "now": tx.now},
        ).fetchone()
        return None if row is None else row[0]

    def counts(self, queue: str) -> QueueCounts:
        """Message counts (read-only: expired messages are purged lazily by receivers, as in Service Bus)."""
        self.queue_properties(queue)
        row = self._conn().execute(_COUNTS_SQL, {"queue": queue, "now": self._now()}).fetchone()
        return QueueCounts(*row)

    def next_due(self, queue: str) -> datetime | None:
        """The next moment something may become available without a poke: a scheduled message, a lock or
        session lock expiry, or a TTL expiry (which feeds the dead-letter queue)."""
        row = self._conn().execute(_NEXT_DUE_SQL, {"q": queue, "now": self._now()}).fetchone()
        return _dt(row[0])

    def wait_seconds(self, queue: str, remaining: float) -> float:
        """How long a waiter may block: the remaining time, cut at the queue's next due moment."""
        due = self.next_due(queue)
        if due is None:
            return remaining
        return min(remaining, max((due - self.clock()).total_seconds(), _MIN_WAIT))

    def new_waiter(self) -> notify.Waiter:
        """A receiver's socket for waking it (see `notify` for how it registers before it sleeps)."""
        return notify.Waiter(self.notify_dir)

    @staticmethod
    def wake_key(queue: str, sub_queue: str = ACTIVE, session: SessionLock | None = None) -> str:
        """Whom a waiting receiver waits with: the session it holds, else its queue (on a session queue: the
        NEXT_AVAILABLE_SESSION acceptors)."""
        if session is not None:
            return notify.holder_key(queue, session.session_id, session.token)
        return notify.queue_key(queue, sub_queue)

    def now_ts(self) -> float:
        """The broker clock as a timestamp (due moments and published wake times are in it)."""
        return self._now()

    def due_at(self, queue: str, session: SessionLock | None = None) -> float | None:
        """The next moment something may become available to a waiter without a poke, as a timestamp: for the
        holder of a session, a scheduled message of the session falling due or its own lock expiring; otherwise
        `next_due` of the queue."""
        if session is None:
            row = self._conn().execute(_NEXT_DUE_SQL, {"q": queue, "now": self._now()}).fetchone()
        else:
            params = {"q": queue, "sid": session.session_id, "now": self._now()}
            row = self._conn().execute(_SESSION_DUE_SQL, params).fetchone()
        return None if row[0] is None else float(row[0])

    def _may_receive(self, queue: str, sub_queue: str, session: SessionLock | None) -> bool:
        """Whether `receive` could find something; a cheap read that spares the write lock when it cannot. Within
        a session: a ready message of that session; otherwise as `has_ready` (which counts due expiries)."""
        if session is None:
            return self.has_ready(queue, sub_queue)
        row = (
            self._conn()
            .execute(
                "SELECT 1 FROM messages WHERE queue = :queue AND sub = :sub AND session_id = :sid "
                f"AND {_READY} LIMIT 1",
                {"queue": queue, "sub": sub_queue, "sid": session.session_id, "now": self._now()},
            )
            .fetchone()
        )
        if row is not None:
            return True
        due = self.next_due(queue)
        return due is not None and due.timestamp() <= self._now()

    def has_ready(self, queue: str, sub_queue: str = ACTIVE) -> bool:
        """Whether a receive could get a message now: a ready message (in an unlocked session, for a session
        queue), or a due lock/TTL expiry that the next receive will act on."""
        props = self.queue_properties(queue)
        now = self._now()
        if props.requires_session and sub_queue == ACTIVE:
            tx = _Tx(self._conn(), now)
            found = self._next_available_session(tx, queue) is not None
        else:
            found = (
                self._conn()
                .execute(
                    f"SELECT 1 FROM messages WHERE queue = :queue AND sub = :sub AND {_READY} LIMIT 1",
                    {"queue": queue, "sub": sub_queue, "now": now},
                )
                .fetchone()
                is not None
            )
        if found:
            return True
        due = self.next_due(queue)
        return due is not None and due.timestamp() <= now

    def wait_for_activity(self, queue: str, timeout: float, sub_queue: str = ACTIVE) -> bool:
        """Block until a receive on the queue may get a message (True) or `timeout` seconds pass (False).
        For a host dispatcher: no CPU while idle, woken by a send from any process."""
        deadline = time.monotonic() + timeout
        with self.new_waiter() as waiter:
            # An observer: woken by every event of the queue (notify.poke), never claimed, so it does not take a
            # wake-up away from a receiver.
            waiter.ensure_registered(notify.watch_key(queue, sub_queue), waiter.start())
            while not self.has_ready(queue, sub_queue):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                waiter.wait(self.wait_seconds(queue, remaining))
            return True
