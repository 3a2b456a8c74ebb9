"""The simulator's ledger (`EffectStore`): the calls, the side effects by idempotency key and the compensations, in one
SQLite file shared by every process (each method one short transaction). `python -m lab.simulator` serves it
(lab/simulator.py); the drills read it as the evidence of what the remote service did."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

from orderflow.messages import COMPENSATED_STEP, CompensationName, StepName


class KeyConflict(Exception):
    """The idempotency key was already used for another (orderId, step)."""


class AlreadyCompensated(Exception):
    """A forward step whose compensation was already recorded (undone or tombstone): refused, nothing applied."""

    def __init__(self, order_id: str, step: str, compensation: str, undone: bool) -> None:
        what = "undone" if undone else "compensated before it was ever applied"
        super().__init__(f"{step} of order {order_id} was already {what} by {compensation}; not applied")
        self.compensation = compensation
        self.undone = undone


_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, count INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, order_id TEXT NOT NULL, step TEXT NOT NULL,
                                    result TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS call_log (at REAL NOT NULL, key TEXT NOT NULL, status INTEGER NOT NULL,
                                     down INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS applied_effects (order_id TEXT NOT NULL, step TEXT NOT NULL,
                                            count INTEGER NOT NULL,
                                            PRIMARY KEY (order_id, step));
CREATE TABLE IF NOT EXISTS compensated (order_id TEXT NOT NULL, step TEXT NOT NULL, compensation TEXT NOT NULL,
                                        key TEXT NOT NULL, undone INTEGER NOT NULL,
                                        PRIMARY KEY (order_id, step));
"""


