"""The run of benchmarks/azure_cost.py: the local system with the meter in devhost and the Agent, the idle window
and the scenarios, and the result document."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import compare_counts
from ._azure_cost_figures import (
    DTS_CONSUMPTION_MAX_ACTIONS_S,
    MONTH_S,
    PRICES,
    RATES,
    READ_ON,
    RU_PER_ITEM_RETURNED,
    RU_RULES,
    SOURCES,
)
from ._azure_cost_meter import COUNT_DIR_VARIABLE, METER, SITECUSTOMIZE, TIMER_FUNCTIONS, key, split
from ._azure_cost_model import (
    _nested,
    cosmos_ru,
    database_of,
    monthly,
    namespace_capacity,
    per_order,
    seconds_of,
    subtract,
    summarize,
)

SEED = 7
SETTINGS = {
    # No crash here, so steps may be short (as the retry-budget drill's): a hang costs 8 s, not 20.
    "StepTimeoutSeconds": "8",
    "ClaimLeaseSeconds": "8",
    # 10 hung requests in 30 s would open the shared breaker (registry threshold 10) and turn recoveries into
    # deferrals; the breaker still reads its document as usual.
    "CircuitBreakerFailureThreshold": "1000",
}
HANG_SECONDS = 10.0  # the simulator holds a hung answer past the 8 s step


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    script: Callable[[list[str]], dict[str, list[str]]]  # order ids -> the simulator's fault script


def _steps() -> list[str]:
    from orderflow.messages import STEPS

    return [s.value for s in STEPS]


def _key(order_id: str, step: str) -> str:
    from orderflow.messages import idempotency_key

    return idempotency_key(order_id, step)


SCENARIOS = (
    Scenario("happy", "every step succeeds at the first call", lambda ids: {}),
    Scenario(
        "hang",
        "the first step's first call hangs past CompleteBy; the Supervisor recovers the record and a "
        "second attempt completes",
        lambda ids: {_key(o, _steps()[0]): ["hang"] for o in ids},
    ),
    Scenario(
        "permanent",
        "the last step fails permanently; the two steps before it are compensated",
        lambda ids: {_key(o, _steps()[-1]): ["permanent"] for o in ids},
    ),
)


@dataclass
class Snapshot:
    at: float
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # role -> counter


class MeteredRun:
    """The local system with the meter in devhost and the Agent, our client in this process."""

    def __init__(self, work: Path, orders: int, log: Callable[[str], None], count_client: bool = True) -> None:
        """`count_client=False`: leave this process unmetered (a test: METER.install() patches for good)."""
        from lab.system import LocalSystem, SystemConfig

        self.work, self.orders, self.log, self.count_client = work, orders, log, count_client
        shim = work / "shim"
        shim.mkdir(parents=True, exist_ok=True)
        (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self.count_dir = work / "counts"
        count_dir = self.count_dir
        root = str(Path(__file__).resolve().parent.parent)

        class System(LocalSystem):
            def _process(self, name: str, argv: list[str]) -> Any:
                proc = super()._process(name, argv)
                if name in ("devhost", "agent"):
                    path = os.pathsep.join([str(shim), root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
                    proc.env = {**proc.env, "PYTHONPATH": path, COUNT_DIR_VARIABLE: str(count_dir)}
                return proc

        self.config = SystemConfig(work_dir=work / "system", seed=SEED, hang_seconds=HANG_SECONDS, settings=SETTINGS)
        self.system = System(self.config)
        self.client: Any = None
        self._seq = 0

    def start(self) -> None:
        if self.count_client:
            METER.install()  # this process: the client's Service Bus calls
        self.system.start()
        env = self.system.env()
        from .compare_ours import OurClient

        self.client = OurClient(
            self.config.bus_connection,
            env.get("OrdersQueueName", "orders-inbound"),
            self.config.reply_queue,
            timeout_s=300.0,
        )
        assert self.system.devhost and self.system.devhost.proc and self.system.agent and self.system.agent.proc
        self.pids = {"devhost": self.system.devhost.proc.pid, "agent": self.system.agent.proc.pid}

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        self.system.stop()

    def snapshot(self) -> Snapshot:
        self._seq = self._seq % 255 + 1
        counts = {
            role: compare_counts.request_dump(self.count_dir, pid, self._seq)["counts"]
            for role, pid in self.pids.items()
        }
        counts["client"] = METER.snapshot()
        return Snapshot(time.monotonic(), counts)

    def script(self, faults: dict[str, list[str]]) -> None:
        assert self.system.simulator and self.system.simulator.url
        request = urllib.request.Request(
            f"{self.system.simulator.url}/script",
            data=json.dumps(faults).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read()

    def states(self, prefix: str) -> list[tuple[str, int]]:
        """(ProcessState, attempt) of the prefix's state records, read from store.db directly (not through the
        metered adapters)."""
        conn = sqlite3.connect(f"file:{self.config.work_dir / 'store.db'}?mode=ro", uri=True, timeout=30)
        try:
            return [
                (s, int(a or 0))
                for s, a in conn.execute(
                    "SELECT json_extract(doc, '$.processState'), json_extract(doc, '$.attempt') FROM order_state "
                    "WHERE id LIKE ? ESCAPE '\\'",
                    (compare_counts._like(prefix),),
                )
            ]
        finally:
            conn.close()

    def settle(self, prefix: str, timeout: float = 120.0) -> None:
        """Until the prefix's records are terminal and its orchestrations finished, then a quiet second (late
        replies, notifications)."""
        from orderflow.records import TERMINAL_STATES

        terminal = {s.value for s in TERMINAL_STATES}
        durable_db = self.config.work_dir / "devhost" / "durable.db"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.states(prefix)
            if (
                states
                and all(s in terminal for s, _ in states)
                and not compare_counts.durable_unfinished(durable_db, prefix)
            ):
                break
            time.sleep(0.1)
        time.sleep(1.0)

    def doc_sizes(self) -> dict[str, float]:
        """Mean stored JSON size (bytes) per table, to check the 1 KB items the RU figures assume."""
        conn = sqlite3.connect(f"file:{self.config.work_dir / 'store.db'}?mode=ro", uri=True, timeout=30)
        try:
            out = {}
            for table in ("orders", "order_state", "checkpoints", "documents"):
                row = conn.execute(f"SELECT AVG(LENGTH(doc)), MAX(LENGTH(doc)) FROM {table}").fetchone()
                if row and row[0] is not None:
                    out[table] = {"mean_bytes": round(row[0]), "max_bytes": row[1]}
            return out
        finally:
            conn.close()


def _delta(after: Snapshot, before: Snapshot) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for role, now in after.counts.items():
        was = before.counts.get(role, {})
        out[role] = {k: v - was.get(k, 0) for k, v in now.items() if v - was.get(k, 0)}
    return out


def _ticks(delta: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    devhost = delta.get("devhost", {})
    return {name: float(devhost.get(key("fn", name, name, "exec"), 0)) for name in TIMER_FUNCTIONS}


def background(idle: Mapping[str, Mapping[str, int]], idle_s: float, env: Mapping[str, str]) -> dict[str, Any]:
    """The fixed cost: the timer triggers' work per tick (from the idle window) at the registry's schedules, and what
    the receivers' polling did per second (embedded broker; shown, not priced)."""
    from orderflow.settings import SETTINGS as REGISTRY

    defaults = {s.name: s.default for s in REGISTRY}
    ticks = _ticks(idle)
    periods = {
        "starter_timer": seconds_of(defaults.get("StarterSchedule") or ""),
        "supervisor": seconds_of(defaults.get("SupervisorSchedule") or ""),
    }
    per_tick: dict[str, dict[str, float]] = {}
    ru_per_s: Counter[str] = Counter()
    for name in TIMER_FUNCTIONS:
        if not ticks.get(name):
            continue
        counts = {k: v / ticks[name] for role in idle.values() for k, v in role.items() if split(k)[1] == name}
        ops = Counter({(split(k)[2], split(k)[3]): v for k, v in counts.items() if split(k)[0] == "cosmos"})
        items = Counter({(split(k)[2], split(k)[3]): v for k, v in counts.items() if split(k)[0] == "cosmos_items"})
        ru = cosmos_ru(ops, items)
        per_tick[name] = {
            "cosmos": _nested(ops),
            "ru": ru["total"],
            "servicebus_operations": round(sum(v for k, v in counts.items() if split(k)[0] == "sb"), 3),
            "period_s_registry": periods[name],
        }
        if periods[name]:
            for container, value in ru.items():
                if container != "total":
                    ru_per_s[database_of(container)] += value / periods[name]
    polling = {
        role: round(
            sum(v for k, v in counts.items() if split(k)[0] == "sb" and split(k)[1] not in TIMER_FUNCTIONS) / idle_s, 3
        )
        for role, counts in idle.items()
    }
    return {
        "idle_window_s": round(idle_s, 1),
        "ticks_in_idle_window": ticks,
        "per_tick": per_tick,
        "cosmos_ru_per_s_by_database": {k: round(v, 4) for k, v in sorted(ru_per_s.items())},
        "executions_per_s": sum(1 / p for p in periods.values() if p),
        "servicebus_polling_ops_per_s_embedded": polling,
        "schedules": {
            "StarterSchedule": defaults.get("StarterSchedule"),
            "SupervisorSchedule": defaults.get("SupervisorSchedule"),
        },
    }


