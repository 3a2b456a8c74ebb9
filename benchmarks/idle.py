"""Benchmark of the idle cost of the local system: CPU used over a quiet window by devhost hosting the product
app (timer triggers and Service Bus listeners running, no orders), and by the Agent and the simulator
beside it.
Two schedules: the local demo settings (lab/system.py LOCAL_DEFAULTS: Starter every 5 s, Supervisor every
2 s) and the settings registry's defaults (Starter every 15 s, Supervisor every 10 s).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from lab.system import LocalSystem, SystemConfig

from .common import rss_mib

SETTLE_S = 5.0
REGISTRY_SCHEDULES = {
    "StarterSchedule": "*/15 * * * * *",
    "SupervisorSchedule": "*/10 * * * * *",
    "AGENT_RECEIVE_WAIT_MS": "5000",
}


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system + times.children_user + times.children_system


def measure(settings: dict[str, str], window: float) -> dict[str, Any]:
    """Start the system, let it settle, then read each process's CPU seconds across `window` seconds."""
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        system = LocalSystem(SystemConfig(work_dir=Path(tmp), settings=settings))
        try:
            system.start()
            time.sleep(SETTLE_S)  # start-up work (indexing, queue declarations, first timer ticks) is not idle
            procs = {
                name: psutil.Process(p.proc.pid)
                for name, p in (
                    ("devhost", system.devhost),
                    ("agent", system.agent),
                    ("simulator", system.simulator),
                )
                if p is not None and p.proc is not None
            }
            before = {name: _snapshot(p) for name, p in procs.items()}
            time.sleep(window)  # the measurement window itself
            after = {name: _snapshot(p) for name, p in procs.items()}
            rss = {name: rss_mib(p.pid) for name, p in procs.items()}
        finally:
            system.stop()
    return {name: _figures(before[name], after[name], window) | {"rss_mib": rss[name]} for name in procs}


def _snapshot(proc: psutil.Process) -> tuple[float, int]:
    """CPU seconds (user + system, with reaped children) and voluntary context switches (≈ wake-ups)."""
    return _cpu(proc), int(proc.num_ctx_switches().voluntary)


def _figures(before: tuple[float, int], after: tuple[float, int], window: float) -> dict[str, Any]:
    cpu = after[0] - before[0]
    return {
        "cpu_pct_of_one_core": round(100 * cpu / window, 2),
        "cpu_ms": round(1000 * cpu, 1),
        "wakeups_per_s": round((after[1] - before[1]) / window, 1),
    }


def run(quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    window = 5.0 if quick else 10.0
    figures = {
        "demo_settings": measure({}, window),
        "registry_schedules": measure(REGISTRY_SCHEDULES, window),
    }
    return figures, {"window_s": window, "settle_s": SETTLE_S, "registry_schedules": REGISTRY_SCHEDULES}
