"""Receiving from and settling on the embedded broker: peek-lock, receive-and-delete, deferred messages, peek,
complete, abandon, release, defer, dead-letter and lock renewal."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from azure.servicebus.exceptions import MessageLockLostError, MessageNotFoundError

from orderflow.embedded import notify
from orderflow.embedded.config import QueueProperties
from orderflow.embedded.message import StoredMessage, decode_properties, encode_properties

from ._faults import Faults
from ._schema import _COLUMNS, _READY, ACTIVE, DEAD_LETTER, SessionLock, Taken, _dt, _stored, _Tx


class Receiving(Faults):
    """receive, take, receive_deferred, peek, the settlements and the lock-token lookup."""

    def receive(
        self,
        queue: str,
        max_count: int,
        *,
        sub_queue: str = ACTIVE,
        session: SessionLock | None = None,
        delete: bool = False,
    ) -> list[StoredMessage]:
        """Lock (or, with `delete`, remove) up to `max_count` ready messages, in sequence order."""
        return self.take(queue, max_count, sub_queue=sub_queue, session=session, delete=delete).messages

    def take(
        self,
        queue: str,
        max_count: int,
        *,
        sub_queue: str = ACTIVE,
        session: SessionLock | None = None,
        delete: bool = False,
    ) -> Taken:
        """`receive`, also telling whether ready messages remained for the same receivers."""
        props = self.queue_properties(queue)
        if not self._may_receive(queue, sub_queue, session):
            return Taken([], False)  # a read, not a write transaction: a receiver that finds nothing writes nothing
        with self._tx() as tx:
            self._housekeep(tx, queue, props)
            if session is not None:
                self._check_session(tx, queue, session)
            rows = self._ready_rows(tx, queue, sub_queue, session, max_count + 1)  # one more: is more ready?
            more = len(rows) > max_count
            taken = [
                self._take(tx, queue, sub_queue, props, row, delete, session is not None) for row in rows[:max_count]
            ]
            if not more:
                # Housekeeping in this transaction may have made messages available (an expired lock) that this
                # receive then took: with nothing left, nobody is to be woken for them.
                tx.wakes.pop(notify.queue_key(queue, sub_queue), None)
            return Taken(taken, more)

    def _ready_rows(
        self, tx: _Tx, queue: str, sub: str, session: SessionLock | None, limit: int
    ) -> list[tuple[Any, ...]]:
        params = {"queue": queue, "sub": sub, "now": tx.now, "limit": limit}
        where = f"queue = :queue AND sub = :sub AND {_READY}"
        if session is not None:
            where += " AND session_id = :session_id"
            params["session_id"] = session.session_id
        return tx.conn.execute(
            f"SELECT {_COLUMNS} FROM messages WHERE {where} ORDER BY seq LIMIT :limit", params
        ).fetchall()

    @staticmethod
    def _take(
        tx: _Tx,
        queue: str,
        sub: str,
        props: QueueProperties,
        row: tuple[Any, ...],
        delete: bool,
        in_session: bool,
    ) -> StoredMessage:
        seq = row[0]
        if delete:
            tx.conn.execute("DELETE FROM messages WHERE seq = ?", (seq,))
            return _stored(row, lock_token=None, locked_until=None)
        token = str(uuid.uuid4())
        locked_until = None if in_session else tx.now + props.lock_duration.total_seconds()
        tx.conn.execute(
            "UPDATE messages SET lock_token = ?, locked_until = ? WHERE seq = ?", (token, locked_until, seq)
        )
        if locked_until is not None:  # when the lock expires the message is redelivered (or dead-lettered)
            tx.due(notify.queue_key(queue, sub), locked_until)
            if sub == ACTIVE and row[7] + 1 >= props.max_delivery_count:
                tx.due(notify.queue_key(queue, DEAD_LETTER), locked_until)
        return _stored(row, lock_token=token, locked_until=locked_until)

    def receive_deferred(
        self, queue: str, sequence_numbers: Sequence[int], *, session: SessionLock | None = None
    ) -> list[StoredMessage]:
        """Lock deferred messages by sequence number (MessageNotFoundError if one is not deferred)."""
        props = self.queue_properties(queue)
        with self._tx() as tx:
            if session is not None:
                self._check_session(tx, queue, session)
            taken = []
            for seq in sequence_numbers:
                row = tx.conn.execute(
                    f"SELECT {_COLUMNS} FROM messages WHERE queue = ? AND seq = ? AND state = 1 AND lock_token IS NULL",
                    (queue, seq),
                ).fetchone()
                if row is None:
                    raise MessageNotFoundError(message=f"deferred message {seq} not found in {queue}")
                taken.append(self._take(tx, queue, ACTIVE, props, row, False, session is not None))
            return taken

    def peek(
        self,
        queue: str,
        from_sequence: int,
        max_count: int,
        *,
        sub_queue: str = ACTIVE,
        session_id: str | None = None,
    ) -> list[StoredMessage]:
        """Browse without locking: active, locked, scheduled and deferred messages from a sequence number."""
        self.queue_properties(queue)
        where = "queue = ? AND sub = ? AND seq >= ?"
        params: list[Any] = [queue, sub_queue, from_sequence]
        if session_id is not None:
            where += " AND session_id = ?"
            params.append(session_id)
        rows = self._conn().execute(
            f"SELECT {_COLUMNS} FROM messages WHERE {where} ORDER BY seq LIMIT ?", (*params, max_count)
        )
        return [_stored(row, lock_token=None, locked_until=None) for row in rows]

    # -- settling -------------------------------------------------------------------------------------------

    def complete(self, queue: str, seq: int, lock_token: str, *, session: SessionLock | None = None) -> None:
        with self._locked_message(queue, seq, lock_token, session) as (tx, props, row):
            if self.duplicate_delivery and self._lose_first_complete(tx, queue, props, seq, row):
                return
            tx.conn.execute("DELETE FROM messages WHERE seq = ?", (seq,))

    def abandon(
        self,
        queue: str,
        seq: int,
        lock_token: str,
        *,
        session: SessionLock | None = None,
        properties: Mapping[str, Any] | None = None,
    ) -> None:
        """Unlock with a failed delivery (count + 1; MaxDeliveryCount applies); `properties` are merged into the
        message's application properties (Service Bus `propertiesToModify`)."""
        with self._locked_message(queue, seq, lock_token, session) as (tx, props, row):
            self._modify_properties(tx, seq, properties)
            self._release(tx, queue, props, seq, row[0], row[1] + 1, row[2], row[3])

    def release(self, queue: str, seq: int, lock_token: str, *, session: SessionLock | None = None) -> None:
        """Unlock without counting a delivery (AMQP `released`: the message was not processed)."""
        with self._locked_message(queue, seq, lock_token, session) as (tx, props, row):
            self._release(tx, queue, props, seq, row[0], row[1], row[2], row[3])

    def defer(
        self,
        queue: str,
        seq: int,
        lock_token: str,
        *,
        session: SessionLock | None = None,
        properties: Mapping[str, Any] | None = None,
    ) -> None:
        with self._locked_message(queue, seq, lock_token, session) as (tx, _props, _row):
            self._modify_properties(tx, seq, properties)
            tx.conn.execute(
                "UPDATE messages SET state = 1, lock_token = NULL, locked_until = NULL WHERE seq = ?", (seq,)
            )

    @staticmethod
    def _modify_properties(tx: _Tx, seq: int, properties: Mapping[str, Any] | None) -> None:
        if not properties:
            return
        meta = json.loads(tx.conn.execute("SELECT meta FROM messages WHERE seq = ?", (seq,)).fetchone()[0])
        merged = decode_properties(meta["application_properties"]) | dict(properties)
        meta["application_properties"] = encode_properties(merged)
        tx.conn.execute("UPDATE messages SET meta = ? WHERE seq = ?", (json.dumps(meta), seq))

    def locked_sequence(self, queue: str, lock_token: str) -> int | None:
        """The sequence number of the message of `queue` (or its dead-letter queue) locked under `lock_token`."""
        row = (
            self._conn()
            .execute("SELECT seq FROM messages WHERE queue = ? AND lock_token = ?", (queue, lock_token))
            .fetchone()
        )
        return None if row is None else int(row[0])

    def dead_letter(
        self,
        queue: str,
        seq: int,
        lock_token: str,
        *,
        reason: str | None = None,
        error_description: str | None = None,
        session: SessionLock | None = None,
        properties: Mapping[str, Any] | None = None,
    ) -> None:
        with self._locked_message(queue, seq, lock_token, session) as (tx, _props, _row):
            self._modify_properties(tx, seq, properties)
            self._dead_letter(tx, queue, seq, reason, error_description)

    def renew_message_lock(self, queue: str, seq: int, lock_token: str) -> datetime:
        with self._locked_message(queue, seq, lock_token, None) as (tx, props, _row):
            until = tx.now + props.lock_duration.total_seconds()
            tx.conn.execute("UPDATE messages SET locked_until = ? WHERE seq = ?", (until, seq))
        return _dt(until)  # type: ignore[return-value]

    @contextmanager
    def _locked_message(
        self, queue: str, seq: int, lock_token: str, session: SessionLock | None
    ) -> Iterator[tuple[_Tx, QueueProperties, tuple[str, int, str | None, int]]]:
        """A transaction on a message whose lock the caller still holds, else the SDK's lock-lost error."""
        props = self.queue_properties(queue)
        with self._tx() as tx:
            if session is not None:
                self._check_session(tx, queue, session)
            row = tx.conn.execute(
                "SELECT sub, delivery_count, lock_token, locked_until, session_id, state FROM messages "
                "WHERE queue = ? AND seq = ?",
                (queue, seq),
            ).fetchone()
            expired = row is None or row[2] != lock_token or (session is None and (row[3] or 0) <= tx.now)
            if expired:
                raise MessageLockLostError()
            yield tx, props, (row[0], row[1], row[4], row[5])