def run(orders: int, idle_s: float, keep: Path | None, log: Callable[[str], None]) -> dict[str, Any]:
    work = keep or Path(tempfile.mkdtemp(prefix="azure-cost-"))
    work.mkdir(parents=True, exist_ok=True)
    measured = MeteredRun(work, orders, log)
    results: dict[str, Any] = {}
    windows: dict[str, tuple[dict[str, dict[str, int]], float, dict[str, Any]]] = {}
    started = time.monotonic()
    try:
        measured.start()
        log(f"system up in {time.monotonic() - started:.0f} s ({work})")
        measured.client.handle({"cmd": "sequential", "prefix": "warm", "n": 3})
        measured.settle("warm")
        before = measured.snapshot()
        time.sleep(idle_s)
        after = measured.snapshot()
        idle, idle_span = _delta(after, before), after.at - before.at
        for scenario in SCENARIOS:
            prefix = f"ac-{scenario.name}"
            from .compare_proto import orders_for

            ids = [o.order_id for o in orders_for(prefix, orders, measured.config.reply_queue)]
            faults = scenario.script(ids)
            if faults:
                measured.script(faults)
            before = measured.snapshot()
            answer = measured.client.handle({"cmd": "burst", "prefix": prefix, "n": orders})
            measured.settle(prefix)
            after = measured.snapshot()
            states = measured.states(prefix)
            windows[scenario.name] = (
                _delta(after, before),
                after.at - before.at,
                {
                    "answer": answer,
                    "states": dict(Counter(s for s, _ in states)),
                    "attempts_per_order": round(sum(a for _, a in states) / max(1, len(states)), 3),
                },
            )
            log(
                f"{scenario.name}: {answer['terminal']}/{orders} terminal {answer['outcomes']}, "
                f"{after.at - before.at:.1f} s"
            )
        sizes = measured.doc_sizes()
        env = measured.system.env()
    finally:
        measured.stop()
    durable_db = measured.config.work_dir / "devhost" / "durable.db"
    idle_ticks = _ticks(idle)
    for name, (delta, span, facts) in windows.items():
        ticks = _ticks(delta)
        per_role = {
            role: per_order(counts, idle.get(role, {}), idle_span, idle_ticks, span, ticks, orders)
            for role, counts in delta.items()
        }
        durable = compare_counts.durable_counts(durable_db, f"ac-{name}")
        each = {k: round(v / orders, 3) for k, v in durable.items() if isinstance(v, int | float)}
        each["history_events_by_type"] = {k: round(v / orders, 3) for k, v in durable["history_events_by_type"].items()}
        results[name] = {
            "orders": orders,
            "window_s": round(span, 1),
            "timer_ticks_in_window": ticks,
            "outcomes": facts["answer"]["outcomes"],
            "terminal": facts["answer"]["terminal"],
            "states": facts["states"],
            "attempts_per_order": facts["attempts_per_order"],
            **summarize(per_role, each),
        }
    fixed = background(idle, idle_span, env)
    happy = results["happy"]
    if keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "benchmark": "azure_cost",
        "params": {
            "orders_per_scenario": orders,
            "idle_window_s": idle_s,
            "settings": SETTINGS,
            "hang_seconds": HANG_SECONDS,
            "seed": SEED,
            "month_s": MONTH_S,
            "rates": list(RATES),
        },
        "scenarios": {s.name: s.what for s in SCENARIOS},
        "per_order": results,
        "per_recovery": {
            name: subtract(_numbers(results[name]), _numbers(happy)) for name in results if name != "happy"
        },
        "background": fixed,
        "doc_sizes": sizes,
        "monthly": [monthly(happy, fixed, rate) for rate in RATES],
        "servicebus_namespace": {name: namespace_capacity(r) for name, r in results.items()},
        "dts_consumption_max_orders_per_s": round(DTS_CONSUMPTION_MAX_ACTIONS_S / happy["durable"]["dts_actions"], 1),
        "ru_rules": RU_RULES,
        "ru_per_item_returned": RU_PER_ITEM_RETURNED,
        "prices": {k: vars(p) for k, p in PRICES.items()},
        "sources": {k: {**vars(s), "read_on": READ_ON} for k, s in SOURCES.items()},
        "run_s": round(time.monotonic() - started, 1),
    }


def _numbers(result: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("cosmos", "servicebus", "functions", "durable", "attempts_per_order")
    return {k: result[k] for k in keep if k in result}
