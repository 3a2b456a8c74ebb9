"""The bus drill, `python -m devhost drill bus-outage`: Service Bus busy, then timing out, for a while, during
submissions and replies, through the embedded broker's fault switch (`BusFaults`, orderflow/embedded/broker/).

Contract: only the system under test (devhost, the Agent) sees the faults (endpoint options
`embedded://PATH?outageFile=..&timeoutMs=..&seed=..`); the client app and the drill's reads use the plain broker.
Every injected answer is a line of `<broker>.faults.jsonl`. Afterwards every order is Processed once with `completed`,
none lost, stuck or dead-lettered. `--set outageKinds=server-busy,timeout,drop` the phases; `serverBusyRate=R`,
`timeoutRate=R`, `dropRate=R`, `timeoutMs=MS` faults for a share of operations all along. Details: docs/modules-lab.md.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orderflow.embedded.broker import BusFaults
from orderflow.embedded.broker._bus_faults import FAULT_KINDS
from orderflow.messages import SubmitOrder

from .demo import ClientApp, client_app, default_work_dir, make_orders
from .drill_common import SETTINGS_CHOICES, Verdict, base_settings, drill_arguments, run_verdict_drill, usage_error
from .invariants import _dead_letters, check_system, install_for
from .lifecycle_lab import until
from .store_drills import IN_FLIGHT_WAIT_S, UNFINISHED, FaultLedger, _finish, _in_flight
from .system import LocalSystem, Process, SystemConfig, with_bus_config

DRILL = "bus-outage"
DEFAULT_ORDERS = 12  # and half as many submitted as the outage begins
FAULT_OPTIONS = ("serverBusyRate", "timeoutRate", "dropRate", "timeoutMs")
DEFAULT_KINDS = ("server-busy", "timeout")
# A timed-out operation answers after 1 s here (Azure: the service's operation timeout, up to a minute), so that an
# operation's four attempts take 15 s at most, as the SDK's backoffs (1.6 + 3.2 + 6.4 s) take 11.2 s.
DEFAULT_TIMEOUT_MS = "1000"
# Over the chosen base: the Starter every second (an order whose fast-path start failed is claimed again at once),
# 8 s claim leases so that an attempt the outage broke expires soon after the bus is back; steps of 30 s, longer than
# one bus operation's retries with a timeout at each attempt (4 x 1 s + 11.2 s) plus the crash budget's locks.
BUS_SETTINGS = {"StarterSchedule": "*/1 * * * * *", "ClaimLeaseSeconds": "8", "StepTimeoutSeconds": "30"}


@dataclass(frozen=True)
class BusDrillOptions:
    drill: str = DRILL
    orders: int | None = None
    seed: int = 1
    settings: str = "local"
    overrides: tuple[tuple[str, str], ...] = ()  # --set NAME=VALUE: fault options, outageKinds and app settings
    outage_for: float = 15.0  # seconds the bus stays down, split evenly between the kinds
    latency_ms: float = 800.0  # the simulator's mean latency per call (orders in flight at the outage)
    timeout: float = 900.0

    def __post_init__(self) -> None:
        if self.drill != DRILL:
            raise ValueError(f"drill must be {DRILL}")
        if self.settings not in SETTINGS_CHOICES:
            raise ValueError(f"settings must be one of {SETTINGS_CHOICES}")
        if self.order_count < 1 or self.outage_for <= 0 or self.latency_ms < 0:
            raise ValueError("need at least one order, outage_for > 0 and latency_ms >= 0")
        unknown = [k for k in self.kinds if k not in FAULT_KINDS]
        if not self.kinds or unknown:
            raise ValueError(f"outageKinds must name some of {', '.join(FAULT_KINDS)}, got {unknown or 'none'}")
        BusFaults.parse(self.query(Path("servicebus.db")), Path("servicebus.db"))  # ValueError on a bad option

    @property
    def order_count(self) -> int:
        return DEFAULT_ORDERS if self.orders is None else self.orders

    @property
    def kinds(self) -> tuple[str, ...]:
        given = dict(self.overrides).get("outageKinds")
        return DEFAULT_KINDS if given is None else tuple(k.strip() for k in given.split(",") if k.strip())

    def fault_options(self) -> dict[str, str]:
        given = {k: v for k, v in self.overrides if k in FAULT_OPTIONS}
        return {"timeoutMs": DEFAULT_TIMEOUT_MS, **given}

    def query(self, broker: Path) -> str:
        """The endpoint options the system under test runs with."""
        options = {**self.fault_options(), "seed": str(self.seed), "outageFile": str(outage_file(broker))}
        return "&".join(f"{k}={v}" for k, v in options.items())

    def settings_values(self) -> dict[str, str]:
        skip = (*FAULT_OPTIONS, "outageKinds")
        return {**base_settings(self.settings), **BUS_SETTINGS, **{k: v for k, v in self.overrides if k not in skip}}


def outage_file(broker: Path) -> Path:
    return broker.with_name(broker.name + ".down")


def ledger_file(broker: Path) -> Path:
    return broker.with_name(broker.name + ".faults.jsonl")


class FaultyBusSystem(LocalSystem):
    """The local system whose processes (devhost, the Agent) reach the broker through the faulty endpoint; the
    client app and `config.bus_connection` (what the drill reads with) keep the plain one."""

    def __init__(self, config: SystemConfig, options: BusDrillOptions) -> None:
        super().__init__(config)
        self.broker = config.work_dir / "servicebus.db"
        self.connection = config.bus_connection.replace(
            f"embedded://{self.broker};", f"embedded://{self.broker}?{options.query(self.broker)};"
        )

    def _process(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        process = super()._process(name, argv, env)
        if name != "simulator":
            process.env["ServiceBusConnection"] = self.connection
        return process


@dataclass(frozen=True)
class Outage:
    started: float  # monotonic
    ended: float
    in_flight: int  # orders without a final status when the bus went down
    phases: tuple[tuple[str, float], ...]  # (kind, seconds)


async def _take_down(
    system: FaultyBusSystem, client: ClientApp, first: list[str], during: list[SubmitOrder], options: BusDrillOptions
) -> Outage:
    """Once a quarter of the first orders are mid-way, submit `during` and take the bus down at once, so that the
    outage meets submissions being handled and replies on their way; each kind in turn, then the bus comes back."""
    await until(lambda: _in_flight(system, first, max(1, len(first) // 4)), IN_FLIGHT_WAIT_S)
    switch = outage_file(system.broker)
    await client.submit(during)
    switch.write_text(options.kinds[0])
    started = time.monotonic()
    in_flight = sum(1 for o in first if o not in client.terminal_at)
    phases: list[tuple[str, float]] = []
    try:
        for index, kind in enumerate(options.kinds):
            switch.write_text(kind)
            begun = time.monotonic()
            until_end = started + options.outage_for * (index + 1) / len(options.kinds)
            await asyncio.sleep(max(0.0, until_end - begun))  # the phase's length: the scenario
            phases.append((kind, round(time.monotonic() - begun, 2)))
    finally:
        switch.unlink(missing_ok=True)
    return Outage(started, time.monotonic(), in_flight, tuple(phases))


def injected_figures(ledger: FaultLedger) -> dict[str, Any]:
    """The ledger's figures: answers injected per kind and operation, how many the clients retried (the SDK's
    retries) and how many reached a caller (the product's to handle)."""
    kinds = sorted({str(e["fault"]) for e in ledger.entries})
    return {
        "injected": len(ledger.entries),
        "injected_by_kind": {k: ledger.count(k) for k in kinds},
        "sdk_retries_by_kind": {k: ledger.count(k, retried=True) for k in kinds},
        "reaching_callers_by_kind": {k: ledger.count(k, retried=False) for k in kinds},
        "reaching_callers_by_op": dict(Counter(str(e["op"]) for e in ledger.entries if e["retried"] is False)),
    }


async def drill_bus_outage(system: FaultyBusSystem, options: BusDrillOptions) -> tuple[Verdict, list[str]]:
    n = options.order_count
    first = make_orders(n, options.seed, system.config.reply_queue, prefix="bus-outage")
    during = make_orders(max(1, n // 2), options.seed, system.config.reply_queue, prefix="bus-outage-during")
    first_ids, during_ids = [o.order_id for o in first], [o.order_id for o in during]
    ids = first_ids + during_ids
    async with client_app(system) as client:
        started = time.monotonic()
        await client.submit(first)
        outage = await _take_down(system, client, first_ids, during, options)
        run = await _finish(system, options, client, ids, started)
    ledger = FaultLedger.read(ledger_file(system.broker), field="fault")
    dead = await asyncio.to_thread(_dead_letters, system.config.bus_connection)
    last_final = max(client.terminal_at.values(), default=None)
    failed = [o for o in ids if run.states.state_of.get(o) not in (None, *UNFINISHED, "Processed")]
    injected = injected_figures(ledger)
    checks = {
        "the outage caught orders in flight": outage.in_flight > 0,
        "every outage kind was injected": all(injected["injected_by_kind"].get(k, 0) > 0 for k in options.kinds),
        "sends or settlements met faults past the SDK's retries": any(
            op != "receive" for op in injected["reaching_callers_by_op"]
        ),
        "no message dead-lettered": not dead,
        "no order failed because of the outage": not failed,
        "orders in flight at the outage: every one Processed with `completed`": run.all_completed(first_ids),
        "orders submitted as it began: every one Processed with `completed`": run.all_completed(during_ids),
    }
    figures = {
        "outage_s": round(outage.ended - outage.started, 2),
        "phases_s": dict(outage.phases),
        "fault_options": options.fault_options(),
        "in_flight_at_outage": outage.in_flight,
        "submitted_as_it_began": len(during_ids),
        **injected,
        "time_to_drain_s": None if last_final is None else round(max(0.0, last_final - outage.ended), 2),
        "failed": failed[:10],
        "dead_letters": dict(Counter(f"{q}: {reason}" for q, reason in dead)),
    }
    return run.verdict(checks, figures), ids


async def run_bus_drill(system: FaultyBusSystem, options: BusDrillOptions) -> Verdict:
    """The drill on a started `system`, then the invariants every drill checks (lab/invariants.py) over its
    orders; the caller stops the system. The transition audit goes in before the first order."""
    install_for(system)
    verdict, order_ids = await drill_bus_outage(system, options)
    return verdict.with_invariants(await check_system(system, order_ids))


def bus_config(work_dir: Path, options: BusDrillOptions, servicebus_config: Path | None = None) -> SystemConfig:
    """As store-outage's system: a remote that never fails by itself and answers slowly (orders in flight)."""
    config = SystemConfig(work_dir.resolve(), options.seed, settings=options.settings_values())
    config.latency_ms_mean = options.latency_ms
    return with_bus_config(config, servicebus_config)


def run_command(args: argparse.Namespace) -> int:
    try:
        options = BusDrillOptions(
            **drill_arguments(args),
            outage_for=args.outage_for,
            latency_ms=args.latency_ms,
        )
    except ValueError as exc:
        return usage_error(exc)
    work = Path(args.work_dir or default_work_dir("drill-"))
    system = FaultyBusSystem(bus_config(work, options, args.servicebus_config), options)
    return run_verdict_drill(args, system, lambda _: run_bus_drill(system, options))


__all__ = ["DRILL", "BusDrillOptions", "FaultyBusSystem", "run_bus_drill", "run_command"]
