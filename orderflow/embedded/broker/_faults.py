"""The broker's fault switch, `duplicate_delivery` (connection string option `DuplicateDelivery=true`, off by default;
for the `duplicate-delivery` drill): a complete that the service never records, so the message comes again.

With the switch on, the first complete of each message on an active queue in peek-lock mode is lost: the broker
answers the consumer as usual but keeps the message, unlocks it with its delivery count + 1 (MaxDeliveryCount still
applies) and delivers it again at once; the second complete removes it. Each such message is noted in the
`redeliveries` table (`redelivered_counts` per queue). The switch belongs to the broker object (each process's
connection string), not to the file. Off, `complete` deletes the message. Source and scope: docs/modules-product.md."""

from __future__ import annotations

from orderflow.embedded.config import QueueProperties

from ._schema import ACTIVE, STATE_DEFERRED, _Tx
from ._sessions import Sessions


class Faults(Sessions):
    """The `duplicate_delivery` fault: a lost first complete."""

    def _lose_first_complete(
        self, tx: _Tx, queue: str, props: QueueProperties, seq: int, row: tuple[str, int, str | None, int]
    ) -> bool:
        """The `duplicate_delivery` fault: the first complete of an active message is lost, so the message is
        delivered again (a failed delivery: delivery count + 1). False (complete it) for its second complete, and for
        messages the fault leaves alone (dead-letter sub-queue, deferred)."""
        sub, count, session_id, state = row
        if sub != ACTIVE or state == STATE_DEFERRED:
            return False
        message_id = tx.conn.execute("SELECT message_id FROM messages WHERE seq = ?", (seq,)).fetchone()[0]
        noted = tx.conn.execute(
            "INSERT OR IGNORE INTO redeliveries(queue, seq, message_id) VALUES (?, ?, ?)", (queue, seq, message_id)
        ).rowcount
        if not noted:
            return False  # delivered twice already: this complete counts
        self._release(tx, queue, props, seq, sub, count + 1, session_id, state)
        return True

    def redelivered_counts(self) -> dict[str, int]:
        """Messages the `duplicate_delivery` fault delivered a second time, per queue (0 for none: not listed)."""
        rows = self._conn().execute("SELECT queue, COUNT(*) FROM redeliveries GROUP BY queue ORDER BY queue")
        return {str(queue): int(n) for queue, n in rows}
