"""Durable persistence of the task hub in one SQLite file (WAL): instances, history, journal, inbox, work, timers.

Every state change is one transaction, so a `kill -9` at any point leaves either the old or the new state: an
episode consumes its inbox messages, appends its history and journal entry, updates the instance row and persists
the work it scheduled atomically; an activity result lands in the inbox in the same transaction that removes its
work item (at-least-once delivery); a timer's firing likewise.

A write transaction (BEGIN IMMEDIATE) opens only when there is something to write, and checks what was read outside
it: an episode's commit requires the instance's execution, the inbox messages it consumed and the free history and
journal row numbers it read; otherwise nothing is written (`Conflict`). Rows are never rewritten whole.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from azure.durable_functions.models.history import HistoryEventType as T

from .history import Event
from .records import (
    INSTANCE_COLUMNS,
    Commit,
    Conflict,
    Fenced,
    InstanceRow,
    Leases,
    Member,
    Message,
    Pending,
    Rebalance,
    TimerItem,
    WorkItem,
)
from .store_timing import _SELECT_WORK, TimingTables, _orphans
from .store_writer import StoreStats, _Writer
from .timeline import FRESH_BASE, RETRIED_EVENTS, Bookkeeping, Timeline, TimelineCache

SCHEMA = """
CREATE TABLE IF NOT EXISTS instances(
  instance_id TEXT PRIMARY KEY, name TEXT NOT NULL, execution_id TEXT NOT NULL, status TEXT NOT NULL,
  input TEXT, output TEXT, custom_status TEXT, created_time TEXT NOT NULL, last_updated_time TEXT NOT NULL,
  parent_instance_id TEXT, parent_execution_id TEXT, parent_task_id INTEGER, state TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS instances_created ON instances(created_time, instance_id);
CREATE TABLE IF NOT EXISTS history(instance_id TEXT NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL,
  PRIMARY KEY(instance_id, seq));
CREATE TABLE IF NOT EXISTS journal(instance_id TEXT NOT NULL, seq INTEGER NOT NULL, entry TEXT NOT NULL,
  PRIMARY KEY(instance_id, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS inbox(id INTEGER PRIMARY KEY AUTOINCREMENT, instance_id TEXT NOT NULL,
  execution_id TEXT NOT NULL, event TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS inbox_instance ON inbox(instance_id, id);
CREATE TABLE IF NOT EXISTS work(id INTEGER PRIMARY KEY AUTOINCREMENT, instance_id TEXT NOT NULL,
  execution_id TEXT NOT NULL, task_id INTEGER NOT NULL, name TEXT NOT NULL, input TEXT);
CREATE TABLE IF NOT EXISTS timers(instance_id TEXT NOT NULL, execution_id TEXT NOT NULL, timer_id INTEGER NOT NULL,
  fire_at TEXT NOT NULL, PRIMARY KEY(instance_id, execution_id, timer_id));
CREATE TABLE IF NOT EXISTS hosts(owner TEXT PRIMARY KEY, pid INTEGER NOT NULL, started REAL NOT NULL,
  socket TEXT NOT NULL, gone INTEGER NOT NULL DEFAULT 0, episodes INTEGER NOT NULL DEFAULT 0,
  activities INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS partitions(partition INTEGER PRIMARY KEY, owner TEXT);
"""

# Who dequeued an inbox message and until when it is hidden from the others; when a work item a host took is visible
# again; when a partition's lease expires (epoch seconds). Written only with the azure-storage timing.
_TIMING_COLUMNS = (
    ("inbox", "hidden_by TEXT"),
    ("inbox", "hidden_until REAL"),
    ("work", "visible_at REAL"),
    ("partitions", "expires REAL"),
)
_SELECT_MEMBERS = "SELECT owner, pid, started, socket, episodes, activities FROM hosts"
_INSERT_INSTANCE = f"INSERT INTO instances({','.join(INSTANCE_COLUMNS)},state) VALUES ({','.join('?' * 13)})"
_EVENT_TYPE = re.compile(r'\{"EventType": (\d+),')


class Store(TimingTables):
    """The SQLite task hub. Used from the event-loop thread only; each method is short and transactional."""

    def __init__(self, path: Path, *, cache_size: int = 1024) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)
        if "owner" not in {r[1] for r in self._db.execute("PRAGMA table_info(work)")}:
            # A task hub written before scale-out (devhost/durable/hub.py): its work items have no owner, and an
            # item without one is adopted by the first host that looks.
            self._db.execute("ALTER TABLE work ADD COLUMN owner TEXT")
        for table, column in _TIMING_COLUMNS:  # the azure-storage timing's (devhost/durable/timing.py), NULL otherwise
            if column.split()[0] not in {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
        self.stats = StoreStats()
        self.timelines = TimelineCache(cache_size)

    def close(self) -> None:
        self.timelines.clear()
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[_Writer]:
        self._db.execute("BEGIN IMMEDIATE")
        self.stats.write_transactions += 1
        before = self._db.total_changes
        try:
            yield _Writer(self._db, self.stats)
        except BaseException:
            self._db.execute("ROLLBACK")
            self.stats.rollbacks += 1
            self.stats.idle_writes += 1
            raise
        changed = self._db.total_changes != before
        self._db.execute("COMMIT")
        self.stats.commits += 1
        self.stats.idle_writes += not changed

    @contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: several SELECTs see one state of the file (no write lock)."""
        self._db.execute("BEGIN")
        try:
            yield self._db
        finally:
            self._db.execute("COMMIT")

    # ---- reads ---------------------------------------------------------------------------------------------
    def instance(self, instance_id: str) -> InstanceRow | None:
        row = self._db.execute(
            f"SELECT {','.join(INSTANCE_COLUMNS)} FROM instances WHERE instance_id=?", (instance_id,)
        ).fetchone()
        return InstanceRow(*row) if row else None

    def instances(self, where: str = "1=1", params: tuple[Any, ...] = ()) -> list[InstanceRow]:
        columns = ",".join(INSTANCE_COLUMNS)
        sql = f"SELECT {columns} FROM instances WHERE {where} ORDER BY created_time, instance_id"
        return [InstanceRow(*r) for r in self._db.execute(sql, params).fetchall()]

    def history(self, instance_id: str) -> list[Event]:
        rows = self._db.execute("SELECT event FROM history WHERE instance_id=? ORDER BY seq", (instance_id,))
        return [json.loads(r[0]) for r in rows.fetchall()]

    def pending(self, instance_id: str, execution_id: str, viewer: str | None = None, now: float = 0.0) -> Pending:
        """The instance's inbox, read without a write transaction (see `Pending`). With a `viewer`, less what another
        host dequeued and still hides at `now` (`hide`)."""
        rows = [
            (i, execution, text)
            for i, execution, text, by, until in self._db.execute(
                "SELECT id, execution_id, event, hidden_by, hidden_until FROM inbox WHERE instance_id=? ORDER BY id",
                (instance_id,),
            ).fetchall()
            if viewer is None or by is None or by == viewer or until <= now
        ]
        messages = [(i, json.loads(text)) for i, execution, text in rows if execution == execution_id]
        texts = {i: text for i, execution, text in rows if execution == execution_id}
        return Pending(messages, texts, [i for i, execution, _ in rows if execution != execution_id])

    def inbox(self, instance_id: str, execution_id: str) -> list[tuple[int, Event]]:
        """Pending messages of the current execution, oldest first."""
        return self.pending(instance_id, execution_id).messages

    def instances_with_inbox(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT DISTINCT instance_id FROM inbox").fetchall()]

    def pending_work(self) -> list[WorkItem]:
        return [WorkItem(*r) for r in self._db.execute(f"{_SELECT_WORK} ORDER BY id").fetchall()]

    # ---- the hub's members (devhost/durable/hub.py) ---------------------------------------------------------
    def members(self) -> list[Member]:
        """The hosts that joined the task hub and have not left (alive or not: the caller checks)."""
        return [Member(*r) for r in self._db.execute(f"{_SELECT_MEMBERS} WHERE gone=0 ORDER BY owner").fetchall()]

    def all_members(self) -> list[Member]:
        """Every host that ever joined, with what it ran (for reports)."""
        return [Member(*r) for r in self._db.execute(f"{_SELECT_MEMBERS} ORDER BY rowid").fetchall()]

    def left(self, owner: str) -> bool:
        """Whether `owner` is marked gone (it left, or another member judged it dead)."""
        found = self._db.execute("SELECT gone FROM hosts WHERE owner=?", (owner,)).fetchone()
        return bool(found and found[0])

    def partition_owners(self) -> dict[int, str | None]:
        return dict(self._db.execute("SELECT partition, owner FROM partitions ORDER BY partition").fetchall())

    def owner_socket(self, partition: int) -> str | None:
        """The socket of the live member that holds `partition`, if one does."""
        found = self._db.execute(
            "SELECT h.socket FROM partitions p JOIN hosts h ON h.owner = p.owner WHERE p.partition=? AND h.gone=0",
            (partition,),
        ).fetchone()
        return found[0] if found else None

    def ensure_partitions(self, count: int) -> int:
        """Create the hub's partitions if it has none; returns how many it has (the first host's count wins, as a
        task hub's partitionCount is fixed when the hub is created)."""
        existing = self._db.execute("SELECT COUNT(*) FROM partitions").fetchone()[0]
        if existing:
            return int(existing)
        with self._tx() as db:
            db.executemany(
                "INSERT OR IGNORE INTO partitions(partition, owner) VALUES (?, NULL)", [(p,) for p in range(count)]
            )
        return int(self._db.execute("SELECT COUNT(*) FROM partitions").fetchone()[0])

    def join(self, member: Member) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO hosts(owner, pid, started, socket) VALUES (?,?,?,?)",
                (member.owner, member.pid, member.started, member.socket),
            )

    def leave(self, owner: str, episodes: int, activities: int) -> None:
        """An orderly stop: the member's partitions are free at once, its work items go to whoever adopts them."""
        with self._tx() as db:
            db.execute("UPDATE partitions SET owner=NULL WHERE owner=?", (owner,))
            db.execute("UPDATE hosts SET gone=1, episodes=?, activities=? WHERE owner=?", (episodes, activities, owner))
            # What it dequeued and did not finish is visible again at once, as a graceful drain would leave it.
            db.execute("UPDATE inbox SET hidden_by=NULL, hidden_until=NULL WHERE hidden_by=?", (owner,))
            db.execute("UPDATE work SET visible_at=NULL WHERE owner=?", (owner,))

    def rebalance(
        self,
        owner: str,
        plan: Callable[[list[Member], dict[int, str | None]], Rebalance],
        counts: tuple[int, int] | None,
        leases: Leases | None = None,
    ) -> tuple[Rebalance, list[WorkItem]]:
        """Apply `plan` (computed on the members and partitions read inside the transaction) in one transaction:
        members found dead leave and free their partitions, free partitions are taken, extra ones released, and
        the work items of members no longer alive (or of none) are adopted by `owner`. No write when the plan
        changes nothing and `counts` (episodes, activities to record for `owner`) is None.

        With `leases` (the azure-storage timing) the plan sees a partition as free only when no host holds it or its
        lease expired (`Leases`), a dead member's partitions stay held until then, a periodic look renews `owner`'s
        leases, and only work items visible at `leases.now` are adopted."""
        now = None if leases is None else leases.now
        first = plan(self.members(), self._held(owner, leases))
        orphans, live = _orphans(first.live, now)
        if (
            first.is_empty()
            and counts is None
            and not (leases is not None and leases.periodic)
            and not self._db.execute(f"SELECT 1 FROM work WHERE {orphans} LIMIT 1", live).fetchone()
        ):
            return first, []
        with self._tx() as db:  # the reads below run on the same connection, inside the write transaction
            change = plan(self.members(), self._held(owner, leases))
            for dead in change.dead:
                db.execute("UPDATE hosts SET gone=1 WHERE owner=?", (dead,))
                if leases is None:
                    db.execute("UPDATE partitions SET owner=NULL WHERE owner=?", (dead,))
            if leases is not None and leases.periodic:  # TablePartitionManager.RenewLease
                db.execute(
                    "UPDATE partitions SET expires=? WHERE owner=? AND expires > ?",
                    (leases.now + leases.renew_s, owner, leases.now),
                )
            held = self.partition_owners()
            claimed = None if leases is None else leases.now + leases.claim_s
            change.acquired = [
                p
                for p in change.acquire
                if db.execute(
                    "UPDATE partitions SET owner=?, expires=? WHERE partition=? AND owner IS ?",
                    (owner, claimed, p, held[p]),
                ).rowcount
            ]
            for p in change.release:
                db.execute("UPDATE partitions SET owner=NULL WHERE partition=? AND owner=?", (p, owner))
            orphans, live = _orphans(change.live, now)
            adopted = [WorkItem(*r) for r in db.execute(f"{_SELECT_WORK} WHERE {orphans} ORDER BY id", live).fetchall()]
            db.executemany("UPDATE work SET owner=?, visible_at=NULL WHERE id=?", [(owner, w.id) for w in adopted])
            if counts is not None:
                db.execute("UPDATE hosts SET episodes=?, activities=? WHERE owner=?", (*counts, owner))
        return change, adopted

    def _held(self, owner: str, leases: Leases | None) -> dict[int, str | None]:
        """The partitions' holders as a rebalancing plan sees them: with `leases`, an expired lease (or none) is
        free, another host's only at a periodic look (TablePartitionManager.TryClaimLease: `isExpired`)."""
        if leases is None:
            return self.partition_owners()
        rows = self._db.execute("SELECT partition, owner, expires FROM partitions ORDER BY partition").fetchall()
        return {
            p: None
            if o is None or ((leases.periodic or o == owner) and (expires is None or expires <= leases.now))
            else o
            for p, o, expires in rows
        }

    def pending_timers(self) -> list[TimerItem]:
        rows = self._db.execute("SELECT instance_id, execution_id, timer_id, fire_at FROM timers")
        return [TimerItem(*r) for r in rows.fetchall()]

    def work_exists(self, work_id: int) -> bool:
        return self._db.execute("SELECT 1 FROM work WHERE id=?", (work_id,)).fetchone() is not None

    def timer_exists(self, timer: TimerItem) -> bool:
        return (
            self._db.execute(
                "SELECT 1 FROM timers WHERE instance_id=? AND execution_id=? AND timer_id=?",
                (timer.instance_id, timer.execution_id, timer.timer_id),
            ).fetchone()
            is not None
        )

    def timeline(self, instance_id: str, execution_id: str) -> Timeline:
        """The execution's timeline: from memory, else rebuilt from the history, the base and the journal."""
        cached = self.timelines.get(instance_id, execution_id)
        if cached is not None:
            return cached
        with self._snapshot() as db:
            found = db.execute(
                "SELECT execution_id, state FROM instances WHERE instance_id=?", (instance_id,)
            ).fetchone()
            history = db.execute(
                "SELECT seq, event FROM history WHERE instance_id=? ORDER BY seq", (instance_id,)
            ).fetchall()
            journal = db.execute(
                "SELECT seq, entry FROM journal WHERE instance_id=? ORDER BY seq", (instance_id,)
            ).fetchall()
        if found is None or found[0] != execution_id:
            raise Conflict(f"instance {instance_id} has no execution {execution_id}")
        book = Bookkeeping.from_json(json.loads(found[1]))
        for _, entry in journal:
            book.fold(json.loads(entry))
        texts = [text for _, text in history]
        retried = [json.loads(t) for t in texts if _event_type(t) in RETRIED_EVENTS]
        timeline = Timeline(execution_id, next_journal=journal[-1][0] + 1 if journal else 0)
        timeline.advance(texts, retried, _started_in(texts), book, journaled=False)
        timeline.next_seq = history[-1][0] + 1 if history else 0
        self.timelines.put(instance_id, timeline)
        return timeline

    # ---- writes --------------------------------------------------------------------------------------------
    def create(self, row: InstanceRow, first: Event, refuse: Callable[[str], None] | None = None) -> None:
        """(Re)create an instance with fresh history, its ExecutionStarted waiting in the inbox. `refuse` is called,
        inside the transaction, with the status of an instance already there, and may raise to write nothing: the
        check and the write are one step even when several hosts share the hub."""
        try:
            with self._tx() as db:
                found = db.execute("SELECT status FROM instances WHERE instance_id=?", (row.instance_id,)).fetchone()
                if found is not None and refuse is not None:
                    refuse(found[0])
                _forget(db, row.instance_id)
                db.execute(_INSERT_INSTANCE, (*row.values(), FRESH_BASE))
                _send(db, Message(row.instance_id, row.execution_id, first))
        finally:
            self.timelines.drop(row.instance_id)
        self.timelines.put(row.instance_id, Timeline(row.execution_id))

    def send(self, message: Message) -> None:
        with self._tx() as db:
            _send(db, message)

    def send_to_current(self, instance_id: str, check: Callable[[InstanceRow | None], None], event: Event) -> None:
        """Send `event` to the instance's current execution, read inside the write transaction, so that an episode
        starting a new execution (ContinueAsNew) on another host cannot slip between the read and the write.
        `check` sees the row and may raise to write nothing."""
        with self._tx() as db:
            found = db.execute(
                f"SELECT {','.join(INSTANCE_COLUMNS)} FROM instances WHERE instance_id=?", (instance_id,)
            ).fetchone()
            row = InstanceRow(*found) if found else None
            check(row)
            assert row is not None
            _send(db, Message(instance_id, row.execution_id, event))

    def drop_messages(self, ids: list[int]) -> int:
        """Remove inbox messages no episode will take (late ones of a finished instance, older executions')."""
        with self._tx() as db:
            return db.executemany("DELETE FROM inbox WHERE id=?", [(i,) for i in ids]).rowcount

    def complete_work(self, work_id: int, message: Message) -> bool:
        """Record an activity result: inbox message and work-item removal in one transaction. False, without a
        write, when the work item is gone (its execution ended or started over while the activity ran)."""
        if not self.work_exists(work_id):
            return False
        try:
            with self._tx() as db:
                if db.execute("DELETE FROM work WHERE id=?", (work_id,)).rowcount == 0:
                    raise Conflict(f"work item {work_id} is gone")  # removed by another writer since the read
                _send(db, message)
        except Conflict:
            self.stats.conflicts += 1
            return False
        return True

    def fire_timer(self, timer: TimerItem, message: Message) -> bool:
        """Record a timer's firing: inbox message and timer removal in one transaction (no write if it is gone)."""
        if not self.timer_exists(timer):
            return False
        try:
            with self._tx() as db:
                deleted = db.execute(
                    "DELETE FROM timers WHERE instance_id=? AND execution_id=? AND timer_id=?",
                    (timer.instance_id, timer.execution_id, timer.timer_id),
                ).rowcount
                if not deleted:
                    raise Conflict(f"timer {timer} is gone")
                _send(db, message)
        except Conflict:
            self.stats.conflicts += 1
            return False
        return True

    def commit(self, change: Commit) -> tuple[list[WorkItem], list[TimerItem]]:
        """Apply an episode; return the work items and timers it persisted, for the engine to run.

        Raises Conflict, having written nothing, when the instance moved on since the episode read it."""
        row, timeline = change.row, change.timeline
        texts = change.encoded + [json.dumps(e) for e in change.append[len(change.encoded) :]]
        entry = None
        if change.book is not None and timeline is not None and not change.reset_history:
            delta = change.book.delta(timeline.book)
            entry = json.dumps(delta) if delta is not None else None
        try:
            with self._tx() as db:
                work, timers = self._apply(db, change, texts, entry)
        except Fenced:
            self.timelines.drop(row.instance_id)
            self.stats.conflicts += 1
            raise
        except (Conflict, sqlite3.IntegrityError) as exc:
            self.timelines.drop(row.instance_id)
            self.stats.conflicts += 1
            raise Conflict(f"instance {row.instance_id} changed since the episode read it: {exc}") from exc
        except BaseException:
            self.timelines.drop(row.instance_id)
            raise
        self._after(change, texts, entry is not None)
        return work, timers

    def _apply(
        self, db: _Writer, change: Commit, texts: list[str], entry: str | None
    ) -> tuple[list[WorkItem], list[TimerItem]]:
        row, base, timeline = change.row, change.base, change.timeline
        instance_id = row.instance_id
        if change.fence is not None:
            partition, owner = change.fence
            held = db.execute("SELECT owner FROM partitions WHERE partition=?", (partition,)).fetchone()
            if held is None or held[0] != owner:
                raise Fenced(f"its partition {partition} is no longer held by this host")
        if change.consumed:
            deleted = db.executemany("DELETE FROM inbox WHERE id=?", [(i,) for i in change.consumed]).rowcount
            if deleted != len(change.consumed):
                raise Conflict("its inbox messages were consumed")
        columns = [c for c in INSTANCE_COLUMNS if getattr(row, c) != getattr(base, c)]
        values = [getattr(row, c) for c in columns]
        if change.reset_history:
            columns.append("state")
            values.append(FRESH_BASE)
        if columns:
            found = db.execute(
                f"UPDATE instances SET {','.join(c + '=?' for c in columns)} WHERE instance_id=? AND execution_id=?",
                (*values, instance_id, base.execution_id),
                written=len(values),
            ).rowcount
        else:
            found = len(
                db.execute(
                    "SELECT 1 FROM instances WHERE instance_id=? AND execution_id=?", (instance_id, base.execution_id)
                ).fetchall()
            )
        if found != 1:
            raise Conflict(f"it is no longer execution {base.execution_id}")
        if change.reset_history or change.drop_pending:
            db.execute("DELETE FROM work WHERE instance_id=?", (instance_id,))
            db.execute("DELETE FROM timers WHERE instance_id=?", (instance_id,))
        if change.reset_history:
            db.execute("DELETE FROM history WHERE instance_id=?", (instance_id,))
            db.execute("DELETE FROM journal WHERE instance_id=?", (instance_id,))
        if texts:
            start = (
                timeline.next_seq
                if timeline is not None and not change.reset_history
                else _next(db, "history", instance_id)
            )
            db.executemany(
                "INSERT INTO history VALUES (?,?,?)", [(instance_id, start + i, t) for i, t in enumerate(texts)]
            )
        if entry is not None:
            assert timeline is not None
            db.execute("INSERT INTO journal VALUES (?,?,?)", (instance_id, timeline.next_journal, entry))
        work = [_insert_work(db, row, change.fence[1] if change.fence else None, *w) for w in change.work]
        timers = [_insert_timer(db, row, *t) for t in change.timers]
        for child, first in change.children:
            _forget(db, child.instance_id)
            db.execute(_INSERT_INSTANCE, (*child.values(), FRESH_BASE))
            _send(db, Message(child.instance_id, child.execution_id, first))
        for message in change.messages:
            _send(db, message)
        return work, timers

    def _after(self, change: Commit, texts: list[str], journaled: bool) -> None:
        """Bring the cached timelines up to what was committed."""
        row, timeline = change.row, change.timeline
        if change.ends:
            self.timelines.drop(row.instance_id)
        elif change.reset_history:
            self.timelines.put(row.instance_id, Timeline(row.execution_id))
        elif timeline is not None and change.book is not None:
            started = _started_in(texts) if timeline.started is None else None
            timeline.advance(texts, change.append, started, change.book, journaled)
            self.timelines.put(row.instance_id, timeline)
        else:
            self.timelines.drop(row.instance_id)
        for child, _ in change.children:
            self.timelines.put(child.instance_id, Timeline(child.execution_id))

    def purge(self, instance_id: str) -> int:
        try:
            with self._tx() as db:
                return _forget(db, instance_id)
        finally:
            self.timelines.drop(instance_id)


def _started_in(texts: list[str]) -> Event | None:
    """The ExecutionStarted among recorded event texts, decoding only up to it (it is the first or second)."""
    for text in texts:
        event: Event = json.loads(text)
        if event["EventType"] == T.EXECUTION_STARTED:
            return event
    return None


def _event_type(text: str) -> int | None:
    """The EventType of a recorded event's text without decoding it (h.event() writes it first)."""
    found = _EVENT_TYPE.match(text)
    return int(found[1]) if found else json.loads(text).get("EventType")


def _next(db: _Writer, table: str, instance_id: str) -> int:
    found = db.execute(f"SELECT COALESCE(MAX(seq), -1) + 1 FROM {table} WHERE instance_id=?", (instance_id,))
    return int(found.fetchone()[0])


def _forget(db: _Writer, instance_id: str) -> int:
    for table in ("history", "journal", "inbox", "work", "timers"):
        db.execute(f"DELETE FROM {table} WHERE instance_id=?", (instance_id,))
    return db.execute("DELETE FROM instances WHERE instance_id=?", (instance_id,)).rowcount


def _send(db: _Writer, message: Message) -> None:
    db.execute(
        "INSERT INTO inbox(instance_id, execution_id, event) VALUES (?,?,?)",
        (message.instance_id, message.execution_id, json.dumps(message.event)),
    )


def _insert_work(
    db: _Writer, row: InstanceRow, owner: str | None, task_id: int, name: str, data: str | None
) -> WorkItem:
    """A work item, owned by the host that scheduled it (it runs it; see hub.py for who adopts it otherwise)."""
    cursor = db.execute(
        "INSERT INTO work(instance_id, execution_id, task_id, name, input, owner) VALUES (?,?,?,?,?,?)",
        (row.instance_id, row.execution_id, task_id, name, data, owner),
    )
    return WorkItem(int(cursor.lastrowid or 0), row.instance_id, row.execution_id, task_id, name, data)


def _insert_timer(db: _Writer, row: InstanceRow, timer_id: int, fire_at: str) -> TimerItem:
    db.execute(
        "INSERT OR REPLACE INTO timers VALUES (?,?,?,?)",
        (row.instance_id, row.execution_id, timer_id, fire_at),
    )
    return TimerItem(row.instance_id, row.execution_id, timer_id, fire_at)
