"""Store drills, `python -m devhost drill state-store-conflicts|store-outage`: the state store misbehaving as a Cosmos
DB account does, through the embedded store's fault switch (orderflow/embedded/store/ `StoreFaults`).

Contract: only the system under test sees the faults (endpoint options
`embedded://PATH?conflictRate=..&throttleRate=..&seed=..&outageFile=..`); the drill's own reads use the plain
endpoint. Each injected answer is a line of `<store>.faults.jsonl`. `state-store-conflicts`: every order Processed
once, one effect per step, none lost; `store-outage`: an outage may delay an order, never fail or lose one.
`--set conflictRate=R`, `throttleRate=R`, `throttleRetryAfterMs=MS` set the fault options. Details:
docs/modules-lab.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from azure.durable_functions.models.history import HistoryEventType

from orderflow.apps import inbound_queue
from orderflow.embedded.connection import store_endpoint_as, store_identity
from orderflow.messages import STEPS, OrderStatus, SubmitOrder
from orderflow.records import ProcessState

from .demo import (
    ClientApp,
    StateSummary,
    client_app,
    default_work_dir,
    make_orders,
    read_effects,
    read_states,
)
from .drill_common import SETTINGS_CHOICES, Verdict, base_settings, drill_arguments, run_verdict_drill, usage_error
from .invariants import _dead_letters, check_system, install_for, read_transitions, store_path
from .lifecycle_lab import until
from .system import LocalSystem, Process, SystemConfig, with_bus_config

STORE_DRILLS = ("state-store-conflicts", "store-outage")
DEFAULT_ORDERS = {"state-store-conflicts": 40, "store-outage": 20}  # store-outage: and half as many during it
# The fault options a drill's `--set` may carry (the rest are app settings), with each drill's defaults.
FAULT_OPTIONS = ("conflictRate", "throttleRate", "throttleRetryAfterMs")
DEFAULT_FAULTS: dict[str, dict[str, str]] = {
    # High enough that every order meets several of each: about one If-Match write in four loses a race, one request
    # in five is throttled (each retried after 10 ms, so ten in a row, one in ten million, would reach a caller).
    "state-store-conflicts": {"conflictRate": "0.25", "throttleRate": "0.2", "throttleRetryAfterMs": "10"},
    "store-outage": {},
}
_EVERY_SECOND = "*/1 * * * * *"
# Over the chosen base (LOCAL_DEFAULTS or the sample's) and under `--set`. The Starter runs every second, so an order
# whose claim lost a race (a 412) is claimed again at once. store-outage: 8 s steps and claim leases, as remote-outage
# has (nothing is killed, so the crash budget of orderflow/session_locks.py does not apply): an attempt the outage
# broke expires soon after the store is back.
STORE_SETTINGS: dict[str, dict[str, str]] = {
    "state-store-conflicts": {"StarterSchedule": _EVERY_SECOND},
    "store-outage": {"StarterSchedule": _EVERY_SECOND, "StepTimeoutSeconds": "8", "ClaimLeaseSeconds": "8"},
}
IN_FLIGHT_WAIT_S = 30.0  # the longest store-outage waits for orders in flight before it takes the store down
UNFINISHED = (ProcessState.PENDING.value, ProcessState.PROCESSING.value, ProcessState.COMPENSATING.value)
_READ_SUFFIXES = (".get", ".page", ".first")


@dataclass(frozen=True)
class StoreDrillOptions:
    drill: str
    orders: int | None = None
    seed: int = 1
    settings: str = "local"
    overrides: tuple[tuple[str, str], ...] = ()  # --set NAME=VALUE: fault options and app settings
    outage_for: float = 15.0  # store-outage: seconds the store stays down
    latency_ms: float = 800.0  # store-outage: the simulator's mean latency per call (orders in flight at the outage)
    timeout: float = 900.0

    def __post_init__(self) -> None:
        if self.drill not in STORE_DRILLS:
            raise ValueError(f"drill must be one of {STORE_DRILLS}")
        if self.settings not in SETTINGS_CHOICES:
            raise ValueError(f"settings must be one of {SETTINGS_CHOICES}")
        if self.order_count < 1 or self.outage_for <= 0 or self.latency_ms < 0:
            raise ValueError("need at least one order, outage_for > 0 and latency_ms >= 0")
        for name, value in self.fault_options().items():
            if name != "throttleRetryAfterMs" and not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {value!r}")

    @property
    def order_count(self) -> int:
        return DEFAULT_ORDERS[self.drill] if self.orders is None else self.orders

    def fault_options(self) -> dict[str, str]:
        return {**DEFAULT_FAULTS[self.drill], **{k: v for k, v in self.overrides if k in FAULT_OPTIONS}}

    def settings_values(self) -> dict[str, str]:
        return {
            **base_settings(self.settings),
            **STORE_SETTINGS[self.drill],
            **{k: v for k, v in self.overrides if k not in FAULT_OPTIONS},
        }


def faulty_endpoint(store: Path, options: StoreDrillOptions) -> str:
    """The endpoint devhost and the Agent get: the store's, with the drill's fault options."""
    query = {**options.fault_options(), "seed": str(options.seed)}
    if options.drill == "store-outage":
        query["outageFile"] = str(outage_file(store))
    return f"embedded://{store}?" + "&".join(f"{k}={v}" for k, v in query.items())


def outage_file(store: Path) -> Path:
    return store.with_name(store.name + ".down")


def ledger_file(store: Path) -> Path:
    return store.with_name(store.name + ".faults.jsonl")


class FaultySystem(LocalSystem):
    """The local system whose processes (devhost, the Agent) see the store through the faulty endpoint; `env()` (what
    the drill itself reads the store with) keeps the plain one."""

    def __init__(self, config: SystemConfig, options: StoreDrillOptions) -> None:
        super().__init__(config)
        self.store = store_path(self.env())
        self.endpoint = faulty_endpoint(self.store, options)

    def _process(self, name: str, argv: list[str]) -> Process:
        process = super()._process(name, argv)
        identity = store_identity(process.env["CosmosDb__accountEndpoint"])  # the process's own (lab/system.py)
        process.env["CosmosDb__accountEndpoint"] = store_endpoint_as(self.endpoint, identity)
        return process


def store_config(work_dir: Path, options: StoreDrillOptions, servicebus_config: Path | None = None) -> SystemConfig:
    """A remote that never fails by itself; store-outage's answers slowly, so orders are in flight at the outage."""
    config = SystemConfig(
        work_dir=work_dir.resolve(),
        seed=options.seed,
        transient_failure_rate=0.0,
        permanent_failure_rate=0.0,
        hang_rate=0.0,
        settings=options.settings_values(),
    )
    if options.drill == "store-outage":
        config.latency_ms_mean = options.latency_ms
    return with_bus_config(config, servicebus_config)


