"""The timer trigger's listener lock across devhost hosts that share a state folder (scale-out).

On Azure a timer function runs on one instance of a scaled-out app at a time: `TimerListener` is declared
`[Singleton(Mode = SingletonMode.Listener)]` (azure-webjobs-sdk-extensions, TimerListener.cs), so the instance that
holds the listener's lock (a blob lease, `SingletonOptions.ListenerLockPeriod` 60 s) runs the schedule, and the
others retry every `ListenerLockRecoveryPollingInterval`, one minute by default (azure-webjobs-sdk,
SingletonOptions.cs), set in host.json `singleton.listenerLockRecoveryPollingInterval`. The timer docs: "If a
function app scales out to multiple instances, only a single instance of a timer-triggered function is run across
all instances."

devhost keeps the lock in `<state dir>/singletons.db`: one row per function, naming the holder's process (pid and
start, devhost/processes.py). A host takes a lock that is free, or whose holder is gone (every host runs on this
machine, so a dead holder is seen at once instead of after the lease runs out: docs/devhost.md, differences from
Azure), at start-up and then at every recovery poll; it gives its locks back when it stops.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from .durable.hub import process_alive
from .durable.records import Member
from .processes import process_start

DEFAULT_RECOVERY_POLL_SECONDS = 60.0  # SingletonOptions.ListenerLockRecoveryPollingInterval: TimeSpan.FromMinutes(1)


class ListenerLock:
    def __init__(self, state_dir: Path, name: str, *, process: tuple[int, float] | None = None) -> None:
        """`process`: the holder's (pid, start from devhost/processes.py); this process by default (tests name
        another)."""
        state_dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self._pid, self._started = process or (os.getpid(), process_start())
        self._db = sqlite3.connect(str(state_dir / "singletons.db"), isolation_level=None, timeout=5.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS listener_locks(name TEXT PRIMARY KEY, pid INTEGER NOT NULL, "
            "started REAL NOT NULL)"
        )
        self.held = False

    def try_acquire(self) -> bool:
        """Take the lock if it is free, already ours, or its holder is gone."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            row = self._db.execute("SELECT pid, started FROM listener_locks WHERE name=?", (self.name,)).fetchone()
            mine = row is not None and row[0] == self._pid and abs(row[1] - self._started) < 0.5
            if row is None or mine or not process_alive(Member("", row[0], row[1], "")):
                self._db.execute(
                    "INSERT OR REPLACE INTO listener_locks VALUES (?,?,?)", (self.name, self._pid, self._started)
                )
                self.held = True
            else:
                self.held = False
        finally:
            self._db.execute("COMMIT")
        return self.held

    def holder(self) -> int | None:
        row = self._db.execute("SELECT pid FROM listener_locks WHERE name=?", (self.name,)).fetchone()
        return int(row[0]) if row else None

    def release(self) -> None:
        if self.held:
            self._db.execute("DELETE FROM listener_locks WHERE name=? AND pid=?", (self.name, self._pid))
            self.held = False
        self._db.close()
