"""The embedded store's file: its schema, one connection used one call at a time, write transactions, and the row
helpers the adapters share."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from orderflow.errors import NotFound, PreconditionFailed
from orderflow.ports import Versioned
from orderflow.records import OrderStateRecord, ProcessState

from ._access import StoreAccess
from ._faults import FaultInjector, StoreFaults

T = TypeVar("T")
BUSY_TIMEOUT_SECONDS = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    id TEXT PRIMARY KEY, etag TEXT NOT NULL, doc TEXT NOT NULL, expires_at REAL);
CREATE TABLE IF NOT EXISTS order_state (
    id TEXT PRIMARY KEY, etag TEXT NOT NULL, doc TEXT NOT NULL,
    process_state TEXT NOT NULL, locked_by TEXT, retry_at TEXT, complete_by TEXT, created_at TEXT NOT NULL,
    expires_at REAL);
CREATE INDEX IF NOT EXISTS ix_state_claimable ON order_state (process_state, retry_at, created_at);
CREATE INDEX IF NOT EXISTS ix_state_expired ON order_state (process_state, complete_by, id);
CREATE INDEX IF NOT EXISTS ix_state_updated ON order_state (process_state, json_extract(doc, '$.updatedAt'), id);
CREATE TABLE IF NOT EXISTS checkpoints (
    id TEXT PRIMARY KEY, etag TEXT NOT NULL, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS recovery_index (
    bucket TEXT NOT NULL, id TEXT NOT NULL, complete_by TEXT NOT NULL, order_id TEXT NOT NULL, locked_by TEXT,
    PRIMARY KEY (bucket, id));
CREATE INDEX IF NOT EXISTS ix_recovery_index ON recovery_index (bucket, complete_by, order_id);
CREATE INDEX IF NOT EXISTS ix_recovery_index_time ON recovery_index (complete_by, order_id);
CREATE TABLE IF NOT EXISTS documents (
    collection TEXT NOT NULL, id TEXT NOT NULL, etag TEXT NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (collection, id));
"""

# Per-item TTL, as Cosmos DB has it (https://learn.microsoft.com/azure/cosmos-db/nosql/time-to-live): a document whose
# `ttl` is N > 0 expires N seconds after its last write (`_ts`); from then on no read or query returns it, and it is
# deleted in the background. Here `expires_at` (epoch seconds, the file's clock `SqliteFile.now`) holds that moment;
# reads filter on `LIVE`; a write transaction first deletes up to EXPIRED_SWEEP expired rows, at most once every
# SWEEP_EVERY_S per connection (no cost on the write path in between). No ttl, or -1: never.
TTL_TABLES = ("orders", "order_state")
LIVE = "(expires_at IS NULL OR expires_at > store_now())"
EXPIRED_SWEEP = 100
SWEEP_EVERY_S = 1.0
_TTL_MIGRATION = [f"ALTER TABLE {t} ADD COLUMN expires_at REAL" for t in TTL_TABLES]
_TTL_INDEXES = "".join(
    f"CREATE INDEX IF NOT EXISTS ix_{t}_expires ON {t} (expires_at) WHERE expires_at IS NOT NULL;\n" for t in TTL_TABLES
)
# The indexed expression of ix_state_updated: a query uses that index only when it spells the expression the same way.
_UPDATED_AT = "json_extract(doc, '$.updatedAt')"


def _marks(states: tuple[ProcessState, ...]) -> str:
    return "(" + ", ".join("?" * len(states)) + ")"


def _values(states: tuple[ProcessState, ...]) -> tuple[str, ...]:
    return tuple(s.value for s in states)


_STATE_COLUMNS = "id, etag, doc, process_state, locked_by, retry_at, complete_by, created_at"


def new_etag() -> str:
    """A fresh opaque etag, quoted like Cosmos DB's."""
    return f'"{uuid.uuid4()}"'