# --- what the drills read ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultLedger:
    """A fault ledger: one entry per injected answer, {at, pid, op, status, retried} for the store's, {at, pid, op,
    queue, fault, retried} for the broker's (`field` names what was injected: "status" or "fault")."""

    entries: list[dict[str, Any]]
    field: str = "status"

    @classmethod
    def read(cls, path: Path, field: str = "status") -> FaultLedger:
        if not path.exists():
            return cls([], field)
        return cls([json.loads(line) for line in path.read_text().splitlines() if line.strip()], field)

    def by_op(self, status: int | str, retried: bool | None = None) -> dict[str, int]:
        counted = Counter(
            e["op"] for e in self.entries if e[self.field] == status and (retried is None or e["retried"] is retried)
        )
        return dict(sorted(counted.items()))

    def count(self, status: int | str, retried: bool | None = None) -> int:
        return sum(self.by_op(status, retried).values())


def is_read(op: str) -> bool:
    return op.endswith(_READ_SUFFIXES) or ".query" in op or ".count" in op


@dataclass(frozen=True)
class DurableFigures:
    """devhost's durable history: orchestrations that Failed and activity executions that failed (TaskFailed)."""

    failed_orchestrations: int
    failed_activities: int

    @classmethod
    def read(cls, db: Path) -> DurableFigures:
        if not db.exists():
            return cls(0, 0)
        with sqlite3.connect(db, timeout=30) as conn:
            failed = conn.execute("SELECT COUNT(*) FROM instances WHERE status = 'Failed'").fetchone()[0]
            events = [json.loads(e)["EventType"] for (e,) in conn.execute("SELECT event FROM history")]
        return cls(int(failed), sum(1 for e in events if e == HistoryEventType.TASK_FAILED))


