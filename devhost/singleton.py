"""The timer trigger's listener lock across devhost hosts that share a state folder (scale-out).

As on Azure (`TimerListener` is `[Singleton(Mode = SingletonMode.Listener)]`, azure-webjobs-sdk-extensions
TimerListener.cs), one host at a time runs a timer function's schedule. The lock is one row per function in
`<state dir>/singletons.db`, naming the holder's process (pid and start, devhost/processes.py). A host takes a lock
that is free or whose holder is gone at start-up and then at every recovery poll (host.json
`singleton.listenerLockRecoveryPollingInterval`), and gives its locks back when it stops. A dead holder is seen at
once, not after a lease runs out (docs/devhost.md, differences from Azure). Azure's figures: docs/modules-host.md.
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
