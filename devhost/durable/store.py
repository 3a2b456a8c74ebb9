"""Durable persistence of the task hub in one SQLite file (WAL): instances, history, inbox, activity work,
timers.

Every state change is one transaction, so a `kill -9` at any point leaves either the old or the new state:
an episode appends history, consumes its inbox messages and persists the work it scheduled atomically; an
activity result lands in the inbox in the same transaction that removes its work item (at-least-once
delivery).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .history import Event

SCHEMA = """
CREATE TABLE IF NOT EXISTS instances(
  instance_id TEXT PRIMARY KEY, name TEXT NOT NULL, execution_id TEXT NOT NULL, status TEXT NOT NULL,
  input TEXT, output TEXT, custom_status TEXT, created_time TEXT NOT NULL, last_updated_time TEXT NOT NULL,
  parent_instance_id TEXT, parent_execution_id TEXT, parent_task_id INTEGER, state TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS instances_created ON instances(created_time, instance_id);
CREATE TABLE IF NOT EXISTS history(instance_id TEXT NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL,
  PRIMARY KEY(instance_id, seq));
CREATE TABLE IF NOT EXISTS inbox(id INTEGER PRIMARY KEY AUTOINCREMENT, instance_id TEXT NOT NULL,
  execution_id TEXT NOT NULL, event TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS inbox_instance ON inbox(instance_id, id);
CREATE TABLE IF NOT EXISTS work(id INTEGER PRIMARY KEY AUTOINCREMENT, instance_id TEXT NOT NULL,
  execution_id TEXT NOT NULL, task_id INTEGER NOT NULL, name TEXT NOT NULL, input TEXT);
CREATE TABLE IF NOT EXISTS timers(instance_id TEXT NOT NULL, execution_id TEXT NOT NULL, timer_id INTEGER NOT
NULL,
  fire_at TEXT NOT NULL, PRIMARY KEY(instance_id, execution_id, timer_id));
"""

INSTANCE_COLUMNS = (
    "instance_id",
    "name",
    "execution_id",
    "status",
    "input",
    "output",
    "custom_status",
    "created_time",
    "last_updated_time",
    "parent_instance_id",
    "parent_execution_id",
    "parent_task_id",
    "state",
)


@dataclass
class InstanceRow:
    """One orchestration instance; `input`/`output`/`custom_status` are JSON text; `state` is engine
    bookkeeping.
    """

    instance_id: str
    name: str
    execution_id: str
    status: str
    input: str | None
    output: str | None
    custom_status: str | None
    created_time: str
    last_updated_time: str
    parent_instance_id: str | None = None
    parent_execution_id: str | None = None
    parent_task_id: int | None = None
    state: dict[str, Any] = field(default_factory=dict)

    def values(self) -> tuple[Any, ...]:
        return tuple(json.dumps(self.state) if c == "state" else getattr(self, c) for c in INSTANCE_COLUMNS)


@dataclass(frozen=True)
class WorkItem:
    id: int
    instance_id: str
    execution_id: str
    task_id: int
    name: str
    input: str | None


@dataclass(frozen=True)
class TimerItem:
    instance_id: str
    execution_id: str
    timer_id: int
    fire_at: str


@dataclass(frozen=True)
class Message:
    """An event addressed to an instance's inbox (a child's completion for its parent, for instance)."""

    instance_id: str
    execution_id: str
    event: Event


@dataclass
class Commit:
    """Everything one episode (or a terminate) changes, applied in one transaction."""

    row: InstanceRow
    consumed: list[int] = field(default_factory=list)
    append: list[Event] = field(default_factory=list)
    reset_history: bool = False
    work: list[tuple[int, str, str | None]] = field(default_factory=list)
    timers: list[tuple[int, str]] = field(default_factory=list)
    children: list[tuple[InstanceRow, Event]] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    drop_pending: bool = False


class Store:
    """The SQLite task hub. Used from the event-loop thread only; each method is short and transactional."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # ---- reads ---------------------------------------------------------------------------------------------
    def instance(self, instance_id: str) -> InstanceRow | None:
        row = self._db.execute(
            f"SELECT {','.join(INSTANCE_COLUMNS)} FROM instances WHERE instance_id=?", (instance_id,)
        ).fetchone()
        return _row(row) if row else None

    def instances(self, where: str = "1=1", params: tuple[Any, ...] = ()) -> list[InstanceRow]:
        columns = ",".join(INSTANCE_COLUMNS)
        sql = f"SELECT {columns} FROM instances WHERE {where} ORDER BY created_time, instance_id"
        return [_row(r) for r in self._db.execute(sql, params).fetchall()]

    def history(self, instance_id: str) -> list[Event]:
        rows = self._db.execute("SELECT event FROM history WHERE instance_id=? ORDER BY seq", (instance_id,))
        return [json.loads(r[0]) for r in rows.fetchall()]

    def inbox(self, instance_id: str, execution_id: str) -> list[tuple[int, Event]]:
        """Pending messages of the current execution, oldest first; older executions' are dropped."""
        with self._tx() as db:
            db.execute(
                "DELETE FROM inbox WHERE instance_id=? AND execution_id<>?", (instance_id, execution_id)
            )
            rows = db.execute("SELECT id, event FROM inbox WHERE instance_id=? ORDER BY id", (instance_id,))
            return [(r[0], json.loads(r[1])) for r in rows.fetchall()]

    def instances_with_inbox(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT DISTINCT instance_id FROM inbox").fetchall()]

    def pending_work(self) -> list[WorkItem]:
        rows = self._db.execute(
            "SELECT id, instance_id, execution_id, task_id, name, input FROM work ORDER BY id"
        )
        return [WorkItem(*r) for r in rows.fetchall()]

    def pending_timers(self) -> list[TimerItem]:
        rows = self._db.execute("SELECT instance_id, execution_id, timer_id, fire_at FROM timers")
        return [TimerItem(*r) for r in rows.fetchall()]

    def work_exists(self, work_id: int) -> bool:
        return self._db.execute("SELECT 1 FROM work WHERE id=?", (work_id,)).fetchone() is not None

    # ---- writes --------------------------------------------------------------------------------------------
    def create(self, row: InstanceRow, first: Event) -> None:
        """(Re)create an instance with fresh history, its ExecutionStarted waiting in the inbox."""
        with self._tx() as db:
            _forget(db, row.instance_id)
            db.execute(
                f"INSERT INTO instances VALUES ({','.join('?' * len(INSTANCE_COLUMNS))})", row.values()
            )
            _send(db, Message(row.instance_id, row.execution_id, first))

    def send(self, message: Message) -> None:
        with self._tx() as db:
            _send(db, message)

    def complete_work(self, work_id: int, message: Message) -> bool:
        """Record an activity result: inbox message and work-item removal in one transaction."""
        with self._tx() as db:
            if db.execute("DELETE FROM work WHERE id=?", (work_id,)).rowcount == 0:
                return False
            _send(db, message)
            return True

    def fire_timer(self, timer: TimerItem, message: Message) -> bool:
        with self._tx() as db:
            deleted = db.execute(
                "DELETE FROM timers WHERE instance_id=? AND execution_id=? AND timer_id=?",
                (timer.instance_id, timer.execution_id, timer.timer_id),
            ).rowcount
            if deleted:
                _send(db, message)
            return bool(deleted)

    def commit(self, change: Commit) -> tuple[list[WorkItem], list[TimerItem]]:
        """Apply an episode; return the work items and timers it persisted, for the engine to run."""
        row = change.row
        with self._tx() as db:
            if change.consumed:
                db.executemany("DELETE FROM inbox WHERE id=?", [(i,) for i in change.consumed])
            if change.reset_history or change.drop_pending:
                db.execute("DELETE FROM work WHERE instance_id=?", (row.instance_id,))
                db.execute("DELETE FROM timers WHERE instance_id=?", (row.instance_id,))
            if change.reset_history:
                db.execute("DELETE FROM history WHERE instance_id=?", (row.instance_id,))
            _append(db, row.instance_id, change.append)
            db.execute(
                f"INSERT OR REPLACE INTO instances VALUES ({','.join('?' * len(INSTANCE_COLUMNS))})",
                row.values(),
            )
            work = [_insert_work(db, row, *w) for w in change.work]
            timers = [_insert_timer(db, row, *t) for t in change.timers]
            for child, first in change.children:
                _forget(db, child.instance_id)
                db.execute(
                    f"INSERT INTO instances VALUES ({','.join('?' * len(INSTANCE_COLUMNS))})", child.values()
                )
                _send(db, Message(child.instance_id, child.execution_id, first))
            for message in change.messages:
                _send(db, message)
        return work, timers

    def purge(self, instance_id: str) -> int:
        with self._tx() as db:
            return _forget(db, instance_id)


def _row(values: tuple[Any, ...]) -> InstanceRow:
    data = dict(zip(INSTANCE_COLUMNS, values, strict=True))
    data["state"] = json.loads(data["state"])
    return InstanceRow(**data)


def _forget(db: sqlite3.Connection, instance_id: str) -> int:
    for table in ("history", "inbox", "work", "timers"):
        db.execute(f"DELETE FROM {table} WHERE instance_id=?", (instance_id,))
    return db.execute("DELETE FROM instances WHERE instance_id=?", (instance_id,)).rowcount


def _send(db: sqlite3.Connection, message: Message) -> None:
    db.execute(
        "INSERT INTO inbox(instance_id, execution_id, event) VALUES (?,?,?)",
        (message.instance_id, message.execution_id, json.dumps(message.event)),
    )


def _append(db: sqlite3.Connection, instance_id: str, events: list[Event]) -> None:
    start = db.execute(
        "SELECT COALESCE(MAX(seq), -1) + 1 FROM history WHERE instance_id=?", (instance_id,)
    ).fetchone()[0]
    db.executemany(
        "INSERT INTO history VALUES (?,?,?)",
        [(instance_id, start + i, json.dumps(e)) for i, e in enumerate(events)],
    )


def _insert_work(
    db: sqlite3.Connection, row: InstanceRow, task_id: int, name: str, data: str | None
) -> WorkItem:
    cursor = db.execute(
        "INSERT INTO work(instance_id, execution_id, task_id, name, input) VALUES (?,?,?,?,?)",
        (row.instance_id, row.execution_id, task_id, name, data),
    )
    return WorkItem(int(cursor.lastrowid or 0), row.instance_id, row.execution_id, task_id, name, data)


def _insert_timer(db: sqlite3.Connection, row: InstanceRow, timer_id: int, fire_at: str) -> TimerItem:
    db.execute(
        "INSERT OR REPLACE INTO timers VALUES (?,?,?,?)",
        (row.instance_id, row.execution_id, timer_id, fire_at),
    )
    return TimerItem(row.instance_id, row.execution_id, timer_id, fire_at)