def processed_entries(store: Path, order_ids: list[str]) -> dict[str, int]:
    """How many times each order entered Processed, from the transition audit."""
    entered = Counter(o for o, _before, after in read_transitions(store) if after == ProcessState.PROCESSED.value)
    return {o: entered.get(o, 0) for o in order_ids}


def missing_effects(effects: dict[str, Any], processed: list[str]) -> int:
    """Steps of Processed orders without their side effect in the simulator's ledger."""
    applied = {(e["orderId"], e["step"]) for e in effects.get("effects", []) if e["applied"] >= 1}
    return sum(1 for o in processed for step in STEPS if (o, step.value) not in applied)


async def settled(system: LocalSystem, client: ClientApp, order_ids: list[str]) -> bool:
    """Every order has its final status, or (a lost order never gets one) the rest are in the app queue's dead-letter
    queue: nothing more will happen, so the drill need not wait for its timeout."""
    if client.all_terminal.is_set():
        return True
    waiting = {o for o in order_ids if o not in client.terminal_at}
    dead = await asyncio.to_thread(_dead_letter_sessions, system)
    return waiting <= dead


def _dead_letter_sessions(system: LocalSystem) -> set[str]:
    from azure.servicebus import ServiceBusSubQueue

    from orderflow.adapters import bus_from_connection_string

    queue = inbound_queue(system.submitter)  # the client app's own queue (lab/demo.py client_app)
    found: set[str] = set()
    with (
        bus_from_connection_string(system.config.bus_connection) as bus,
        bus.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq,
    ):
        start = 0
        while page := dlq.peek_messages(max_message_count=100, sequence_number=start):
            found.update(str(m.session_id) for m in page if m.session_id)
            start = int(page[-1].sequence_number) + 1
    return found


class RunOptions(Protocol):
    """What `_finish` and `StoreRun` read of a drill's options (a store drill's, the bus drill's)."""

    @property
    def drill(self) -> str: ...

    @property
    def timeout(self) -> float: ...


@dataclass
class StoreRun:
    """What a store drill (or the bus drill, lab/bus_drills.py) saw, for its verdict."""

    options: RunOptions
    system: LocalSystem
    order_ids: list[str]
    client: ClientApp
    states: StateSummary
    effects: dict[str, Any]
    elapsed_s: float

    def got(self, order_id: str, state: OrderStatus) -> bool:
        return any(s.state is state for s in self.client.statuses.get(order_id, []))

    def processed(self, order_ids: list[str] | None = None) -> list[str]:
        return [
            o
            for o in (self.order_ids if order_ids is None else order_ids)
            if self.states.state_of.get(o) == ProcessState.PROCESSED.value
        ]

    def all_completed(self, order_ids: list[str] | None = None) -> bool:
        """Processed, and the client got `completed`."""
        ids = self.order_ids if order_ids is None else order_ids
        return len(self.processed(ids)) == len(ids) and all(self.got(o, OrderStatus.COMPLETED) for o in ids)

    def verdict(self, checks: dict[str, bool], figures: dict[str, Any]) -> Verdict:
        """With the checks every drill has: none lost (a final status and a record each), no duplicate side effect,
        none stuck; plus one entry into Processed per order (the transition audit) and no missing effect."""
        lost = sum(1 for o in self.order_ids if o not in self.client.terminal_at or o not in self.states.state_of)
        stuck = sum(1 for o in self.order_ids if self.states.state_of.get(o) in UNFINISHED)
        duplicates = int(self.effects.get("duplicates", -1))  # -1: the ledger could not be read
        entered = processed_entries(store_path(self.system.env()), self.order_ids)
        durable = DurableFigures.read(self.system.config.work_dir / "devhost" / "durable.db")
        common = {
            "none lost": lost == 0,
            "no duplicate side effect": duplicates == 0,
            "none stuck": stuck == 0,
            "every order Processed with `completed`": self.all_completed(),
            "no order entered Processed twice (transition audit)": all(n <= 1 for n in entered.values()),
            "one effect per step of every Processed order": missing_effects(self.effects, self.processed()) == 0,
        }
        figures = {
            **figures,
            "states": dict(self.states.counts),
            "attempts": {str(a): n for a, n in sorted(Counter(self.states.attempts.values()).items())},
            "failure_counts": {str(f): n for f, n in sorted(self.states.failure_counts.items())},
            "failed_orchestrations": durable.failed_orchestrations,
            "failed_activity_executions": durable.failed_activities,
            "elapsed_s": round(self.elapsed_s, 1),
            "work_dir": str(self.system.config.work_dir),
        }
        return Verdict(self.options.drill, len(self.order_ids), lost, duplicates, stuck, {**common, **checks}, figures)


