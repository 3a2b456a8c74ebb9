"""Embedded store adapter: the orders DB and the state store in one SQLite file, with Cosmos-like etags.

WAL journal and `BEGIN IMMEDIATE` write transactions make it safe across processes (the Starter, the
Supervisor, the Agent and the CLI may each open the same file). Every write stores a new random etag;
`replace` is an If-Match write (PreconditionFailed on mismatch); a create on an existing id is a conflict.
The columns the queries filter on are copied out of the JSON document and indexed; updatedAt is indexed as an
expression on the document (`_UPDATED_AT`), which needs no column migration of an existing file. `query_expired` and
`query_in_state` page by keyset (`ports.KeysetCursor`). There are no request units: charges are 0.

Fault injection (the store drills, lab/store_drills.py): options on the endpoint, `embedded://PATH?conflictRate=
0.1&throttleRate=0.1&seed=1&outageFile=PATH.down` (`StoreFaults`), make the file answer as a Cosmos DB account under
contention, throttling or an outage would, and the adapter retry as azure-cosmos does (`FaultInjector`). Without
options nothing changes and nothing is checked (one `is None` per operation).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sqlite3
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from orderflow.records import (
    CLAIMABLE_STATES,
    SUPERVISED_STATES,
    TERMINAL_STATES,
    OrderRecord,
    OrderStateRecord,
    ProcessState,
    format_utc,
    parse_utc,
)
from orderflow.store.errors import Conflict, NotFound, PreconditionFailed, TransientStoreError
from orderflow.store.ports import (
    ExpiredCursor,
    IndexEntry,
    KeysetCursor,
    Page,
    UpdateWithRetry,
    Versioned,
    bucket_of,
    next_cursor,
)

T = TypeVar("T")
BUSY_TIMEOUT_SECONDS = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    id TEXT PRIMARY KEY, etag TEXT NOT NULL, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS order_state (
    id TEXT PRIMARY KEY, etag TEXT NOT NULL, doc TEXT NOT NULL,
    process_state TEXT NOT NULL, locked_by TEXT, retry_at TEXT, complete_by TEXT, created_at TEXT NOT NULL);
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


# --- fault injection ---------------------------------------------------------------------------------------------

# What azure-cosmos (4.17.1, the constraints.txt pin) does with the answers the faults stand for, copied so that the
# embedded adapter hands its callers what the Cosmos adapter would:
# - 429 (throttled): `_resource_throttle_retry_policy.ResourceThrottleRetryPolicy` with the default
#   `_retry_options.RetryOptions`: up to 9 retries, each after the x-ms-retry-after-ms the service answered, while the
#   waits add up to less than 30 s; then the 429 reaches the caller (`aio/_retry_utility_async.ExecuteAsync`).
# - 503 (unavailable): `_service_unavailable_retry_policy._ServiceUnavailableRetryPolicy`, reads and writes alike: as
#   many retries as the account has regions (a single-region account: 1 retry), 500 ms apart; then the 503 reaches the
#   caller.
THROTTLE_MAX_RETRIES = 9
THROTTLE_MAX_WAIT_S = 30.0
UNAVAILABLE_MAX_RETRIES = 1
UNAVAILABLE_RETRY_AFTER_S = 0.5
# The outage switch (a file's existence) is looked at no more often than this per open store file.
OUTAGE_CHECK_EVERY_S = 0.1
THROTTLED, UNAVAILABLE, CONFLICT = 429, 503, 412
_RATE_OPTIONS = {"conflictRate": "conflict_rate", "throttleRate": "throttle_rate"}


@dataclass(frozen=True)
class StoreFaults:
    """The faults of one embedded store, from its endpoint's query string (`parse`):

    - `conflictRate`: the share of If-Match writes (state record replace, checkpoint and document puts) that meet a
      concurrent writer: another writer rewrites the item first (a new etag, the same content), so the write fails
      with 412 (PreconditionFailed) and changes nothing, exactly as when two instances race;
    - `throttleRate`: the share of requests, reads and writes, answered 429 before anything is done, with
      `throttleRetryAfterMs` (default 10) as x-ms-retry-after-ms;
    - `outageFile`: while this file exists, every request is answered 503 (ServiceUnavailable), nothing done;
    - `seed`: of the draws; `ledger`: a JSON-lines file that gets one line per injected answer (default
      `<PATH>.faults.jsonl`), for the drills' figures.
    """

    conflict_rate: float = 0.0
    throttle_rate: float = 0.0
    throttle_retry_after_ms: int = 10
    seed: int = 0
    outage_file: Path | None = None
    ledger: Path | None = None

    @classmethod
    def parse(cls, query: str, store: Path) -> StoreFaults | None:
        """The faults a query string asks for (None for an empty one); ValueError on an unknown option or a bad
        value, so that a misspelt option cannot quietly turn a drill's faults off."""
        if not query:
            return None
        values: dict[str, Any] = {}
        for name, value in parse_qsl(query, keep_blank_values=True, strict_parsing=True):
            if name in _RATE_OPTIONS:
                rate = float(value)
                if not 0.0 <= rate <= 1.0:
                    raise ValueError(f"embedded store option {name} must be within [0, 1], got {value!r}")
                values[_RATE_OPTIONS[name]] = rate
            elif name == "throttleRetryAfterMs":
                values["throttle_retry_after_ms"] = max(0, int(value))
            elif name == "seed":
                values["seed"] = int(value)
            elif name in ("outageFile", "ledger"):
                if not value:
                    raise ValueError(f"embedded store option {name} needs a path")
                values["outage_file" if name == "outageFile" else "ledger"] = Path(value)
            else:
                raise ValueError(f"unknown embedded store option {name!r} (known: conflictRate, throttleRate, "
                                 "throttleRetryAfterMs, seed, outageFile, ledger)")
        values.setdefault("ledger", store.with_name(store.name + ".faults.jsonl"))
        return cls(**values)


