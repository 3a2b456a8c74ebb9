"""The Durable store's tables as the azure-storage timing uses them (devhost/durable/timing.py): inbox messages a host
dequeued and hides from the others, work items it started, and the work items of dead hosts once visible again.
Store (devhost/durable/store.py) inherits them; with the local timing none of this is written."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any

from .records import WorkItem

_SELECT_WORK = "SELECT id, instance_id, execution_id, task_id, name, input FROM work"


class TimingTables:
    """The methods; `_db` and `_tx` are Store's."""

    _db: sqlite3.Connection

    def _tx(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def visible_inbox(self, now: float) -> dict[str, int]:
        """The instances with an inbox message no host hides at `now` (what a poll of the control queues finds), each
        with the id of its newest such message."""
        visible = "hidden_until IS NULL OR hidden_until <= ?"
        rows = self._db.execute(f"SELECT instance_id, MAX(id) FROM inbox WHERE {visible} GROUP BY instance_id", (now,))
        return dict(rows.fetchall())

    def hide(self, ids: list[int], owner: str, until: float) -> None:
        """`owner` dequeued these inbox messages: the other hosts see them again at `until` (a visibility timeout)."""
        with self._tx() as db:
            db.executemany("UPDATE inbox SET hidden_by=?, hidden_until=? WHERE id=?", [(owner, until, i) for i in ids])

    def unhide(self, ids: list[int]) -> None:
        with self._tx() as db:
            db.executemany("UPDATE inbox SET hidden_by=NULL, hidden_until=NULL WHERE id=?", [(i,) for i in ids])

    def take_work(self, work_id: int, visible_at: float) -> None:
        """The owner started the work item: were it to die, another host could take it at `visible_at`."""
        with self._tx() as db:
            db.execute("UPDATE work SET visible_at=? WHERE id=?", (visible_at, work_id))

    def adopt_work(self, owner: str, live: Iterable[str], now: float) -> list[WorkItem]:
        """Take the work items of hosts not `live` that are visible at `now` (one transaction; none: no write)."""
        where, params = _orphans(live, now)
        if not self._db.execute(f"SELECT 1 FROM work WHERE {where} LIMIT 1", params).fetchone():
            return []
        with self._tx() as db:
            adopted = [WorkItem(*r) for r in db.execute(f"{_SELECT_WORK} WHERE {where} ORDER BY id", params).fetchall()]
            db.executemany("UPDATE work SET owner=?, visible_at=NULL WHERE id=?", [(owner, w.id) for w in adopted])
        return adopted


def _orphans(live: Iterable[str], now: float | None = None) -> tuple[str, list[Any]]:
    """The WHERE clause (and its parameters) of work items whose owner is none of the `live` members; with `now`, only
    those visible then (a work item its dead owner had started is hidden until its `visible_at`)."""
    owners: list[Any] = sorted(live)
    where = f"(owner IS NULL OR owner NOT IN ({','.join('?' * len(owners))}))"
    if now is None:
        return where, owners
    return f"{where} AND (visible_at IS NULL OR visible_at <= ?)", [*owners, now]