async def _finish(
    system: LocalSystem, options: RunOptions, client: ClientApp, order_ids: list[str], started: float
) -> StoreRun:
    """Wait for every final status (or the rest dead-lettered), then read what the verdict is judged on."""
    await until(lambda: settled(system, client, order_ids), options.timeout, every=0.5)  # else the verdict says
    elapsed = max(client.terminal_at.values(), default=time.monotonic()) - started
    effects = await read_effects(system)
    states = await read_states(system.env(), order_ids)
    return StoreRun(options, system, order_ids, client, states, effects, elapsed)


# --- state-store-conflicts --------------------------------------------------------------------------------------


async def drill_conflicts(system: FaultySystem, options: StoreDrillOptions) -> tuple[Verdict, list[str]]:
    orders = make_orders(options.order_count, options.seed, system.config.reply_queue, prefix="store-conflicts")
    ids = [o.order_id for o in orders]
    async with client_app(system) as client:
        started = time.monotonic()
        await client.submit(orders)
        run = await _finish(system, options, client, ids, started)
    ledger = FaultLedger.read(ledger_file(system.store))
    conflicts, throttled = ledger.by_op(412), ledger.by_op(429)
    checks = {
        "412s injected on state-record writes": conflicts.get("state.replace", 0) > 0,
        "429s injected on reads and on writes": any(is_read(op) for op in throttled)
        and any(not is_read(op) for op in throttled),
    }
    figures = {
        "fault_options": options.fault_options(),
        "injected_412": sum(conflicts.values()),
        "injected_412_by_op": conflicts,
        "injected_429": sum(throttled.values()),
        "injected_429_by_op": throttled,
        # The adapter retries a 429 as azure-cosmos does (9 times); only a 10th in a row reaches the caller.
        "429_reaching_callers": ledger.count(429, retried=False),
        "429_reaching_callers_by_op": ledger.by_op(429, retried=False),
    }
    return run.verdict(checks, figures), ids


# --- store-outage -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outage:
    started: float  # monotonic
    ended: float
    in_flight: int  # orders without a final status when the store went down
    states_at_start: dict[str, int]


async def _in_flight(system: LocalSystem, order_ids: list[str], wanted: int) -> bool:
    """At least `wanted` orders have a step done at the remote (so they are mid-way: claimed, steps to go)."""
    effects = await read_effects(system)
    started = {e["orderId"] for e in effects.get("effects", []) if e["applied"] >= 1 and e["orderId"] in order_ids}
    return len(started) >= wanted


