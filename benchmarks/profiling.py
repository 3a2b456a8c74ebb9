"""Sampling profiles with py-spy (if installed): record a running process's stacks (all threads) as collapsed
text, then rank functions by self samples and by inclusive samples.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^)]*?)(?P<line>:\d+)?\)$")
# Leaf frames of a thread parked waiting (py-spy's idle detection misses waits inside C calls on some
# kernels).
WAITING = frozenset({"EpollSelector.select", "_worker", "Waiter.wait", "select"})


def py_spy() -> str | None:
    """The py-spy executable beside this interpreter, or on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def attach(pid: int, out: Path, rate: int = 100, gil: bool = False) -> subprocess.Popen[bytes] | None:
    """Start py-spy recording `pid` until it exits (or is stopped); None without py-spy. `gil`: only the thread that
    holds the GIL is sampled, so the samples are the process's Python work and never a thread parked in a C call."""
    exe = py_spy()
    if exe is None:
        return None
    return subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--rate",
            str(rate),
            "--output",
            str(out),
            "--nonblocking",
            *(["--gil"] if gil else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _frame_name(frame: str, with_line: bool = False) -> str:
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    path = match.group("file")
    for marker in ("site-packages/", "/work/main/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    line = match.group("line") or "" if with_line else ""
    return f"{match.group('func')} ({path}{line})"


def summarize(collapsed: Path, top: int = 15) -> dict[str, Any]:
    """Top functions by self and inclusive share of samples, from py-spy's raw (collapsed-stack) output.

    Self samples are keyed by function and line (which statement is hot); inclusive ones by function. Samples
    whose leaf is a known wait (an event loop's epoll, an idle executor thread) are counted apart as
    `waiting`, so the shares are of working samples.
    """
    self_counts: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    busy = waiting = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        raw_frames = stack.split(";")
        frames = [_frame_name(f) for f in raw_frames]
        if frames[-1].split(" ", 1)[0] in WAITING:
            waiting += count
            continue
        busy += count
        self_counts[_frame_name(raw_frames[-1], with_line=True)] += count
        for name in set(frames):
            inclusive[name] += count

    def share(counter: Counter[str]) -> list[dict[str, Any]]:
        return [{"function": name, "pct": round(100 * n / busy, 1)} for name, n in counter.most_common(top)]

    return {
        "working_samples": busy,
        "waiting_samples": waiting,
        "top_self": share(self_counts),
        "top_inclusive": share(inclusive),
    }
