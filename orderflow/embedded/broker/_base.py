"""The embedded broker's base: connections, the writer lock, write transactions and the wake-ups they send,
entities (queues), and what happens when locks expire (release, dead-letter, session end)."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from azure.servicebus.exceptions import MessagingEntityNotFoundError

from orderflow.embedded import notify
from orderflow.embedded.config import QueueProperties, load_config_file, queues_from_config

from ._bus_faults import BusFaultInjector, BusFaults, InjectedFault
from ._schema import (
    _READY,
    _SCHEMA,
    ACTIVE,
    DEAD_LETTER,
    MAX_DELIVERY_REASON,
    STATE_DEFERRED,
    TTL_DESCRIPTION,
    TTL_REASON,
    WAKE_BOUND,
    Clock,
    _Tx,
    utc_now,
)

try:
    import fcntl
except ImportError:  # Windows: no flock; the thread lock and SQLite's busy handler order the writers
    fcntl = None  # type: ignore[assignment]


class WriterBusy(Exception):
    """The writer lock is held elsewhere and the call runs `inline_first` (it did nothing yet: run it in a thread)."""


_INLINE = threading.local()


@contextmanager
def inline_first() -> Iterator[None]:
    """Run a call on the caller's thread (an event loop's) only while the writer lock is free: the call's first
    transaction, if it would wait for the lock, raises WriterBusy before it does anything, and the caller runs the
    call again in a worker thread. Once one transaction got the lock the call goes on as any other, so a call that
    made a change never starts over. What the aio client saves is a hand-off to a thread and back per call."""
    _INLINE.first = True
    try:
        yield
    finally:
        _INLINE.first = False


class _WriterLock:
    """The writer lock of one database file, for every thread and every process: a threading.Lock within the
    process, then an exclusive flock(2) on `<db>.writer-lock` across processes, both taken before `BEGIN IMMEDIATE`.

    SQLite's own busy handler waits for another connection's write lock by sleeping in growing steps (1, 2, 5, 10 …
    up to 100 ms) and polling, so writers in several processes (devhost, the Agent, the client) contending for the
    broker stall for tens of milliseconds while the lock sits free; a blocked flock is woken by the kernel the moment
    the holder releases it. The kernel releases the flock of a process that dies (kill -9 included), so a crash
    never leaves it held. SQLite's locking still guards the file; this only orders the writers. Without fcntl
    (Windows) the thread lock alone is used and SQLite's busy handler orders the processes."""

    def __init__(self, path: str) -> None:
        self._thread_lock = threading.Lock()
        self._path = path + ".writer-lock"
        self._fd = -1
        self._pid = -1

    def _file(self) -> int:
        if self._fd < 0 or self._pid != os.getpid():  # a forked child opens its own (flock is per open file)
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
            self._pid = os.getpid()
        return self._fd

    def _acquire(self) -> None:
        """Both locks, waiting; under `inline_first`, the call's first acquisition does not wait (WriterBusy)."""
        wait = not getattr(_INLINE, "first", False)
        _INLINE.first = False
        if not self._thread_lock.acquire(blocking=wait):
            raise WriterBusy
        if fcntl is None:
            return
        try:
            fcntl.flock(self._file(), fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._thread_lock.release()
            raise WriterBusy from None
        except BaseException:
            self._thread_lock.release()
            raise

    @contextmanager
    def held(self) -> Iterator[None]:
        self._acquire()
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(self._file(), fcntl.LOCK_UN)
            self._thread_lock.release()


_WRITER_LOCKS: dict[str, _WriterLock] = {}
_WRITER_LOCKS_GUARD = threading.Lock()


def _writer_lock(path: str) -> _WriterLock:
    """The writer lock of one database file (one per file per process)."""
    found = _WRITER_LOCKS.get(path)
    if found is not None:
        return found
    with _WRITER_LOCKS_GUARD:
        real = os.path.realpath(path)
        lock = _WRITER_LOCKS.setdefault(real, _WriterLock(real))
        _WRITER_LOCKS[path] = lock
        return lock


class BrokerBase:
    """Connections, transactions, wake-ups and entities of one broker file."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
        duplicate_delivery: bool = False,
        faults: BusFaults | None = None,
    ) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.clock: Clock = clock or utc_now
        # Fault injection (_faults.py): lose the first complete of every message, so it is delivered twice.
        self.duplicate_delivery = duplicate_delivery
        # Fault injection (_bus_faults.py): server busy, timeouts, dropped connections; None when off.
        self.bus_faults = None if faults is None else BusFaultInjector(faults, self.path)
        self.notify_dir = notify.notify_dir_for(self.path)
        self._local = threading.local()
        # Each connection with the thread that opened it and alone uses it.
        self._connections: list[tuple[threading.Thread, sqlite3.Connection]] = []
        self._lock = threading.Lock()
        self._properties: dict[str, QueueProperties] = {}
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._create_schema()
        if config is not None:
            self.load_config(config)

    # -- connections and transactions ---------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None or self._local.pid != os.getpid():
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 30000")
            # NORMAL, as the state and Durable stores: in WAL mode a commit survives any crash of a process (kill -9),
            # only a power loss of the machine may take back the last ones (sqlite.org/pragma.html#pragma_synchronous).
            # FULL made every commit an fsync: about 25% of the local system's throughput (docs/devhost.md).
            conn.execute("PRAGMA synchronous = NORMAL")
            self._local.conn, self._local.pid = conn, os.getpid()
            with self._lock:
                self._connections.append((threading.current_thread(), conn))
        return conn

    def _create_schema(self) -> None:
        conn = self._conn()
        for attempt in range(50):  # switching a brand-new file to WAL can race with another process
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                break
            except sqlite3.OperationalError:
                if attempt == 49:
                    raise
                time.sleep(0.01 * (attempt + 1))
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in filter(str.strip, _SCHEMA.split(";")):
                conn.execute(statement)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    @contextmanager
    def _tx(self) -> Iterator[_Tx]:
        """One write transaction; the pokes it collects are sent after COMMIT (never before durability).

        Writers of one process queue on a process-wide lock per database file before `BEGIN IMMEDIATE`: SQLite's
        busy handler waits for a held lock by sleeping in growing steps (up to 100 ms), so many threads contending
        in SQLite itself add long stalls while the lock sits free; a Python lock hands it over at once. Across
        processes SQLite's own locking still applies.
        """
        conn = self._conn()
        with _writer_lock(self.path).held():
            conn.execute("BEGIN IMMEDIATE")
            changes = conn.total_changes
            tx = _Tx(conn, self._now())
            try:
                yield tx
                self._route_sessions(tx)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            # A transaction that changed nothing (a receive that lost the race for its message) ends as a read.
            conn.execute("COMMIT" if conn.total_changes != changes else "ROLLBACK")
        self._wake(tx)

    def _wake(self, tx: _Tx) -> None:
        """After COMMIT: claim the waiters that can take what the transaction made available (see notify)."""
        claimed = set()
        for key, count in tx.wakes.items():
            if notify.claim(self.notify_dir, key, min(count, WAKE_BOUND)):
                claimed.add(key)
        for key in tx.watches:
            notify.poke(self.notify_dir, key)
        for key, at in tx.dues.items():
            if key not in claimed:  # a claimed waiter re-reads the due moments before it sleeps again
                notify.cover(self.notify_dir, key, at)

    def _route_sessions(self, tx: _Tx) -> None:
        """Route the sessions that got ready (or scheduled) messages: to the receiver holding the session while its
        lock is valid, else to the NEXT_AVAILABLE_SESSION acceptors. Read at the end of the transaction, so a
        release in the same transaction routes to the acceptors."""
        for queue, session_id in tx.ready_sessions | set(tx.session_dues):
            key = self._session_key(tx, queue, session_id)
            if (queue, session_id) in tx.ready_sessions:
                tx.wakes[key] += 1
                if key == notify.queue_key(queue):
                    tx.watches.add(notify.watch_key(queue))
            at = tx.session_dues.get((queue, session_id))
            if at is not None:
                tx.due(key, at)

    @staticmethod
    def _session_key(tx: _Tx, queue: str, session_id: str) -> str:
        row = tx.conn.execute(
            "SELECT lock_token, locked_until FROM sessions WHERE queue = ? AND session_id = ?", (queue, session_id)
        ).fetchone()
        if row is not None and row[0] is not None and row[1] is not None and row[1] > tx.now:
            return notify.holder_key(queue, session_id, row[0])
        return notify.queue_key(queue)

    @staticmethod
    def _available(
        tx: _Tx, queue: str, props: QueueProperties, sub: str, session_id: str | None, at: float | None = None
    ) -> None:
        """A message became available (at `at`, if that is later than now): note whom to wake or cover."""
        later = at if at is not None and at > tx.now else None
        if props.requires_session and sub == ACTIVE and session_id is not None:
            if later is not None:
                key = (queue, session_id)
                tx.session_dues[key] = min(tx.session_dues.get(key, later), later)
            else:
                tx.ready_sessions.add((queue, session_id))
        elif later is not None:
            tx.due(notify.queue_key(queue, sub), later)
        else:
            tx.wakes[notify.queue_key(queue, sub)] += 1
            tx.watches.add(notify.watch_key(queue, sub))

    def _now(self) -> float:
        return self.clock().timestamp()

    def fault_for(self, op: str, queue: str) -> InjectedFault | None:
        """The injected answer to one client operation on `queue` (`BusFaults`), None when it goes ahead."""
        return None if self.bus_faults is None else self.bus_faults.draw(op, queue)

    def record_fault(self, fault: InjectedFault, retried: bool | None) -> None:
        if self.bus_faults is not None:
            self.bus_faults.record(fault, retried)

    def close(self) -> None:
        """Close the connections of this thread and of threads that have ended; drop the others.

        A live thread may still be inside a call on its connection (an aio receive whose await was cancelled goes on
        in its worker thread), and closing a connection under a running statement crashes the process (sqlite3
        finalizes the statement the other thread is stepping). Dropped, such a connection closes itself once its
        thread's call returns and its last reference goes.
        """
        with self._lock:
            connections, self._connections = self._connections, []
        me = threading.current_thread()
        for owner, conn in connections:
            if owner is me or not owner.is_alive():
                conn.close()
        self._local = threading.local()
        if self.bus_faults is not None:
            self.bus_faults.close()

    # -- entities -------------------------------------------------------------------------------------------

    def declare_queue(self, name: str, properties: QueueProperties | None = None, **kwargs: Any) -> QueueProperties:
        """Create or update a queue (idempotent). Keywords are QueueProperties fields (snake_case)."""
        props = properties or QueueProperties.create(**kwargs)
        with self._tx() as tx:
            tx.conn.execute(
                "INSERT INTO queues(name, properties) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET properties = excluded.properties",
                (name, props.to_json()),
            )
        self._properties[name] = props
        return props

    def load_config(self, config: Mapping[str, Any] | str | os.PathLike[str]) -> list[str]:
        """Declare every queue of a Config.json document or file; returns their names."""
        queues = queues_from_config(config) if isinstance(config, Mapping) else load_config_file(Path(config))
        for name, props in queues.items():
            self.declare_queue(name, props)
        return list(queues)

    def queue_properties(self, name: str) -> QueueProperties:
        props = self._properties.get(name)
        if props is None:
            row = self._conn().execute("SELECT properties FROM queues WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise MessagingEntityNotFoundError(message=f"The messaging entity '{name}' could not be found.")
            props = self._properties[name] = QueueProperties.from_json(row[0])
        return props

    def queue_names(self) -> list[str]:
        return [row[0] for row in self._conn().execute("SELECT name FROM queues ORDER BY name")]

    # -- housekeeping: expired locks, expired sessions, expired messages -----------------------------------

    def _housekeep(self, tx: _Tx, queue: str, props: QueueProperties) -> None:
        expired_locks = tx.conn.execute(
            "SELECT seq, sub, delivery_count, session_id, state FROM messages WHERE queue = ? AND locked_until <= ?",
            (queue, tx.now),
        ).fetchall()
        for seq, sub, count, session_id, state in expired_locks:
            self._release(tx, queue, props, seq, sub, count + 1, session_id, state)
        expired_sessions = tx.conn.execute(
            "SELECT session_id, lock_token FROM sessions WHERE queue = ? AND lock_token IS NOT NULL "
            "AND locked_until <= ?",
            (queue, tx.now),
        ).fetchall()
        for session_id, token in expired_sessions:
            self._release_session(tx, queue, props, session_id, token)
        self._expire_messages(tx, queue, props)

    def _expire_messages(self, tx: _Tx, queue: str, props: QueueProperties) -> None:
        expired = [
            row[0]
            for row in tx.conn.execute(
                "SELECT seq FROM messages WHERE queue = ? AND sub = '' AND expires_at <= ? AND lock_token IS NULL",
                (queue, tx.now),
            )
        ]
        for seq in expired:
            if props.dead_lettering_on_message_expiration:
                self._dead_letter(tx, queue, seq, TTL_REASON, TTL_DESCRIPTION)
            else:
                tx.conn.execute("DELETE FROM messages WHERE seq = ?", (seq,))

    def _release(
        self,
        tx: _Tx,
        queue: str,
        props: QueueProperties,
        seq: int,
        sub: str,
        count: int,
        session_id: str | None,
        state: int,
    ) -> None:
        """A delivery failed (abandon, lock expiry): count it; dead-letter at MaxDeliveryCount or unlock."""
        if sub == ACTIVE and count >= props.max_delivery_count:
            description = f"Message could not be consumed after {props.max_delivery_count} delivery attempts."
            tx.conn.execute("UPDATE messages SET delivery_count = ? WHERE seq = ?", (count, seq))
            self._dead_letter(tx, queue, seq, MAX_DELIVERY_REASON, description)
            return
        tx.conn.execute(
            "UPDATE messages SET delivery_count = ?, lock_token = NULL, locked_until = NULL WHERE seq = ?",
            (count, seq),
        )
        if state != STATE_DEFERRED:  # a deferred message is only received by its sequence number: nobody waits
            self._available(tx, queue, props, sub, session_id)

    @staticmethod
    def _dead_letter(tx: _Tx, queue: str, seq: int, reason: str | None, description: str | None) -> None:
        tx.conn.execute(
            "UPDATE messages SET sub = 'deadletter', state = 0, lock_token = NULL, locked_until = NULL, "
            "expires_at = NULL, dl_reason = ?, dl_description = ? WHERE seq = ?",
            (reason, description, seq),
        )
        tx.wakes[notify.queue_key(queue, DEAD_LETTER)] += 1
        tx.watches.add(notify.watch_key(queue, DEAD_LETTER))

    def _release_session(
        self, tx: _Tx, queue: str, props: QueueProperties, session_id: str, token: str, *, count: bool = True
    ) -> None:
        """The session lock ends (expiry or close): on expiry its unsettled messages count as failed deliveries; a
        receiver that closes (`count` False) counts none, as on Service Bus.

        Only the holder of `token` may end it: a receiver whose lock already expired (and was taken by another
        consumer) must not release the new holder's messages when it closes."""
        current = tx.conn.execute(
            "SELECT lock_token FROM sessions WHERE queue = ? AND session_id = ?", (queue, session_id)
        ).fetchone()
        if current is None or current[0] != token:
            return
        held = tx.conn.execute(
            "SELECT seq, delivery_count, state FROM messages WHERE queue = ? AND sub = '' AND session_id = ? "
            "AND lock_token IS NOT NULL AND locked_until IS NULL",
            (queue, session_id),
        ).fetchall()
        for seq, delivered, state in held:
            self._release(tx, queue, props, seq, ACTIVE, delivered + 1 if count else delivered, session_id, state)
        tx.conn.execute(
            "UPDATE sessions SET lock_token = NULL, locked_until = NULL "
            "WHERE queue = ? AND session_id = ? AND lock_token = ?",
            (queue, session_id, token),
        )
        ready = tx.conn.execute(
            f"SELECT 1 FROM messages WHERE queue = :queue AND sub = '' AND session_id = :sid AND {_READY} LIMIT 1",
            {"queue": queue, "sid": session_id, "now": tx.now},
        ).fetchone()
        if ready is not None:  # the session is free now: its messages go to the acceptors
            tx.ready_sessions.add((queue, session_id))
