"""Whether a recorded process still runs: the one devhost started or joined with, not a later one with its pid."""

from __future__ import annotations

import psutil


def process_running(pid: int, created: float) -> bool:
    """True while `pid` exists with the creation time `created` (psutil's, in seconds) and is not a zombie."""
    try:
        proc = psutil.Process(pid)
        same: bool = abs(proc.create_time() - created) < 0.5 and proc.status() != psutil.STATUS_ZOMBIE
        return same
    except psutil.Error:
        return False
