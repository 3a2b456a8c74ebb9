"""Sending to the embedded broker: atomic batches, duplicate detection, scheduled messages and TTL."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from azure.servicebus.exceptions import ServiceBusError

from orderflow.embedded import notify
from orderflow.embedded.config import QueueProperties
from orderflow.embedded.message import Envelope

from ._base import BrokerBase
from ._schema import _NO_SESSION_ID, ACTIVE, DEAD_LETTER, _encode_meta, _Tx


class Sending(BrokerBase):
    """send, cancel_scheduled."""

    def send(self, queue: str, envelopes: Sequence[Envelope]) -> list[int | None]:
        """Enqueue atomically; returns sequence numbers (None for a duplicate dropped by detection)."""
        props = self.queue_properties(queue)
        if props.requires_session and any(env.session_id is None for env in envelopes):
            raise ServiceBusError(_NO_SESSION_ID)
        with self._tx() as tx:
            if props.requires_duplicate_detection:
                tx.conn.execute("DELETE FROM dedup WHERE queue = ? AND expires_at <= ?", (queue, tx.now))
            sequence_numbers = [self._insert(tx, queue, props, env) for env in envelopes]
        return sequence_numbers

    def _insert(self, tx: _Tx, queue: str, props: QueueProperties, env: Envelope) -> int | None:
        if props.requires_duplicate_detection and self._is_duplicate(tx, queue, props, env.message_id):
            return None
        scheduled = env.scheduled_enqueue_time_utc
        visible_at = max(tx.now, scheduled.timestamp()) if scheduled else tx.now
        ttls = [t for t in (env.time_to_live, props.default_message_time_to_live) if t is not None]
        expires_at = visible_at + min(ttls).total_seconds() if ttls else None
        cursor = tx.conn.execute(
            "INSERT INTO messages(queue, session_id, message_id, meta, body, visible_at, expires_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (queue, env.session_id, env.message_id, _encode_meta(env), env.body, visible_at, expires_at),
        )
        self._available(tx, queue, props, ACTIVE, env.session_id, visible_at)
        if expires_at is not None and props.dead_lettering_on_message_expiration:
            tx.due(notify.queue_key(queue, DEAD_LETTER), expires_at)  # it will feed the dead-letter queue then
        return cursor.lastrowid

    @staticmethod
    def _is_duplicate(tx: _Tx, queue: str, props: QueueProperties, message_id: str) -> bool:
        """Service Bus duplicate detection: a MessageId seen inside the window is accepted and dropped."""
        seen = tx.conn.execute(
            "SELECT 1 FROM dedup WHERE queue = ? AND message_id = ? AND expires_at > ?",
            (queue, message_id, tx.now),
        ).fetchone()
        if seen:
            return True
        window = props.duplicate_detection_history_time_window.total_seconds()
        tx.conn.execute(
            "INSERT OR REPLACE INTO dedup(queue, message_id, expires_at) VALUES (?, ?, ?)",
            (queue, message_id, tx.now + window),
        )
        return False

    def cancel_scheduled(self, queue: str, sequence_numbers: Iterable[int]) -> None:
        with self._tx() as tx:
            for seq in sequence_numbers:
                tx.conn.execute(
                    "DELETE FROM messages WHERE queue = ? AND seq = ? AND sub = '' AND visible_at > ?",
                    (queue, seq, tx.now),
                )
            # Nothing becomes available: a waiter that was to wake at the cancelled time wakes, finds nothing and
            # re-reads the next due moment.