async def _take_down(
    system: FaultySystem, client: ClientApp, first: list[str], during: list[SubmitOrder], outage_for: float
) -> Outage:
    """Once a quarter of the first orders are mid-way, the store goes down for `outage_for` s, while the client app
    submits `during`; then it comes back."""
    await until(lambda: _in_flight(system, first, max(1, len(first) // 4)), IN_FLIGHT_WAIT_S)
    states = await read_states(system.env(), first)  # the store is up yet: the drill reads it plainly
    switch = outage_file(system.store)
    switch.touch()
    started = time.monotonic()
    in_flight = sum(1 for o in first if o not in client.terminal_at)
    try:
        await client.submit(during)
        await asyncio.sleep(max(0.0, outage_for - (time.monotonic() - started)))  # the outage's length: the scenario
    finally:
        switch.unlink(missing_ok=True)
    return Outage(started, time.monotonic(), in_flight, dict(states.counts))


async def drill_outage(system: FaultySystem, options: StoreDrillOptions) -> tuple[Verdict, list[str]]:
    n = options.order_count
    first = make_orders(n, options.seed, system.config.reply_queue, prefix="store-outage")
    during = make_orders(max(1, n // 2), options.seed, system.config.reply_queue, prefix="store-outage-during")
    first_ids, during_ids = [o.order_id for o in first], [o.order_id for o in during]
    ids = first_ids + during_ids
    async with client_app(system) as client:
        started = time.monotonic()
        await client.submit(first)
        outage = await _take_down(system, client, first_ids, during, options.outage_for)
        run = await _finish(system, options, client, ids, started)
    ledger = FaultLedger.read(ledger_file(system.store))
    refused = ledger.by_op(503, retried=False)
    last_final = max(client.terminal_at.values(), default=None)
    dead = await asyncio.to_thread(_dead_letters, system.config.bus_connection)
    failed = [o for o in ids if run.states.state_of.get(o) not in (None, *UNFINISHED, ProcessState.PROCESSED.value)]
    latency = sorted(
        client.terminal_at[o] - client.sent_at[o] for o in first_ids if o in client.terminal_at and o in client.sent_at
    )
    checks = {
        "the outage caught orders in flight": outage.in_flight > 0,
        "operations were refused during the outage": sum(refused.values()) > 0,
        "no order failed because of the outage": not failed,
        "orders in flight at the outage: every one Processed with `completed`": run.all_completed(first_ids),
        "orders submitted during the outage: every one Processed with `completed`": run.all_completed(during_ids),
    }
    figures = {
        "outage_s": round(outage.ended - outage.started, 2),
        "in_flight_at_outage": outage.in_flight,
        "states_at_outage": outage.states_at_start,
        "submitted_during_outage": len(during_ids),
        "operations_refused": sum(refused.values()),
        "operations_refused_by_op": refused,
        "unavailable_answers": ledger.count(503),
        "time_to_drain_s": None if last_final is None else round(max(0.0, last_final - outage.ended), 2),
        "first_orders_latency_s": {"p50": round(latency[len(latency) // 2], 2), "max": round(latency[-1], 2)}
        if latency
        else {},
        "failed": failed[:10],
        "dead_letters": dict(Counter(f"{q}: {reason}" for q, reason in dead)),
    }
    return run.verdict(checks, figures), ids


# --- running ----------------------------------------------------------------------------------------------------

DRILL_FUNCTIONS: dict[str, Callable[[FaultySystem, StoreDrillOptions], Awaitable[tuple[Verdict, list[str]]]]] = {
    "state-store-conflicts": drill_conflicts,
    "store-outage": drill_outage,
}


async def run_store_drill(system: FaultySystem, options: StoreDrillOptions) -> Verdict:
    """The drill on a started `system`, then the invariants every drill checks (lab/invariants.py) over its
    orders; the caller stops the system. The transition audit goes in before the first order."""
    install_for(system)
    verdict, order_ids = await DRILL_FUNCTIONS[options.drill](system, options)
    findings = await check_system(system, order_ids)
    return verdict.with_invariants(findings)


def run_command(args: argparse.Namespace) -> int:
    try:
        options = StoreDrillOptions(
            drill=args.scenario,
            **drill_arguments(args),
            outage_for=args.outage_for,
            latency_ms=args.latency_ms,
        )
    except ValueError as exc:
        return usage_error(exc)
    work = Path(args.work_dir or default_work_dir("drill-"))
    system = FaultySystem(store_config(work, options, args.servicebus_config), options)
    return run_verdict_drill(args, system, lambda _: run_store_drill(system, options))


__all__ = ["STORE_DRILLS", "FaultySystem", "StoreDrillOptions", "run_command", "run_store_drill"]
