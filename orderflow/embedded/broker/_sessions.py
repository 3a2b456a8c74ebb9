"""Message sessions on the embedded broker: the exclusive session lock, its renewal and release, session state."""

from __future__ import annotations

import uuid

from azure.servicebus.exceptions import ServiceBusError, SessionCannotBeLockedError, SessionLockLostError

from orderflow.embedded import notify

from ._schema import DEAD_LETTER, SessionLock, _dt, _Tx
from ._waiting import Waiting


class Sessions(Waiting):
    """accept_session, renew_session_lock, release_session, get_session_state, set_session_state."""

    def accept_session(self, queue: str, session_id: str | None) -> SessionLock | None:
        """Lock a session (None = the next available one). None if no session has ready messages."""
        props = self.queue_properties(queue)
        if not props.requires_session:
            raise ServiceBusError(
                f"It is not possible for an entity that does not require sessions ({queue}) "
                "to create a session receiver."
            )
        if session_id is None and not self.has_ready(queue):
            return None  # read-only check first (WAL readers never block): no write lock for nothing
        with self._tx() as tx:
            self._housekeep(tx, queue, props)
            chosen = self._next_available_session(tx, queue) if session_id is None else session_id
            if chosen is None:
                return None
            self._ensure_session_free(tx, queue, chosen)
            token = str(uuid.uuid4())
            until = tx.now + props.lock_duration.total_seconds()
            tx.conn.execute(
                "INSERT INTO sessions(queue, session_id, lock_token, locked_until) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(queue, session_id) DO UPDATE SET lock_token = excluded.lock_token, "
                "locked_until = excluded.locked_until",
                (queue, chosen, token, until),
            )
            # When the lock expires the session is free again for the acceptors, and its held messages count a
            # failed delivery (which may dead-letter them).
            tx.due(notify.queue_key(queue), until)
            tx.due(notify.queue_key(queue, DEAD_LETTER), until)
        return SessionLock(chosen, token, _dt(until))  # type: ignore[arg-type]

    @staticmethod
    def _ensure_session_free(tx: _Tx, queue: str, session_id: str) -> None:
        row = tx.conn.execute(
            "SELECT 1 FROM sessions WHERE queue = ? AND session_id = ? AND lock_token IS NOT NULL",
            (queue, session_id),
        ).fetchone()
        if row is not None:
            raise SessionCannotBeLockedError(
                message=f"The requested session '{session_id}' cannot be accepted. "
                "It may be locked by another receiver."
            )

    @staticmethod
    def _check_session(tx: _Tx, queue: str, session: SessionLock) -> None:
        row = tx.conn.execute(
            "SELECT lock_token, locked_until FROM sessions WHERE queue = ? AND session_id = ?",
            (queue, session.session_id),
        ).fetchone()
        if row is None or row[0] != session.token or row[1] <= tx.now:
            raise SessionLockLostError()

    def renew_session_lock(self, queue: str, session: SessionLock) -> SessionLock:
        props = self.queue_properties(queue)
        with self._tx() as tx:
            self._check_session(tx, queue, session)
            until = tx.now + props.lock_duration.total_seconds()
            tx.conn.execute(
                "UPDATE sessions SET locked_until = ? WHERE queue = ? AND session_id = ?",
                (until, queue, session.session_id),
            )
        return SessionLock(session.session_id, session.token, _dt(until))  # type: ignore[arg-type]

    def release_session(self, queue: str, session: SessionLock) -> None:
        """Give the session up (receiver closed); a no-op if the lock was already lost. Its unsettled messages come
        back without a failed delivery: Service Bus counts one only when the session lock expires (message-sessions,
        "Impact of delivery count": session closed with messages locked, delivery count incremented: No). A lock
        that expired before the close was lost, not given up: its messages count the failed delivery."""
        props = self.queue_properties(queue)
        with self._tx() as tx:
            row = tx.conn.execute(
                "SELECT locked_until FROM sessions WHERE queue = ? AND session_id = ? AND lock_token = ?",
                (queue, session.session_id, session.token),
            ).fetchone()
            expired = row is not None and row[0] is not None and row[0] <= tx.now
            self._release_session(tx, queue, props, session.session_id, session.token, count=expired)

    def get_session_state(self, queue: str, session: SessionLock) -> bytes | None:
        with self._tx() as tx:
            self._check_session(tx, queue, session)
            row = tx.conn.execute(
                "SELECT state FROM sessions WHERE queue = ? AND session_id = ?", (queue, session.session_id)
            ).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def set_session_state(self, queue: str, session: SessionLock, state: bytes | None) -> None:
        with self._tx() as tx:
            self._check_session(tx, queue, session)
            tx.conn.execute(
                "UPDATE sessions SET state = ? WHERE queue = ? AND session_id = ?",
                (state, queue, session.session_id),
            )
