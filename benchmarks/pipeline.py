"""Benchmark of the whole local pipeline: `python -m devhost demo --orders N --seed S --json` (devhost
with the
product app, the Agent worker, the remote-service simulator and a client app), with and without injected
failures. Figures: orders/s and latency p50/p99 from the demo's JSON, wall time including start-up, and
peak RSS
and CPU seconds of each process, sampled with psutil. With --profile, py-spy records devhost and the Agent.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from . import profiling
from .common import ROOT, RssSampler, python, system_processes

FAILURES = {"failures": (0.3, 0.02), "clean": (0.0, 0.0)}
SEED = 7


@dataclass(frozen=True)
class Run:
    orders: int
    scenario: str

    @property
    def rates(self) -> tuple[float, float]:
        return FAILURES[self.scenario]


def runs_for(quick: bool) -> list[Run]:
    counts = (50,) if quick else (100, 300)
    return [Run(n, scenario) for n in counts for scenario in ("clean", "failures")]


def demo(run: Run, work_dir: Path, profile_dir: Path | None = None) -> dict[str, Any]:
    """One demo run as a subprocess; returns its JSON summary plus the process figures."""
    transient, permanent = run.rates
    argv = [
        python(),
        "-m",
        "devhost",
        "demo",
        "--orders",
        str(run.orders),
        "--seed",
        str(SEED),
        "--transient-failure-rate",
        str(transient),
        "--permanent-failure-rate",
        str(permanent),
        "--json",
        "--work-dir",
        str(work_dir),
        "--timeout",
        "900",
    ]
    started = time.monotonic()
    with open(work_dir.parent / f"{work_dir.name}.stderr", "wb") as stderr:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr)
    root = psutil.Process(proc.pid)
    profilers: dict[str, subprocess.Popen[bytes]] = {}

    def select() -> dict[str, psutil.Process]:
        found = system_processes(root)
        if profile_dir is not None:
            _attach_profilers(found, profilers, profile_dir, run)
        return {"demo_client": root, **found}

    with RssSampler(select, interval=0.1) as sampler:
        stdout, _ = proc.communicate()
    wall = time.monotonic() - started
    for profiler in profilers.values():
        profiler.wait(60)
    summary = _last_json(stdout.decode())
    return {
        "orders": run.orders,
        "scenario": run.scenario,
        "transient_failure_rate": transient,
        "permanent_failure_rate": permanent,
        "seed": SEED,
        "exit_code": proc.returncode,
        "orders_per_s": summary.get("orders_per_s"),
        "latency_ms": summary.get("latency_ms"),
        "elapsed_s": summary.get("elapsed_s"),
        "wall_s_with_startup": round(wall, 2),
        "peak_rss_mib": sampler.peaks_mib,
        "cpu_s": sampler.cpu_s,
        "demo_summary": {k: v for k, v in summary.items() if k != "work_dir"},
    }


def _attach_profilers(
    found: dict[str, psutil.Process],
    profilers: dict[str, subprocess.Popen[bytes]],
    profile_dir: Path,
    run: Run,
) -> None:
    for role in ("devhost", "agent"):
        if role in found and role not in profilers:
            out = profile_dir / f"{role}-{run.orders}-{run.scenario}.txt"
            started = profiling.attach(found[role].pid, out)
            if started is not None:
                profilers[role] = started


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)  # type: ignore[no-any-return]
    raise RuntimeError("the demo printed no JSON summary")


def run(quick: bool, profile: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every demo run of the plan; with `profile`, py-spy summaries of devhost and the Agent for the
    last run."""
    figures: dict[str, Any] = {"runs": []}
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp_name:
        tmp = Path(tmp_name)
        plan = runs_for(quick)
        for index, item in enumerate(plan):
            profile_dir = tmp if profile and index == len(plan) - 1 else None
            figures["runs"].append(demo(item, tmp / f"demo-{item.orders}-{item.scenario}", profile_dir))
        if profile:
            figures["profile"] = _profiles(tmp, plan[-1])
    params = {
        "runs": [{"orders": r.orders, "scenario": r.scenario, "rates": r.rates} for r in runs_for(quick)],
        "seed": SEED,
        "profiled": profile,
    }
    return figures, params


def _profiles(tmp: Path, item: Run) -> dict[str, Any]:
    found: dict[str, Any] = {"run": {"orders": item.orders, "scenario": item.scenario}}
    for role in ("devhost", "agent"):
        raw = tmp / f"{role}-{item.orders}-{item.scenario}.txt"
        if raw.exists():
            found[role] = profiling.summarize(raw)
    return found
