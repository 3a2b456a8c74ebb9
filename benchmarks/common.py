"""Shared measuring tools of the benchmarks: environment facts, timers, percentiles, RSS sampling,
result files."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
MIB = 1024 * 1024


def environment() -> dict[str, Any]:
    """Facts that a figure depends on: CPU count, Python, OS, SQLite and the git commit of the code
    measured."""
    import sqlite3

    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_total_mib": round(psutil.virtual_memory().total / MIB),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return ""
    return out.stdout.strip()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of `values`; 0.0 for an empty list."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def latency_summary(seconds: list[float]) -> dict[str, float]:
    """p50/p90/p99/max of durations given in seconds, reported in milliseconds."""
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 0.50), 3),
        "p90_ms": round(percentile(ms, 0.90), 3),
        "p99_ms": round(percentile(ms, 0.99), 3),
        "max_ms": round(max(ms), 3) if ms else 0.0,
    }


def rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


@contextmanager
def stopwatch() -> Iterator[Callable[[], float]]:
    """`with stopwatch() as elapsed:` … `elapsed()` gives seconds since entry (frozen at exit)."""
    start = time.perf_counter()
    end: list[float] = []
    yield lambda: (end[0] if end else time.perf_counter()) - start
    end.append(time.perf_counter())


def rss_mib(pid: int | None = None) -> float:
    return round(psutil.Process(pid or os.getpid()).memory_info().rss / MIB, 1)


def peak_rss_self_mib() -> float:
    """This process's peak RSS (ru_maxrss) since it started."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


@dataclass
class RssSampler:
    """Samples the RSS of processes chosen by `select` every `interval` seconds on a thread; keeps each
    peak."""

    select: Callable[[], dict[str, psutil.Process]]
    interval: float = 0.1
    peaks_mib: dict[str, float] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> RssSampler:
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        for name, proc in self.select().items():
            try:
                value = proc.memory_info().rss / MIB
                times = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            self.peaks_mib[name] = round(max(self.peaks_mib.get(name, 0.0), value), 1)
            self.cpu_s[name] = round(times.user + times.system, 2)  # last seen; a process's CPU only grows


def write_result(
    name: str, figures: dict[str, Any], *, quick: bool, params: dict[str, Any], out_dir: Path = RESULTS_DIR
) -> Path:
    """Write `<out_dir>/<name>.json` (or `<name>.quick.json`) with the environment, the parameters and
    figures."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}{'.quick' if quick else ''}.json"
    document = {
        "benchmark": name,
        "quick": quick,
        "environment": environment(),
        "parameters": params,
        "results": figures,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def python() -> str:
    return sys.executable


def role_of(proc: psutil.Process) -> str | None:
    """Which part of the local system (lab/system.py) a process is, from its command line."""
    try:
        argv = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    joined = " ".join(argv)
    if "-m devhost start" in joined:
        return "devhost"
    if "-m lab.simulator" in joined:
        return "simulator"
    if "-m agent" in joined or "-m lab agent" in joined:
        return "agent"
    return None


def system_processes(root: psutil.Process) -> dict[str, psutil.Process]:
    """The devhost, agent and simulator processes below `root`, by role."""
    try:
        children = root.children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    found: dict[str, psutil.Process] = {}
    for child in children:
        role = role_of(child)
        if role is not None:
            found[role] = child
    return found