# An If-Match write's target: (table, key columns, the etag the caller read). With a conflict injected, a rival
# writer rewrites that row first (a new etag) if it still carries that etag.
IfMatch = tuple[str, dict[str, str], str]


def _rival_write(conn: sqlite3.Connection, target: IfMatch) -> None:
    table, key, etag = target
    where = " AND ".join(f"{k} = :{k}" for k in key)
    conn.execute(
        f"UPDATE {table} SET etag = :_new WHERE {where} AND etag = :_etag", {**key, "_new": new_etag(), "_etag": etag}
    )


class SqliteFile:
    """One connection to the store file, used from worker threads one call at a time. `faults`: see StoreFaults."""

    def __init__(self, path: str | Path, faults: StoreFaults | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None, check_same_thread=False
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self.now: Callable[[], float] = time.time  # the store's clock (epoch seconds): TTL expiry; tests move it
        self._conn.create_function("store_now", 0, lambda: self.now())
        self._swept = float("-inf")  # when this connection last deleted expired rows (the store's clock)
        self._conn.executescript(_SCHEMA)
        _migrate_ttl(self._conn)
        self._closed = False
        self.faults = None if faults is None else FaultInjector(faults, self.path)
        self.access: StoreAccess | None = None  # the identity it acts as (None: the owner, every right)

    def authorize(self, table: str, action: str, collection: str | None = None) -> None:
        """Raise the 403 Cosmos DB answers when the store's identity may not perform `action` on `table`."""
        if self.access is not None:
            self.access.check(table, action, collection)

    async def read(self, fn: Callable[[sqlite3.Connection], T], op: str = "read") -> T:
        """`op` names the operation for the fault ledger."""
        if self.faults is None:
            return await self._call(fn, False)
        return await self.faults.call(op, lambda _conflict: self._call(fn, False))

    async def write(
        self, fn: Callable[[sqlite3.Connection], T], op: str = "write", if_match: IfMatch | None = None
    ) -> T:
        """Run `fn` in `BEGIN IMMEDIATE` (write lock taken up front: no lock-upgrade deadlock). `if_match`: the
        row an If-Match write expects unchanged (only read when a conflict is injected)."""
        if self.faults is None:
            return await self._call(fn, True)
        return await self.faults.call(
            op, lambda conflict: self._call(fn, True, if_match if conflict else None), if_match is not None
        )

    async def _call(self, fn: Callable[[sqlite3.Connection], T], write: bool, rival: IfMatch | None = None) -> T:
        """On the caller's event loop when nothing has to wait (the connection is free, and a write's lock is
        free: BEGIN IMMEDIATE under busy_timeout 0), else in a worker thread, which may wait: a busy lock never
        stalls the loop, and a call that does not wait saves a hand-off to a thread and back. It yields to the loop
        first, as a call to Cosmos DB always does: what runs meanwhile sees the call in flight (admission's group
        commit counts on it)."""
        await asyncio.sleep(0)
        if rival is None and self._lock.acquire(blocking=False):
            try:
                done, result = self._inline(fn, write)
            finally:
                self._lock.release()
            if done:
                return result  # type: ignore[return-value]
        return await asyncio.to_thread(self._locked, fn, write, rival)

    def _inline(self, fn: Callable[[sqlite3.Connection], T], write: bool) -> tuple[bool, T | None]:
        """(True, result), or (False, None) when the write lock is another connection's (nothing was done)."""
        if self._closed:
            raise RuntimeError(f"store {self.path} is closed")
        if not write:
            return True, fn(self._conn)
        self._conn.execute("PRAGMA busy_timeout = 0")
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:  # SQLITE_BUSY: another process writes; the thread waits for it
            return False, None
        finally:
            self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECONDS * 1000)}")
        return True, self._transaction(fn)

    def _locked(self, fn: Callable[[sqlite3.Connection], T], write: bool, rival: IfMatch | None = None) -> T:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"store {self.path} is closed")
            if not write:
                return fn(self._conn)
            if rival is not None:  # the concurrent writer's own transaction, committed before the caller's
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    _rival_write(self._conn, rival)
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
            self._conn.execute("BEGIN IMMEDIATE")
            return self._transaction(fn)

    def _transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """The rest of a write transaction begun with BEGIN IMMEDIATE: the expired-row sweep, `fn`, COMMIT."""
        try:
            if self.now() - self._swept >= SWEEP_EVERY_S:
                _sweep_expired(self._conn)
                self._swept = self.now()
            result = fn(self._conn)
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")
        return result

    async def aclose(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()
                if self.faults is not None:
                    self.faults.close()


def _migrate_ttl(conn: sqlite3.Connection) -> None:
    """Add `expires_at` to a file written before per-item TTL (another process may be doing the same)."""
    for table, alter in zip(TTL_TABLES, _TTL_MIGRATION, strict=True):
        if "expires_at" not in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
            try:
                conn.execute(alter)
            except sqlite3.OperationalError as exc:
                if "duplicate column" not in str(exc):
                    raise
    conn.executescript(_TTL_INDEXES)


def _sweep_expired(conn: sqlite3.Connection) -> None:
    """Cosmos DB's background deletion of expired items, a few per write transaction."""
    for table in TTL_TABLES:
        conn.execute(
            f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE expires_at <= store_now() LIMIT ?)",
            (EXPIRED_SWEEP,),
        )


