"""`python -m benchmarks profile_system [--quick] [--json]`: where the local system's CPU goes, per order (issue 27).

The system `compare` measures (devhost with function_app.py, the Agent, the simulator, the demo's client app; 0 ms
remote latency), two phases: bursts of orders at once, then orders one at a time. Per phase and process: user and
system CPU ms per order, voluntary and involuntary context switches per order (thread hand-offs and wake-ups), and
py-spy's samples of the thread holding the GIL (`--gil`: Python work, never a thread parked in a C call), sorted by
component (`COMPONENTS`: the leaf-most frame that names one) and by hottest line. Writes
benchmarks/results/profile_system.json (.quick.json with --quick). Needs py-spy (requirements-dev.txt).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from . import profiling
from .common import RESULTS_DIR, environment

# Components, by a path fragment of a frame; a sample counts for the leaf-most frame that names one, so a store call
# made by the activity counts for the store, and the SDK's JSON parsing for the SDK.
COMPONENTS: tuple[tuple[str, str], ...] = (
    ("dateutil/", "Durable SDK: dateutil parsing history timestamps"),
    ("durable_functions/", "Durable SDK (azure-functions-durable): replay, actions"),
    ("orderflow/embedded/broker/", "embedded broker (SQLite)"),
    ("orderflow/embedded/_core", "embedded Service Bus client"),
    ("orderflow/embedded/client", "embedded Service Bus client"),
    ("orderflow/embedded/notify", "embedded broker wake-ups"),
    ("orderflow/embedded/store/", "embedded store (SQLite)"),
    ("devhost/durable/", "devhost: Durable engine and store"),
    ("devhost/", "devhost: triggers, invoker, host"),
    ("pydantic", "pydantic (messages, records)"),
    ("activities/", "product: activities"),
    ("orchestrators/", "product: orchestrator code"),
    ("triggers/", "product: triggers"),
    ("orderflow/", "product: orderflow"),
    ("agent/", "Agent"),
    ("lab/", "lab (simulator, Agent's fault switches)"),
    ("servicebus/", "azure-servicebus (messages)"),
    ("aiohttp/", "aiohttp (HTTP)"),
    ("grpc", "grpc"),
    ("json/", "json"),
    ("asyncio/", "asyncio (event loop, thread hand-offs)"),
    ("concurrent/", "threads (executor)"),
    ("threading", "threads (executor)"),
)
ROLES = ("devhost", "agent", "client", "simulator")
PROFILED = ("devhost", "agent", "client")
RATE_HZ = 200


def switches(pid: int) -> tuple[int, int]:
    """Voluntary and involuntary context switches of every live thread of `pid` (/proc/PID/status counts only the
    main thread's; psutil reads that). Threads that ended are not in it: the executors' threads live on."""
    voluntary = involuntary = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "status").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                voluntary += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                involuntary += int(line.split()[1])
    return voluntary, involuntary


def component_of(stack: list[str]) -> str:
    for frame in reversed(stack):
        for fragment, name in COMPONENTS:
            if fragment in frame:
                return name
    return "other"


def by_component(raw: Path) -> dict[str, Any]:
    """Shares of GIL samples per component, and the top lines (py-spy raw output)."""
    shares: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines() if raw.exists() else []:
        stack, _, count_text = line.rpartition(" ")
        if stack and count_text.isdigit():
            shares[component_of(stack.split(";"))] += int(count_text)
            total += int(count_text)
    summary = profiling.summarize(raw, top=12) if raw.exists() else {"top_self": []}
    return {
        "gil_samples": total,
        "components_pct": {k: round(100 * n / total, 1) for k, n in shares.most_common()} if total else {},
        "top_lines": summary["top_self"],
    }


class Phase:
    """CPU, context switches and GIL samples of the system's processes across one workload."""

    def __init__(self, pids: dict[str, int], folder: Path, name: str, spy: bool) -> None:
        self.procs = {role: psutil.Process(pid) for role, pid in pids.items() if role in ROLES}
        self.folder, self.name = folder, name
        self.spies = {}
        if spy:
            for role in PROFILED:
                if role in self.procs:
                    started = profiling.attach(self.procs[role].pid, self._raw(role), rate=RATE_HZ, gil=True)
                    if started is not None:
                        self.spies[role] = started
            time.sleep(1.0)  # py-spy attaches
        self.cpu = {role: p.cpu_times() for role, p in self.procs.items()}
        self.ctx = {role: switches(p.pid) for role, p in self.procs.items()}

    def _raw(self, role: str) -> Path:
        return self.folder / f"{self.name}-{role}.raw"

    def end(self, orders: int, seconds: float) -> dict[str, Any]:
        cpu = {role: p.cpu_times() for role, p in self.procs.items()}
        ctx = {role: switches(p.pid) for role, p in self.procs.items()}
        for spy in self.spies.values():
            spy.send_signal(signal.SIGINT)  # py-spy writes its output and exits
        for spy in self.spies.values():
            spy.wait(60)
        per: dict[str, Any] = {}
        for role in self.procs:
            before, after = self.cpu[role], cpu[role]
            per[role] = {
                "user_ms": round((after.user - before.user) * 1000 / orders, 2),
                "system_ms": round((after.system - before.system) * 1000 / orders, 2),
                "voluntary_switches": round((ctx[role][0] - self.ctx[role][0]) / orders, 1),
                "involuntary_switches": round((ctx[role][1] - self.ctx[role][1]) / orders, 1),
            }
            if role in self.spies:
                per[role]["gil"] = by_component(self._raw(role))
        total = sum(r["user_ms"] + r["system_ms"] for r in per.values())
        return {"orders": orders, "seconds": round(seconds, 2), "cpu_ms_per_order": round(total, 1), "processes": per}


def run(quick: bool, spy: bool, log: Any, keep: Path | None = None) -> dict[str, Any]:
    from ._compare_systems import Instrument, Options, OurSystem
    from .compare import settle

    bursts, burst_size, sequential = (3, 30, 20) if quick else (8, 30, 60)
    work = Path(tempfile.mkdtemp(prefix="profile-system-")) if keep is None else keep
    work.mkdir(parents=True, exist_ok=True)
    system = OurSystem(work, Instrument(work, False), Options(count=False))
    phases: dict[str, Any] = {}
    try:
        system.start()
        assert system.driver is not None
        system.driver.call({"cmd": "sequential", "prefix": "warm", "n": 5}, 300)
        settle(system, "warm")
        phase, started = Phase(system.pids, work, "burst", spy), time.monotonic()
        for i in range(bursts):
            system.driver.call({"cmd": "burst", "prefix": f"b{i}", "n": burst_size}, 900)
            settle(system, f"b{i}")
        phases["burst"] = phase.end(bursts * burst_size, time.monotonic() - started)
        phases["burst"]["burst_size"] = burst_size
        log(f"burst: {phases['burst']['cpu_ms_per_order']} ms of CPU per order")
        phase, started = Phase(system.pids, work, "one_at_a_time", spy), time.monotonic()
        answer = system.driver.call({"cmd": "sequential", "prefix": "s", "n": sequential}, 900)
        settle(system, "s")
        phases["one_at_a_time"] = phase.end(sequential, time.monotonic() - started)
        latencies = sorted(answer.get("latencies_s", []))
        if latencies:
            phases["one_at_a_time"]["latency_p50_ms"] = round(1000 * latencies[len(latencies) // 2], 1)
        log(f"one at a time: {phases['one_at_a_time']['cpu_ms_per_order']} ms of CPU per order")
    finally:
        system.stop()
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return {"benchmark": "profile_system", "quick": quick, "py_spy": spy, "gil_sample_rate_hz": RATE_HZ, **phases}


def table(doc: dict[str, Any]) -> str:
    lines = []
    for name in ("burst", "one_at_a_time"):
        phase = doc[name]
        lines.append(f"{name}: {phase['orders']} orders, {phase['cpu_ms_per_order']} ms of CPU per order")
        for role, r in phase["processes"].items():
            lines.append(
                f"  {role:9s} user {r['user_ms']:6.1f} ms  system {r['system_ms']:5.1f} ms  switches "
                f"{r['voluntary_switches']:5.1f} voluntary {r['involuntary_switches']:5.1f} involuntary"
            )
            for component, pct in list(r.get("gil", {}).get("components_pct", {}).items())[:8]:
                lines.append(f"      {pct:5.1f}%  {component}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks profile_system", description=__doc__)
    p.add_argument("--quick", action="store_true", help="3 bursts and 20 orders one at a time (about a minute)")
    p.add_argument("--json", action="store_true", help="print the result document as the last line")
    p.add_argument("--no-spy", action="store_true", help="CPU and context switches only, without py-spy")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="results folder (default benchmarks/results)")
    p.add_argument("--keep", type=Path, default=None, help="run in this folder and keep it (py-spy's raw stacks, logs)")
    args = p.parse_args(argv)
    spy = not args.no_spy and profiling.py_spy() is not None
    doc = run(args.quick, spy, lambda line: print(line, file=sys.stderr, flush=True), args.keep)
    doc["environment"] = environment()
    args.out.mkdir(parents=True, exist_ok=True)
    name = "profile_system.quick.json" if args.quick else "profile_system.json"
    (args.out / name).write_text(json.dumps(doc, indent=2) + "\n")
    print(table(doc))
    if args.json:
        print(json.dumps(doc, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