class EffectStore:
    """Side effects by idempotency key in SQLite; each method is one short transaction (multi-process)."""

    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)  # `--db .devhost/simulator.db` on a fresh clone
        self._db = sqlite3.connect(str(path), isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL, not SQLite's default FULL: in WAL mode a commit then survives any crash of a process (the simulator's
        # or a caller's), only a power loss may take back the last ones (sqlite.org/pragma.html#pragma_synchronous), and
        # it spares an fsync per commit, most of the simulator's CPU per call (3 commits a call).
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def next_call(self, key: str) -> int:
        """Count a call for `key`; returns its 1-based number."""
        row = self._db.execute(
            "INSERT INTO calls (key, count) VALUES (?, 1) ON CONFLICT(key) DO UPDATE SET count = count + 1 "
            "RETURNING count",
            (key,),
        ).fetchone()
        return int(row[0])

    def log_call(self, at: float, key: str, status: int, down: bool) -> None:
        """Keep one call's arrival time (Unix seconds), key, answer and whether the service was down."""
        self._db.execute("INSERT INTO call_log (at, key, status, down) VALUES (?, ?, ?, ?)", (at, key, status, down))

    def calls(self, since: float = 0.0) -> list[dict[str, Any]]:
        """The call log from `since` on, in arrival order."""
        rows = self._db.execute(
            "SELECT at, key, status, down FROM call_log WHERE at >= ? ORDER BY at", (since,)
        ).fetchall()
        return [{"at": at, "key": key, "status": status, "down": bool(down)} for at, key, status, down in rows]

    def apply(self, key: str, order_id: str, step: str) -> tuple[dict[str, Any], bool]:
        """Apply the effect of `key` once; returns (result, replayed). Raises KeyConflict on key reuse, and
        AlreadyCompensated (nothing applied) when `key` has no stored result and the step's compensation was already
        recorded for the order. One transaction: the check and the effect are atomic with `compensate`."""
        with self._transaction():
            stored = self._stored(key, order_id, step)
            if stored is not None:
                return stored, True
            compensated = self._db.execute(
                "SELECT compensation, undone FROM compensated WHERE order_id = ? AND step = ?", (order_id, step)
            ).fetchone()
            if compensated is not None:
                raise AlreadyCompensated(order_id, step, compensated[0], bool(compensated[1]))
            result = _effect_result(key, order_id, step)
            self._record(key, order_id, step, result, count_effect=True)
            return result, False

    def compensate(self, key: str, order_id: str, compensation: CompensationName) -> tuple[dict[str, Any], bool]:
        """Apply compensation `key` once; returns (result, replayed). Raises KeyConflict on key reuse.

        In one transaction (atomic with `apply`): if the forward effect of (order_id, its step) was applied and not
        undone, undo it (`undone`) and count one compensation effect; if it was never applied, count nothing and
        leave a tombstone (`noop`, reason `never-applied`); if it was already compensated (another key), `noop`
        with reason `already-compensated`. Either record makes `apply` refuse the forward step from then on."""
        step = COMPENSATED_STEP[compensation]
        with self._transaction():
            stored = self._stored(key, order_id, compensation)
            if stored is not None:
                return stored, True
            prior = self._db.execute(
                "SELECT 1 FROM compensated WHERE order_id = ? AND step = ?", (order_id, step)
            ).fetchone()
            applied = self._db.execute(
                "SELECT count FROM applied_effects WHERE order_id = ? AND step = ?", (order_id, step)
            ).fetchone()
            undone = prior is None and applied is not None and applied[0] > 0
            if prior is None:
                self._db.execute(
                    "INSERT INTO compensated (order_id, step, compensation, key, undone) VALUES (?, ?, ?, ?, ?)",
                    (order_id, step, compensation.value, key, undone),
                )
            reason = None if undone else ("already-compensated" if prior is not None else "never-applied")
            result = _compensation_result(key, order_id, compensation, step, reason)
            self._record(key, order_id, compensation.value, result, count_effect=undone)
            return result, False

    def _stored(self, key: str, order_id: str, name: str) -> dict[str, Any] | None:
        """The stored result of `key` (inside a transaction), None if it has none; KeyConflict if used elsewhere."""
        row = self._db.execute("SELECT order_id, step, result FROM effects WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        if (row[0], row[1]) != (order_id, name):
            raise KeyConflict(f"idempotency key {key!r} was used for {row[0]}/{row[1]}")
        stored: dict[str, Any] = json.loads(row[2])
        return stored

    def _record(self, key: str, order_id: str, name: str, result: dict[str, Any], count_effect: bool) -> None:
        """Store the result of `key` (inside a transaction) and, for an effect, count it for (order_id, name)."""
        self._db.execute(
            "INSERT INTO effects (key, order_id, step, result) VALUES (?, ?, ?, ?)",
            (key, order_id, name, json.dumps(result)),
        )
        if count_effect:
            self._db.execute(
                "INSERT INTO applied_effects (order_id, step, count) VALUES (?, ?, 1) "
                "ON CONFLICT(order_id, step) DO UPDATE SET count = count + 1",
                (order_id, name),
            )

    @contextlib.contextmanager
    def _transaction(self, read_only: bool = False) -> Any:
        """One short transaction: BEGIN IMMEDIATE (the write lock at once, so check-then-write is atomic across
        processes), or a plain BEGIN for a consistent read."""
        self._db.execute("BEGIN" if read_only else "BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def report(self) -> dict[str, Any]:
        """Forward effects per (orderId, step) and their total, compensation effects per (orderId, compensation) and
        their total, the forward effects undone, the tombstones, duplicates (must be 0) and the number of calls.
        One read transaction, so the parts agree with each other."""
        with self._transaction(read_only=True):
            rows = self._db.execute(
                "SELECT order_id, step, count FROM applied_effects ORDER BY order_id, step"
            ).fetchall()
            marks = self._db.execute(
                "SELECT order_id, step, compensation, undone FROM compensated ORDER BY order_id, step"
            ).fetchall()
            by_key = dict(self._db.execute("SELECT key, count FROM calls ORDER BY key").fetchall())
            down_by_key = dict(
                self._db.execute("SELECT key, COUNT(*) FROM call_log WHERE down GROUP BY key ORDER BY key").fetchall()
            )
        forward = [(o, s, c) for o, s, c in rows if s not in COMPENSATIONS]
        undoing = [(o, s, c) for o, s, c in rows if s in COMPENSATIONS]
        return {
            "effects": [{"orderId": o, "step": s, "applied": c} for o, s, c in forward],
            "totalApplied": sum(c for _, _, c in forward),
            "duplicates": sum(c - 1 for _, _, c in rows if c > 1),
            "compensations": [
                {"orderId": o, "compensation": s, "step": COMPENSATED_STEP[CompensationName(s)].value, "applied": c}
                for o, s, c in undoing
            ],
            "totalCompensations": sum(c for _, _, c in undoing),
            "undone": [{"orderId": o, "step": s, "compensation": c} for o, s, c, u in marks if u],
            "tombstones": [{"orderId": o, "step": s, "compensation": c} for o, s, c, u in marks if not u],
            "calls": sum(by_key.values()),
            "callsByKey": by_key,
            "callsWhileDown": sum(down_by_key.values()),
            "callsWhileDownByKey": down_by_key,
        }


COMPENSATIONS = frozenset(c.value for c in CompensationName)


def _effect_result(key: str, order_id: str, step: str) -> dict[str, Any]:
    """The deterministic result of a step's effect (a confirmation the Scheduler can record)."""
    confirmation = hashlib.sha256(key.encode()).hexdigest()[:12]
    return {"confirmation": f"{step}-{confirmation}", "orderId": order_id, "step": step}


def _compensation_result(
    key: str, order_id: str, compensation: CompensationName, step: StepName, noop_reason: str | None
) -> dict[str, Any]:
    """The deterministic result of a compensation: `undone` (it undid `compensates`) or `noop` with a reason."""
    result = {
        **_effect_result(key, order_id, compensation.value),
        "compensates": step.value,
        "undone": noop_reason is None,
        "noop": noop_reason is not None,
    }
    if noop_reason is not None:
        result["reason"] = noop_reason
    return result