def expires_at(doc: dict[str, Any], now: float) -> float | None:
    """When a document written at `now` expires: its `ttl` seconds later when positive, else never."""
    ttl = doc.get("ttl")
    return now + ttl if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl > 0 else None


def _dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def _insert_if_absent(conn: sqlite3.Connection, table: str, row: dict[str, Any]) -> bool:
    if table in TTL_TABLES:  # an expired item is gone: its id is free
        conn.execute(f"DELETE FROM {table} WHERE id = ? AND NOT {LIVE}", (row["id"],))
    names = ", ".join(row)
    marks = ", ".join(f":{k}" for k in row)
    cur = conn.execute(f"INSERT OR IGNORE INTO {table} ({names}) VALUES ({marks})", row)
    return cur.rowcount == 1


def _live(table: str) -> str:
    return f" AND {LIVE}" if table in TTL_TABLES else ""


def _select_doc(conn: sqlite3.Connection, table: str, key: str) -> tuple[dict[str, Any], str] | None:
    row = conn.execute(f"SELECT doc, etag FROM {table} WHERE id = ?{_live(table)}", (key,)).fetchone()
    return None if row is None else (json.loads(row[0]), row[1])


def _conditional_update(conn: sqlite3.Connection, table: str, key: str, etag: str, row: dict[str, Any]) -> None:
    """UPDATE ... WHERE id AND etag; NotFound or PreconditionFailed when it changes nothing."""
    sets = ", ".join(f"{k} = :{k}" for k in row)
    cur = conn.execute(
        f"UPDATE {table} SET {sets} WHERE id = :_id AND etag = :_etag{_live(table)}",
        {**row, "_id": key, "_etag": etag},
    )
    if cur.rowcount == 1:
        return
    if conn.execute(f"SELECT 1 FROM {table} WHERE id = ?{_live(table)}", (key,)).fetchone() is None:
        raise NotFound(f"{table} {key!r} does not exist")
    raise PreconditionFailed(f"{table} {key!r} changed since etag {etag}")


def _state_row(rec: OrderStateRecord, etag: str, now: float) -> dict[str, Any]:
    doc = rec.to_doc()
    return {
        "expires_at": expires_at(doc, now),
        "id": rec.id,
        "etag": etag,
        "doc": _dumps(doc),
        "process_state": doc["processState"],
        "locked_by": doc["lockedBy"],
        "retry_at": doc["retryAt"],
        "complete_by": doc["completeBy"],
        "created_at": doc["createdAt"],
    }


def _versioned(row: tuple[str, str]) -> Versioned:
    return OrderStateRecord.from_doc(json.loads(row[0])), row[1]
