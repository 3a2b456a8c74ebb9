"""What the Durable store writes, counted: `StoreStats` (for tests and benchmarks) and `_Writer`, the connection
inside a write transaction (devhost/durable/store.py)."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

_WRITTEN_TABLE = re.compile(r"\s*(?:INSERT(?: OR REPLACE)? INTO|UPDATE)\s+(\w+)", re.IGNORECASE)


@dataclass
class StoreStats:
    """What the store wrote, for tests and benchmarks. A write transaction is a BEGIN IMMEDIATE; `idle_writes`
    counts those that changed no row; `bytes_written` is the text bound to INSERT and UPDATE statements (JSON is
    ASCII), per table in `bytes_by_table`."""

    write_transactions: int = 0
    commits: int = 0
    rollbacks: int = 0
    idle_writes: int = 0
    conflicts: int = 0
    bytes_written: int = 0
    bytes_by_table: dict[str, int] = field(default_factory=dict)

    def snapshot(self) -> StoreStats:
        return StoreStats(
            self.write_transactions,
            self.commits,
            self.rollbacks,
            self.idle_writes,
            self.conflicts,
            self.bytes_written,
            dict(self.bytes_by_table),
        )


class _Writer:
    """The connection inside a write transaction; counts the text it writes."""

    def __init__(self, db: sqlite3.Connection, stats: StoreStats) -> None:
        self._db = db
        self._stats = stats

    def execute(self, sql: str, params: Sequence[Any] = (), *, written: int | None = None) -> sqlite3.Cursor:
        """`written`: how many leading parameters are values written (an UPDATE's SET; the rest select rows)."""
        self._count(sql, (params[:written],))
        return self._db.execute(sql, params)

    def executemany(self, sql: str, rows: list[Sequence[Any]]) -> sqlite3.Cursor:
        self._count(sql, rows)
        return self._db.executemany(sql, rows)

    def _count(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        table = _WRITTEN_TABLE.match(sql)
        if table is None:
            return
        size = sum(len(p) for r in rows for p in r if isinstance(p, str))
        self._stats.bytes_written += size
        self._stats.bytes_by_table[table[1]] = self._stats.bytes_by_table.get(table[1], 0) + size
