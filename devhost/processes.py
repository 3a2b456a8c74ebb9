"""Which process a pid is: its start time, read so that a clock step never changes it, and whether it still runs.

A host records its pid and start in the task hub (devhost/durable/hub.py) and in the timers' listener locks
(devhost/singleton.py); another host judges it dead when that pid no longer runs with that start. On Linux the start
is field 22 of `/proc/<pid>/stat`, clock ticks since boot: psutil's `create_time()` adds the boot time that
`/proc/stat` gives afresh at every read, in whole seconds, which moves when the wall clock is stepped (NTP, a
resumed VM), and would make a live host look dead. Elsewhere psutil's creation time is used.
"""

from __future__ import annotations

import os
import sys

import psutil

_LINUX = sys.platform.startswith("linux")


def _proc_stat(pid: int) -> tuple[str, float] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": field 3 (state) onwards
    return fields[0], float(fields[19])  # state, starttime (field 22)


def process_start(pid: int | None = None) -> float:
    """The start of `pid` (this process by default), in a unit fixed for the machine's uptime."""
    pid = os.getpid() if pid is None else pid
    if _LINUX:
        found = _proc_stat(pid)
        if found is None:
            raise ProcessLookupError(pid)
        return found[1]
    return float(psutil.Process(pid).create_time())


def process_running(pid: int, started: float) -> bool:
    """True while `pid` runs with the start `started` (from `process_start`) and is not a zombie."""
    if _LINUX:
        found = _proc_stat(pid)
        return found is not None and found[0] != "Z" and abs(found[1] - started) < 0.5
    try:
        proc = psutil.Process(pid)
        same: bool = abs(proc.create_time() - started) < 0.5 and proc.status() != psutil.STATUS_ZOMBIE
        return same
    except psutil.Error:
        return False
