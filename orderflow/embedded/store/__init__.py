"""Embedded store adapter: the orders DB and the state store in one SQLite file, with Cosmos-like etags.

WAL journal and `BEGIN IMMEDIATE` write transactions make it safe across processes. Every write stores a new random
etag; `replace` is an If-Match write (PreconditionFailed on mismatch); a create on an existing id is a conflict.
`query_expired` and `query_in_state` page by keyset (`ports.KeysetCursor`). There are no request units: charges
are 0. Endpoint options (`embedded://PATH?conflictRate=...&throttleRate=...&seed=...&outageFile=...`, `StoreFaults`)
inject Cosmos-like contention, throttling or an outage for the store drills (lab/store_drills.py); without them
nothing changes. Indexes and fault injection in detail: docs/modules-product.md."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

from orderflow.apps import SCOPE, KeyFilter
from orderflow.errors import Conflict, NotFound, PreconditionFailed
from orderflow.ports import (
    ExpiredCursor,
    IndexEntry,
    KeysetCursor,
    Page,
    UpdateWithRetry,
    Versioned,
    bucket_of,
    next_cursor,
)
from orderflow.records import (
    CLAIMABLE_STATES,
    SUPERVISED_STATES,
    TERMINAL_STATES,
    TTL_NEVER,
    OrderRecord,
    OrderStateRecord,
    ProcessState,
    format_utc,
    parse_utc,
)

from ._access import CREATE, DELETE, QUERY, READ, REPLACE, UPSERT, StoreAccess, split_identity
from ._faults import FaultInjector, StoreFaults, split_endpoint_path
from ._file import (
    _UPDATED_AT,
    BUSY_TIMEOUT_SECONDS,
    LIVE,
    SqliteFile,
    _conditional_update,
    _dumps,
    _insert_if_absent,
    _marks,
    _select_doc,
    _state_row,
    _values,
    _versioned,
    expires_at,
    new_etag,
)

__all__ = [
    "BUSY_TIMEOUT_SECONDS",
    "FaultInjector",
    "SqliteDocuments",
    "SqliteFile",
    "SqliteOrdersDb",
    "SqliteRecoveryIndex",
    "SqliteStateStore",
    "StoreFaults",
    "new_etag",
    "open_sqlite_documents",
    "open_sqlite_file",
    "open_sqlite_recovery_index",
    "open_sqlite_stores",
    "split_endpoint_path",
]


def _of_app(keys: KeyFilter | None) -> tuple[str, tuple[object, ...]]:
    """` AND <one app's ids>` and its arguments, as the Cosmos adapter's STARTSWITH / NOT CONTAINS: a byte-exact
    prefix (not LIKE, which is case-insensitive in SQLite) or no scope separator at all; nothing for None."""
    if keys is None:
        return "", ()
    prefix = keys.prefix()
    if prefix is None:
        return " AND instr(id, ?) = 0", (SCOPE,)
    return " AND substr(id, 1, ?) = ?", (len(prefix), prefix)


class SqliteOrdersDb:
    """The orders DB (immutable orders) in the embedded store."""

    def __init__(self, db: SqliteFile) -> None:
        self._db = db

    async def create_if_absent(self, record: OrderRecord) -> tuple[OrderRecord, bool]:
        self._db.authorize("orders", CREATE)
        doc = record.to_doc()
        row = {"id": record.id, "etag": new_etag(), "doc": _dumps(doc), "expires_at": expires_at(doc, self._db.now())}

        def run(conn: sqlite3.Connection) -> tuple[OrderRecord, bool]:
            if _insert_if_absent(conn, "orders", row):
                return record, True
            stored = _select_doc(conn, "orders", record.id)
            assert stored is not None  # inserted-or-present inside one write transaction
            return OrderRecord.from_doc(stored[0]), False

        result = await self._db.write(run, "orders.create")
        if not result[1]:
            self._db.authorize("orders", READ)  # the adapter reads the existing order after the 409
        return result

    async def get(self, order_id: str) -> OrderRecord | None:
        self._db.authorize("orders", READ)
        found = await self._db.read(lambda conn: _select_doc(conn, "orders", order_id), "orders.get")
        return None if found is None else OrderRecord.from_doc(found[0])

    async def set_ttl(self, order_id: str, ttl: int) -> None:
        self._db.authorize("orders", READ)
        self._db.authorize("orders", REPLACE)
        now = self._db.now()

        def run(conn: sqlite3.Connection) -> None:
            found = _select_doc(conn, "orders", order_id)
            if found is None:
                raise NotFound(f"order {order_id!r} does not exist")
            if found[0].get("ttl") == TTL_NEVER:
                return  # kept: stays kept
            doc = {**found[0], "ttl": ttl}
            row = {"etag": new_etag(), "doc": _dumps(doc), "expires_at": expires_at(doc, now)}
            _conditional_update(conn, "orders", order_id, found[1], row)

        await self._db.write(run, "orders.set_ttl")

    async def aclose(self) -> None:
        await self._db.aclose()


class SqliteStateStore(UpdateWithRetry):
    """The state store (order state records and Supervisor checkpoints) in the embedded store."""

    def __init__(self, db: SqliteFile) -> None:
        self._db = db

    async def create_if_absent(self, rec: OrderStateRecord) -> tuple[OrderStateRecord, bool]:
        self._db.authorize("order_state", CREATE)
        row = _state_row(rec, new_etag(), self._db.now())

        def run(conn: sqlite3.Connection) -> tuple[OrderStateRecord, bool]:
            if _insert_if_absent(conn, "order_state", row):
                return rec, True
            stored = _select_doc(conn, "order_state", rec.id)
            assert stored is not None
            return OrderStateRecord.from_doc(stored[0]), False

        result = await self._db.write(run, "state.create")
        if not result[1]:
            self._db.authorize("order_state", READ)
        return result

    async def get(self, order_id: str) -> Versioned | None:
        self._db.authorize("order_state", READ)
        found = await self._db.read(lambda conn: _select_doc(conn, "order_state", order_id), "state.get")
        return None if found is None else (OrderStateRecord.from_doc(found[0]), found[1])

    async def replace(self, rec: OrderStateRecord, etag: str) -> str:
        self._db.authorize("order_state", REPLACE)
        row = _state_row(rec, new_etag(), self._db.now())
        row.pop("id")
        await self._db.write(
            lambda conn: _conditional_update(conn, "order_state", rec.id, etag, row),
            "state.replace",
            ("order_state", {"id": rec.id}, etag),
        )
        return str(row["etag"])

    async def query_claimable(
        self,
        now: datetime,
        limit: int,
        states: tuple[ProcessState, ...] = CLAIMABLE_STATES,
        *,
        keys: KeyFilter | None = None,
    ) -> list[Versioned]:
        of_app, app_args = _of_app(keys)
        sql = (
            f"SELECT doc, etag FROM order_state WHERE process_state IN {_marks(states)} AND locked_by IS NULL"
            f" AND (retry_at IS NULL OR retry_at <= ?){of_app} AND {LIVE} ORDER BY retry_at, created_at, id LIMIT ?"
        )
        args = (*_values(states), format_utc(now), *app_args, limit)
        self._db.authorize("order_state", QUERY)
        rows = await self._db.read(lambda conn: conn.execute(sql, args).fetchall(), "state.query_claimable")
        return [_versioned(r) for r in rows]

    async def query_unnotified(self, updated_before: datetime, limit: int) -> list[Versioned]:
        sql = (
            f"SELECT doc, etag FROM order_state WHERE process_state IN {_marks(TERMINAL_STATES)}"
            f" AND json_extract(doc, '$.notifiedAt') IS NULL AND {_UPDATED_AT} < ? AND {LIVE}"
            f" ORDER BY {_UPDATED_AT}, id LIMIT ?"
        )
        args = (*_values(TERMINAL_STATES), format_utc(updated_before), limit)
        self._db.authorize("order_state", QUERY)
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
            f" AND (complete_by, id) > (?, ?) AND complete_by >= ? AND complete_by < ? AND {LIVE}"
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
        self._db.authorize("order_state", QUERY)
        rows = await self._db.read(lambda conn: conn.execute(sql, args).fetchall(), "state.query_expired")
        items = [_versioned(r) for r in rows[:page_size]]
        return Page(items=items, continuation=next_cursor(items, len(rows) > page_size), request_charge=0.0)

    async def count_in_state(self, state: ProcessState, *, keys: KeyFilter | None = None) -> int:
        of_app, app_args = _of_app(keys)
        sql = f"SELECT COUNT(*) FROM order_state WHERE process_state = ?{of_app} AND {LIVE}"
        args = (state.value, *app_args)
        self._db.authorize("order_state", QUERY)
        row = await self._db.read(lambda conn: conn.execute(sql, args).fetchone(), "state.count_in_state")
        return int(row[0])

    async def query_in_state(
        self,
        state: ProcessState,
        page_size: int,
        continuation: str | None = None,
        updated_before: datetime | None = None,
        *,
        keys: KeyFilter | None = None,
    ) -> Page:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        of_app, app_args = _of_app(keys)
        where: list[str] = ["process_state = ?", LIVE]
        args: list[object] = [state.value]
        if continuation is not None:
            after = KeysetCursor.decode(continuation)
            # The plain `>=` lets SQLite seek ix_state_updated; it does not seek on the row value alone.
            where += [f"{_UPDATED_AT} >= ?", f"({_UPDATED_AT}, id) > (?, ?)"]
            args += [after.at, after.at, after.id]
        if updated_before is not None:
            where.append(f"{_UPDATED_AT} < ?")
            args.append(format_utc(updated_before))
        sql = (
            f"SELECT doc, etag FROM order_state WHERE {' AND '.join(where)}{of_app} ORDER BY {_UPDATED_AT}, id LIMIT ?"
        )
        args += [*app_args, page_size + 1]
        self._db.authorize("order_state", QUERY)
        rows = await self._db.read(lambda conn: conn.execute(sql, args).fetchall(), "state.query_in_state")
        items = [_versioned(r) for r in rows[:page_size]]
        more = len(rows) > page_size
        return Page(items=items, continuation=next_cursor(items, more, lambda r: r.updated_at), request_charge=0.0)

    async def oldest_in_state(self, state: ProcessState, *, keys: KeyFilter | None = None) -> OrderStateRecord | None:
        page = await self.query_in_state(state, 1, keys=keys)
        return page.items[0][0] if page.items else None

    async def count_expired(self, now: datetime) -> int:
        sql = (
            f"SELECT COUNT(*) FROM order_state WHERE process_state IN {_marks(SUPERVISED_STATES)} AND complete_by < ?"
            f" AND {LIVE}"
        )
        args = (*_values(SUPERVISED_STATES), format_utc(now))
        self._db.authorize("order_state", QUERY)
        row = await self._db.read(lambda conn: conn.execute(sql, args).fetchone(), "state.count_expired")
        return int(row[0])

    async def get_checkpoint(self, name: str) -> tuple[dict[str, Any], str] | None:
        return await _get_data(self._db, "checkpoints", name)

    async def put_checkpoint(self, name: str, data: dict[str, Any], etag: str | None) -> str:
        return await _put_data(self._db, "checkpoints", name, data, etag)

    async def aclose(self) -> None:
        await self._db.aclose()


async def _get_data(db: SqliteFile, table: str, name: str, **key: str) -> tuple[dict[str, Any], str] | None:
    db.authorize(table, READ, key.get("collection"))
    where = " AND ".join(f"{k} = :{k}" for k in {"id": name, **key})
    sql = f"SELECT doc, etag FROM {table} WHERE {where}"
    row = await db.read(lambda conn: conn.execute(sql, {"id": name, **key}).fetchone(), f"{table}.get")
    return None if row is None else (json.loads(row[0])["data"], row[1])


async def _put_data(db: SqliteFile, table: str, name: str, data: dict[str, Any], etag: str | None, **key: str) -> str:
    """Create-if-absent (etag None; Conflict) or If-Match replace (PreconditionFailed/NotFound) of {id, data}."""
    db.authorize(table, CREATE if etag is None else REPLACE, key.get("collection"))
    new = new_etag()
    doc = _dumps({"id": name, "data": data})
    ids = {"id": name, **key}
    where = " AND ".join(f"{k} = :{k}" for k in ids)

    def run(conn: sqlite3.Connection) -> None:
        if etag is None:
            if not _insert_if_absent(conn, table, {**ids, "etag": new, "doc": doc}):
                raise Conflict(f"{table} {name!r} already exists")
            return
        cur = conn.execute(
            f"UPDATE {table} SET etag = :_new, doc = :_doc WHERE {where} AND etag = :_etag",
            {**ids, "_new": new, "_doc": doc, "_etag": etag},
        )
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
        self._db.authorize("recovery_index", UPSERT)
        bucket = format_utc(bucket_of(entry.complete_by, self.bucket_seconds))
        row = (bucket, entry.id, format_utc(entry.complete_by), entry.order_id, entry.locked_by)
        sql = (
            "INSERT OR REPLACE INTO recovery_index (bucket, id, complete_by, order_id, locked_by)"
            " VALUES (?, ?, ?, ?, ?)"
        )
        await self._db.write(lambda conn: conn.execute(sql, row), "recovery_index.add")

    async def page(
        self, bucket: datetime, window_start: datetime, window_end: datetime, after: ExpiredCursor, limit: int
    ) -> tuple[list[IndexEntry], float]:
        sql = (
            "SELECT order_id, complete_by, locked_by FROM recovery_index WHERE bucket = ?"
            " AND complete_by >= ? AND complete_by < ? AND (complete_by, order_id) > (?, ?)"
            " ORDER BY complete_by, order_id LIMIT ?"
        )
        args = (
            format_utc(bucket),
            format_utc(window_start),
            format_utc(window_end),
            after.complete_by,
            after.id,
            limit,
        )
        self._db.authorize("recovery_index", QUERY)
        rows = await self._db.read(lambda conn: conn.execute(sql, args).fetchall(), "recovery_index.page")
        return [IndexEntry(r[0], parse_utc(r[1]), r[2]) for r in rows], 0.0

    async def first_at_or_after(self, start: datetime, end: datetime) -> tuple[datetime | None, float]:
        sql = "SELECT MIN(complete_by) FROM recovery_index WHERE complete_by >= ? AND complete_by < ?"
        self._db.authorize("recovery_index", QUERY)
        row = await self._db.read(
            lambda conn: conn.execute(sql, (format_utc(start), format_utc(end))).fetchone(), "recovery_index.first"
        )
        return (None if row is None or row[0] is None else parse_utc(row[0])), 0.0

    async def remove(self, entry: IndexEntry) -> None:
        self._db.authorize("recovery_index", DELETE)
        bucket = format_utc(bucket_of(entry.complete_by, self.bucket_seconds))
        await self._db.write(
            lambda conn: conn.execute("DELETE FROM recovery_index WHERE bucket = ? AND id = ?", (bucket, entry.id)),
            "recovery_index.remove",
        )

    async def aclose(self) -> None:
        await self._db.aclose()


def open_sqlite_file(path: str | Path, env: Any = None) -> SqliteFile:
    """The file of `path` as it follows `embedded://` (a str may carry fault options, StoreFaults, and the
    identity it acts as, `identity=`: StoreAccess, with the container names of `env`, default the environment)."""
    identity = None
    if isinstance(path, str):
        path, identity = split_identity(path)
    db = SqliteFile(*split_endpoint_path(path))
    if identity is not None:
        db.access = StoreAccess(identity, env)
    return db


def open_sqlite_recovery_index(path: str | Path, bucket_seconds: int, env: Any = None) -> SqliteRecoveryIndex:
    return SqliteRecoveryIndex(open_sqlite_file(path, env), bucket_seconds)


def open_sqlite_documents(path: str | Path, collection: str, env: Any = None) -> SqliteDocuments:
    return SqliteDocuments(open_sqlite_file(path, env), collection)


def open_sqlite_stores(path: str | Path, env: Any = None) -> tuple[SqliteOrdersDb, SqliteStateStore]:
    """Both ports on one embedded file (one connection shared by the pair); `env`: the app settings that name the
    containers (for the identity's rights; default the environment)."""
    db = open_sqlite_file(path, env)
    return SqliteOrdersDb(db), SqliteStateStore(db)
