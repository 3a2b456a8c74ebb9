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

Fault injection, `duplicate_delivery` (connection string option `DuplicateDelivery=true`, off by default; for the
`duplicate-delivery` drill): Service Bus delivers at least once. A complete that the service never records (the link
drops after the consumer sent it; the consumer believes it settled) means the same message, same MessageId and
sequence number, is delivered again with its delivery count + 1, and duplicate detection does not help, because
nothing was sent twice (message-transfers-locks-settlement, "Settling receive operations"; duplicate-detection: it
acts on sends only). With the switch on, the first complete of each message on an active queue in peek-lock mode is
lost that way: the broker answers the consumer as usual but keeps the message, unlocks it with its delivery count +
1 (a failed delivery, so MaxDeliveryCount still applies) and delivers it again at once (to the session's holder,
else the next acceptor); the second complete removes it. Each such message is noted in the `redeliveries` table
(`redelivered_counts` per queue). Not duplicated: dead-lettered, deferred and receive-and-delete messages, and the
dead-letter sub-queue. The switch belongs to the broker object (each process's connection string), not to the file:
every process of a drill must set it. Off, `complete` is the plain delete it always was.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from azure.servicebus.exceptions import (
    MessageLockLostError,
    MessageNotFoundError,
    MessagingEntityNotFoundError,
    ServiceBusError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

from . import notify

try:
    import fcntl
except ImportError:  # Windows: no flock; the thread lock and SQLite's busy handler order the writers
    fcntl = None  # type: ignore[assignment]
from .config import QueueProperties, load_config_file, queues_from_config
from .message import Envelope, decode_properties, encode_properties

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

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._thread_lock:
            if fcntl is None:
                yield
                return
            fd = self._file()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)


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


def utc_now() -> datetime:
    return datetime.now(UTC)


def _dt(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


@dataclass(frozen=True)
class StoredMessage:
    """One message as the broker hands it out (a received, peeked or dead-lettered message)."""

    envelope: Envelope
    sequence_number: int
    enqueued_time_utc: datetime
    expires_at_utc: datetime | None
    delivery_count: int
    lock_token: str | None
    locked_until_utc: datetime | None
    dead_letter_reason: str | None
    dead_letter_error_description: str | None
    dead_letter_source: str | None
    state: str


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


class EmbeddedBroker:
    """Service Bus queues in a SQLite file. Thread-safe; safe for several processes on the same file."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
        duplicate_delivery: bool = False,
    ) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.clock: Clock = clock or utc_now
        # Fault injection (module docstring): lose the first complete of every message, so it is delivered twice.
        self.duplicate_delivery = duplicate_delivery
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

    # -- entities -------------------------------------------------------------------------------------------

    def declare_queue(
        self, name: str, properties: QueueProperties | None = None, **kwargs: Any
    ) -> QueueProperties:
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
                raise MessagingEntityNotFoundError(
                    message=f"The messaging entity '{name}' could not be found."
                )
            props = self._properties[name] = QueueProperties.from_json(row[0])
        return props

    def queue_names(self) -> list[str]:
        return [row[0] for row in self._conn().execute("SELECT name FROM queues ORDER BY name")]

    # -- sending --------------------------------------------------------------------------------------------

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
                "SELECT seq FROM messages WHERE queue = ? AND sub = '' AND expires_at <= ? "
                "AND lock_token IS NULL",
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
        self, tx: _Tx, queue: str, props: QueueProperties, session_id: str, token: str
    ) -> None:
        """The session lock ends (expiry or close): its unsettled messages count as failed deliveries.

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
        for seq, count, state in held:
            self._release(tx, queue, props, seq, ACTIVE, count + 1, session_id, state)
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

    # -- receiving ------------------------------------------------------------------------------------------

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
                    f"SELECT {_COLUMNS} FROM messages WHERE queue = ? AND seq = ? AND state = 1 "
                    "AND lock_token IS NULL",
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

    def abandon(self, queue: str, seq: int, lock_token: str, *, session: SessionLock | None = None) -> None:
        with self._locked_message(queue, seq, lock_token, session) as (tx, props, row):
            self._release(tx, queue, props, seq, row[0], row[1] + 1, row[2], row[3])

    def defer(self, queue: str, seq: int, lock_token: str, *, session: SessionLock | None = None) -> None:
        with self._locked_message(queue, seq, lock_token, session) as (tx, _props, _row):
            tx.conn.execute(
                "UPDATE messages SET state = 1, lock_token = NULL, locked_until = NULL WHERE seq = ?", (seq,)
            )

    def dead_letter(
        self,
        queue: str,
        seq: int,
        lock_token: str,
        *,
        reason: str | None = None,
        error_description: str | None = None,
        session: SessionLock | None = None,
    ) -> None:
        with self._locked_message(queue, seq, lock_token, session) as (tx, _props, _row):
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

    # -- sessions -------------------------------------------------------------------------------------------

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
    def _next_available_session(tx: _Tx, queue: str) -> str | None:
        row = tx.conn.execute(
            f"SELECT m.session_id FROM messages m LEFT JOIN sessions s "
            f"ON s.queue = m.queue AND s.session_id = m.session_id "
            f"WHERE m.queue = :queue AND m.sub = '' AND m.session_id IS NOT NULL AND {_ready('m')} "
            f"AND s.lock_token IS NULL ORDER BY m.seq LIMIT 1",
            {"queue": queue, "now": tx.now},
        ).fetchone()
        return None if row is None else row[0]

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
        """Give the session up (receiver closed); a no-op if the lock was already lost."""
        props = self.queue_properties(queue)
        with self._tx() as tx:
            self._release_session(tx, queue, props, session.session_id, session.token)

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

    # -- observing and waiting ------------------------------------------------------------------------------

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
        row = self._conn().execute(
            f"SELECT 1 FROM messages WHERE queue = :queue AND sub = :sub AND session_id = :sid AND {_READY} LIMIT 1",
            {"queue": queue, "sub": sub_queue, "sid": session.session_id, "now": self._now()},
        ).fetchone()
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
            "scheduled": env.scheduled_enqueue_time_utc.isoformat()
            if env.scheduled_enqueue_time_utc
            else None,
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