def split_endpoint_path(path: str | Path) -> tuple[Path, StoreFaults | None]:
    """The file and the faults of what follows `embedded://`: `PATH` or `PATH?option=value&...`."""
    if isinstance(path, Path):
        return path, None
    file, _, query = path.partition("?")
    return Path(file), StoreFaults.parse(query, Path(file))


_injectors_opened: dict[str, int] = {}


class FaultInjector:
    """Answers each request as the faulty service would (`StoreFaults`) and retries as azure-cosmos would: one per
    open store file. `sleep` and `monotonic` are injectable (tests never wait)."""

    def __init__(self, faults: StoreFaults, store: Path, *,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.faults = faults
        # A seeded stream per file this process opens (the n-th opening of the same path gets the same stream).
        key = str(store.resolve())
        opened = _injectors_opened[key] = _injectors_opened.get(key, 0) + 1
        self._rng = random.Random(f"{faults.seed}:{opened}")
        self._sleep = sleep
        self._monotonic = monotonic
        self._down = False
        self._down_checked: float | None = None
        self._ledger_fd: int | None = None

    def down(self) -> bool:
        """Whether the outage file exists, looked at no more than every OUTAGE_CHECK_EVERY_S."""
        if self.faults.outage_file is None:
            return False
        now = self._monotonic()
        if self._down_checked is None or now - self._down_checked >= OUTAGE_CHECK_EVERY_S:
            self._down = self.faults.outage_file.exists()
            self._down_checked = now
        return self._down

    def _draw(self, rate: float) -> bool:
        return rate > 0.0 and self._rng.random() < rate

    def record(self, op: str, status: int, retried: bool) -> None:
        """One ledger line: the operation, the status injected, and whether the client retried it (False: the caller
        got it). O_APPEND, one write per line: lines of several processes do not interleave."""
        if self.faults.ledger is None:
            return
        if self._ledger_fd is None:
            self.faults.ledger.parent.mkdir(parents=True, exist_ok=True)
            self._ledger_fd = os.open(self.faults.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        line = json.dumps({"at": round(time.time(), 3), "pid": os.getpid(), "op": op, "status": status,
                           "retried": retried}, separators=(",", ":"))
        os.write(self._ledger_fd, (line + "\n").encode())

    async def call(self, op: str, run: Callable[[bool], Awaitable[T]], if_match: bool = False) -> T:
        """Run one operation. Before anything is done the service may answer 503 (outage) or 429 (throttled); those
        are retried by the client's policies and reach the caller as TransientStoreError once they give up. An
        If-Match write may then meet a concurrent writer: `run(True)` lets it write first, so the caller's write
        fails with 412 as it would in a real race."""
        throttle_retries, throttle_waited, unavailable_retries = 0, 0.0, 0
        while True:
            if self.down():
                retry = unavailable_retries < UNAVAILABLE_MAX_RETRIES
                self.record(op, UNAVAILABLE, retry)
                if not retry:
                    raise TransientStoreError(f"ServiceUnavailable: {op}: the store is down (injected)", UNAVAILABLE)
                unavailable_retries += 1
                await self._sleep(UNAVAILABLE_RETRY_AFTER_S)
                continue
            if self._draw(self.faults.throttle_rate):
                wait = self.faults.throttle_retry_after_ms / 1000.0
                # ResourceThrottleRetryPolicy.ShouldRetry: under the retry count, and the waits so far under the cap.
                retry = throttle_retries < THROTTLE_MAX_RETRIES and throttle_waited < THROTTLE_MAX_WAIT_S
                self.record(op, THROTTLED, retry)
                if not retry:
                    raise TransientStoreError(f"TooManyRequests: {op}: request rate is large (injected)", THROTTLED)
                throttle_retries += 1
                throttle_waited += wait
                await self._sleep(wait)
                continue
            conflict = if_match and self._draw(self.faults.conflict_rate)
            if conflict:
                self.record(op, CONFLICT, False)
            return await run(conflict)

    def close(self) -> None:
        if self._ledger_fd is not None:
            os.close(self._ledger_fd)
            self._ledger_fd = None


# An If-Match write's target: (table, key columns, the etag the caller read). With a conflict injected, a rival
# writer rewrites that row first (a new etag) if it still carries that etag.
IfMatch = tuple[str, dict[str, str], str]


def _rival_write(conn: sqlite3.Connection, target: IfMatch) -> None:
    table, key, etag = target
    where = " AND ".join(f"{k} = :{k}" for k in key)
    conn.execute(f"UPDATE {table} SET etag = :_new WHERE {where} AND etag = :_etag",
                 {**key, "_new": new_etag(), "_etag": etag})


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
        self._conn.executescript(_SCHEMA)
        self._closed = False
        self.faults = None if faults is None else FaultInjector(faults, self.path)

    async def read(self, fn: Callable[[sqlite3.Connection], T], op: str = "read") -> T:
        """`op` names the operation for the fault ledger."""
        if self.faults is None:
            return await asyncio.to_thread(self._locked, fn, False)
        return await self.faults.call(op, lambda _conflict: asyncio.to_thread(self._locked, fn, False))

    async def write(self, fn: Callable[[sqlite3.Connection], T], op: str = "write",
                    if_match: IfMatch | None = None) -> T:
        """Run `fn` in `BEGIN IMMEDIATE` (write lock taken up front: no lock-upgrade deadlock). `if_match`: the
        row an If-Match write expects unchanged (only read when a conflict is injected)."""
        if self.faults is None:
            return await asyncio.to_thread(self._locked, fn, True)
        return await self.faults.call(
            op, lambda conflict: asyncio.to_thread(self._locked, fn, True, if_match if conflict else None),
            if_match is not None)

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
            try:
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


def _dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def _insert_if_absent(conn: sqlite3.Connection, table: str, row: dict[str, Any]) -> bool:
    names = ", ".join(row)
    marks = ", ".join(f":{k}" for k in row)
    cur = conn.execute(f"INSERT OR IGNORE INTO {table} ({names}) VALUES ({marks})", row)
    return cur.rowcount == 1


def _select_doc(conn: sqlite3.Connection, table: str, key: str) -> tuple[dict[str, Any], str] | None:
    row = conn.execute(f"SELECT doc, etag FROM {table} WHERE id = ?", (key,)).fetchone()
    return None if row is None else (json.loads(row[0]), row[1])


def _conditional_update(
    conn: sqlite3.Connection, table: str, key: str, etag: str, row: dict[str, Any]
) -> None:
    """UPDATE ... WHERE id AND etag; NotFound or PreconditionFailed when it changes nothing."""
    sets = ", ".join(f"{k} = :{k}" for k in row)
    cur = conn.execute(
        f"UPDATE {table} SET {sets} WHERE id = :_id AND etag = :_etag", {**row, "_id": key, "_etag": etag}
    )
    if cur.rowcount == 1:
        return
    if conn.execute(f"SELECT 1 FROM {table} WHERE id = ?", (key,)).fetchone() is None:
        raise NotFound(f"{table} {key!r} does not exist")
    raise PreconditionFailed(f"{table} {key!r} changed since etag {etag}")


def _state_row(rec: OrderStateRecord, etag: str) -> dict[str, Any]:
    doc = rec.to_doc()
    return {
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


class SqliteOrdersDb:
    """The orders DB (immutable orders) in the embedded store."""

    def __init__(self, db: SqliteFile) -> None:
        self._db = db

    async def create_if_absent(self, record: OrderRecord) -> tuple[OrderRecord, bool]:
        row = {"id": record.id, "etag": new_etag(), "doc": _dumps(record.to_doc())}

        def run(conn: sqlite3.Connection) -> tuple[OrderRecord, bool]:
            if _insert_if_absent(conn, "orders", row):
                return record, True
            stored = _select_doc(conn, "orders", record.id)
            assert stored is not None  # inserted-or-present inside one write transaction
            return OrderRecord.from_doc(stored[0]), False

        return await self._db.write(run, "orders.create")

    async def get(self, order_id: str) -> OrderRecord | None:
        found = await self._db.read(lambda conn: _select_doc(conn, "orders", order_id), "orders.get")
        return None if found is None else OrderRecord.from_doc(found[0])

    async def aclose(self) -> None:
        await self._db.aclose()


class SqliteStateStore(UpdateWithRetry):
    """The state store (order state records and Supervisor checkpoints) in the embedded store."""

    def __init__(self, db: SqliteFile) -> None:
        self._db = db

    async def create_if_absent(self, rec: OrderStateRecord) -> tuple[OrderStateRecord, bool]:
        row = _state_row(rec, new_etag())

        def run(conn: sqlite3.Connection) -> tuple[OrderStateRecord, bool]:
            if _insert_if_absent(conn, "order_state", row):
                return rec, True
            stored = _select_doc(conn, "order_state", rec.id)
            assert stored is not None
            return OrderStateRecord.from_doc(stored[0]), False

        return await self._db.write(run, "state.create")

    async def get(self, order_id: str) -> Versioned | None:
        found = await self._db.read(lambda conn: _select_doc(conn, "order_state", order_id), "state.get")
        return None if found is None else (OrderStateRecord.from_doc(found[0]), found[1])

    async def replace(self, rec: OrderStateRecord, etag: str) -> str:
        row = _state_row(rec, new_etag())
        row.pop("id")
        await self._db.write(lambda conn: _conditional_update(conn, "order_state", rec.id, etag, row),
                             "state.replace", ("order_state", {"id": rec.id}, etag))
        return str(row["etag"])

    async def query_claimable(self, now: datetime, limit: int,
                              states: tuple[ProcessState, ...] = CLAIMABLE_STATES) -> list[Versioned]:
        sql = (
            f"SELECT doc, etag FROM order_state WHERE process_state IN {_marks(states)} AND locked_by IS NULL"
            " AND (retry_at IS NULL OR retry_at <= ?) ORDER BY retry_at, created_at, id LIMIT ?"
        )
        args = (*_values(states), format_utc(now), limit)
        rows = await self._db.read(lambda conn: conn.execute(sql, args).fetchall(), "state.query_claimable")
        return [_versioned(r) for r in rows]

    async def query_unnotified(self, updated_before: datetime, limit: int) -> list[Versioned]:
        sql = (
            f"SELECT doc, etag FROM order_state WHERE process_state IN {_marks(TERMINAL_STATES)}"
            f" AND json_extract(doc, '$.notifiedAt') IS NULL AND {_UPDATED_AT} < ?"
            f" ORDER BY {_UPDATED_AT}, id LIMIT ?"
        )
        args = (*_values(TERMINAL_STATES), format_utc(updated_before), limit)
        rows = await self._db.read(lambda conn: conn.execute(sql, args).fetchall(), "state.query_unnotified")
        return [_versioned(r) for r in rows]

    async def query_expired(
        self, window_start: datetime, window_end: datetime, page_size: int, continuation: str | None = None
    ) -> Page:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        after = ExpiredCursor.start(window_start, continuation)
        sql = (
            f"SELECT doc, etag FROM order_state WHERE process_state IN {_marks(SUPERVISED_STATES)}"
            " AND (complete_by, id) > (?, ?) AND complete_by >= ? AND complete_by < ?"
            " ORDER BY complete_by, id LIMIT ?"
        )
        args = (
            *_values(SUPERVISED_STATES),
            after.complete_by,
            after.id,
            format_utc(window_start),
            format_utc(window_end),
            page_size + 1,
        )
        rows = await self._db.read(lambda conn: conn.execute(sql, args).fetchall(), "state.query_expired")
        items = [_versioned(r) for r in rows[:page_size]]
        return Page(items=items, continuation=next_cursor(items, len(rows) > page_size), request_charge=0.0)

    async def count_in_state(self, state: ProcessState) -> int:
        sql = "SELECT COUNT(*) FROM order_state WHERE process_state = ?"
        row = await self._db.read(lambda conn: conn.execute(sql, (state.value,)).fetchone(), "state.count_in_state")
        return int(row[0])

    async def query_in_state(self, state: ProcessState, page_size: int, continuation: str | None = None,
                             updated_before: datetime | None = None) -> Page:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        where: list[str] = ["process_state = ?"]
        args: list[object] = [state.value]
        if continuation is not None:
            after = KeysetCursor.decode(continuation)
            # The plain `>=` lets SQLite seek ix_state_updated; it does not seek on the row value alone.
            where += [f"{_UPDATED_AT} >= ?", f"({_UPDATED_AT}, id) > (?, ?)"]
            args += [after.at, after.at, after.id]
        if updated_before is not None:
            where.append(f"{_UPDATED_AT} < ?")
            args.append(format_utc(updated_before))
        sql = f"SELECT doc, etag FROM order_state WHERE {' AND '.join(where)} ORDER BY {_UPDATED_AT}, id LIMIT ?"
        args.append(page_size + 1)
        rows = await self._db.read(lambda conn: conn.execute(sql, args).fetchall(), "state.query_in_state")
        items = [_versioned(r) for r in rows[:page_size]]
        more = len(rows) > page_size
        return Page(items=items, continuation=next_cursor(items, more, lambda r: r.updated_at), request_charge=0.0)

    async def oldest_in_state(self, state: ProcessState) -> OrderStateRecord | None:
        page = await self.query_in_state(state, 1)
        return page.items[0][0] if page.items else None

    async def count_expired(self, now: datetime) -> int:
        sql = f"SELECT COUNT(*) FROM order_state WHERE process_state IN {_marks(SUPERVISED_STATES)} AND complete_by < ?"
        args = (*_values(SUPERVISED_STATES), format_utc(now))
        row = await self._db.read(lambda conn: conn.execute(sql, args).fetchone(), "state.count_expired")
        return int(row[0])

    async def get_checkpoint(self, name: str) -> tuple[dict[str, Any], str] | None:
        return await _get_data(self._db, "checkpoints", name)

    async def put_checkpoint(self, name: str, data: dict[str, Any], etag: str | None) -> str:
        return await _put_data(self._db, "checkpoints", name, data, etag)

    async def aclose(self) -> None:
        await self._db.aclose()


async def _get_data(db: SqliteFile, table: str, name: str, **key: str) -> tuple[dict[str, Any], str] | None:
    where = " AND ".join(f"{k} = :{k}" for k in {"id": name, **key})
    sql = f"SELECT doc, etag FROM {table} WHERE {where}"
    row = await db.read(lambda conn: conn.execute(sql, {"id": name, **key}).fetchone(), f"{table}.get")
    return None if row is None else (json.loads(row[0])["data"], row[1])


async def _put_data(db: SqliteFile, table: str, name: str, data: dict[str, Any], etag: str | None,
                    **key: str) -> str:
    """Create-if-absent (etag None; Conflict) or If-Match replace (PreconditionFailed/NotFound) of {id, data}."""
    new = new_etag()
    doc = _dumps({"id": name, "data": data})
    ids = {"id": name, **key}
    where = " AND ".join(f"{k} = :{k}" for k in ids)

    def run(conn: sqlite3.Connection) -> None:
        if etag is None:
            if not _insert_if_absent(conn, table, {**ids, "etag": new, "doc": doc}):
                raise Conflict(f"{table} {name!r} already exists")
            return
        cur = conn.execute(f"UPDATE {table} SET etag = :_new, doc = :_doc WHERE {where} AND etag = :_etag",
                           {**ids, "_new": new, "_doc": doc, "_etag": etag})
        if cur.rowcount == 1:
            return
        if conn.execute(f"SELECT 1 FROM {table} WHERE {where}", ids).fetchone() is None:
            raise NotFound(f"{table} {name!r} does not exist")
        raise PreconditionFailed(f"{table} {name!r} changed since etag {etag}")

    await db.write(run, f"{table}.put", None if etag is None else (table, ids, etag))
    return new


class SqliteDocuments:
    """`DocumentStore` over the embedded file: one named collection of the `documents` table."""

    def __init__(self, db: SqliteFile, collection: str) -> None:
        self._db = db
        self._collection = collection

    async def get(self, name: str) -> tuple[dict[str, Any], str] | None:
        return await _get_data(self._db, "documents", name, collection=self._collection)

    async def put(self, name: str, data: dict[str, Any], etag: str | None) -> str:
        return await _put_data(self._db, "documents", name, data, etag, collection=self._collection)

    async def aclose(self) -> None:
        await self._db.aclose()


class SqliteRecoveryIndex:
    """`RecoveryIndex` over the embedded file: table `recovery_index`, one (bucket, id) row per entry."""

    def __init__(self, db: SqliteFile, bucket_seconds: int) -> None:
        self._db = db
        self.bucket_seconds = bucket_seconds

    async def add(self, entry: IndexEntry) -> None:
        bucket = format_utc(bucket_of(entry.complete_by, self.bucket_seconds))
        row = (bucket, entry.id, format_utc(entry.complete_by), entry.order_id, entry.locked_by)
        sql = ("INSERT OR REPLACE INTO recovery_index (bucket, id, complete_by, order_id, locked_by)"
               " VALUES (?, ?, ?, ?, ?)")
        await self._db.write(lambda conn: conn.execute(sql, row), "recovery_index.add")

    async def page(self, bucket: datetime, window_start: datetime, window_end: datetime, after: ExpiredCursor,
                   limit: int) -> tuple[list[IndexEntry], float]:
        sql = ("SELECT order_id, complete_by, locked_by FROM recovery_index WHERE bucket = ?"
               " AND complete_by >= ? AND complete_by < ? AND (complete_by, order_id) > (?, ?)"
               " ORDER BY complete_by, order_id LIMIT ?")
        args = (format_utc(bucket), format_utc(window_start), format_utc(window_end), after.complete_by, after.id,
                limit)
        rows = await self._db.read(lambda conn: conn.execute(sql, args).fetchall(), "recovery_index.page")
        return [IndexEntry(r[0], parse_utc(r[1]), r[2]) for r in rows], 0.0

    async def first_at_or_after(self, start: datetime, end: datetime) -> tuple[datetime | None, float]:
        sql = "SELECT MIN(complete_by) FROM recovery_index WHERE complete_by >= ? AND complete_by < ?"
        row = await self._db.read(lambda conn: conn.execute(sql, (format_utc(start), format_utc(end))).fetchone(),
                                  "recovery_index.first")
        return (None if row is None or row[0] is None else parse_utc(row[0])), 0.0

    async def remove(self, entry: IndexEntry) -> None:
        bucket = format_utc(bucket_of(entry.complete_by, self.bucket_seconds))
        await self._db.write(lambda conn: conn.execute(
            "DELETE FROM recovery_index WHERE bucket = ? AND id = ?", (bucket, entry.id)), "recovery_index.remove")

    async def aclose(self) -> None:
        await self._db.aclose()


def open_sqlite_file(path: str | Path) -> SqliteFile:
    """The file of `path` as it follows `embedded://` (a str may carry fault options: StoreFaults)."""
    return SqliteFile(*split_endpoint_path(path))


def open_sqlite_recovery_index(path: str | Path, bucket_seconds: int) -> SqliteRecoveryIndex:
    return SqliteRecoveryIndex(open_sqlite_file(path), bucket_seconds)


def open_sqlite_documents(path: str | Path, collection: str) -> SqliteDocuments:
    return SqliteDocuments(open_sqlite_file(path), collection)


def open_sqlite_stores(path: str | Path) -> tuple[SqliteOrdersDb, SqliteStateStore]:
    """Both ports on one embedded file (one connection shared by the pair)."""
    db = open_sqlite_file(path)
    return SqliteOrdersDb(db), SqliteStateStore(db)
