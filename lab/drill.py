"""`python -m lab drill NAME` (alias `python -m devhost drill`): drills on the whole local system in real processes
(devhost, the Agent, the remote-service simulator and a client app, as the demo runs them).

Here: the crash drills `host-crash` and `agent-crash` (SIGKILL devhost or the Agent at seeded gaps, restart it, wait
for every terminal status); `run_drill_command` dispatches the others (lab/resilience_drills.py,
lab/lifecycle_drills.py and the drill modules), all with the same `Verdict`. Contract: the exit code is non-zero
unless every order is Processed, with none lost and no duplicate or missing side effect. `--settings local` uses
`lab.system.LOCAL_DEFAULTS`, `--settings sample` `local.settings.sample.json`. Figures and gaps: docs/modules-lab.md.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from devhost.timing_option import TIMINGS, add_timing_argument
from orderflow.messages import STEPS

from .demo import (
    ClientApp,
    client_app,
    default_work_dir,
    make_orders,
    read_effects,
    read_states,
    summary_table,
    wait_terminal,
)
from .drill_common import (
    DEFAULT_ORDERS,
    DRILLS,
    LIFECYCLE_DRILLS,
    MODULE_DRILLS,
    SETTINGS_CHOICES,
    TARGETS,
    base_settings,
    parse_overrides,
    report,
    run_on_system,
    run_verdict_drill,
    usage_error,
)
from .invariants import check_system, install_for
from .lifecycle_drills import run_lifecycle_command
from .profile_drills import wait_holding
from .resilience_drills import ResilienceOptions, resilience_config, run_resilience_drill
from .system import LocalSystem, Process, SystemConfig, with_bus_config

DEFAULT_KILLS = {"host-crash": 10, "agent-crash": 5}
# With --timing azure-storage each host loss idles the task hub until the dead host's leases run out (up to 70 s), so
# host-crash kills twice, each time once the restarted host holds the partitions again: about three minutes.
PROFILE_KILLS = 2
# The drills that take --timing azure-storage (the others run the local timing only), and the one that runs it
# by default. With it, --settings defaults to sample: the deployed app settings, not the lab's short ones.
TIMED_DRILLS = ("host-crash", "agent-crash", "idle-then-burst")
PROFILE_DRILLS = ("idle-then-burst",)


def add_command(sub: Any) -> None:
    d = sub.add_parser(
        "drill",
        help="drills on the local system: crashes (kill -9 devhost or the Agent), the retry "
        "budget, a remote outage, a backlog flood, compensation, cancels in flight, "
        "poison in a session, an upgrade in flight",
        description="Start devhost, the Agent, the remote-service simulator and a client app, submit "
        "orders and run the drill: host-crash / agent-crash kill devhost / the Agent with "
        "SIGKILL at seeded random gaps and restart it (the remote never fails); "
        "retry-budget makes every remote call fail (breaker off) and counts the calls per "
        "order step against RemoteCallBudgetPerStep; remote-outage takes the remote down "
        "for a while (the circuit breaker must keep every order out of Error); "
        "backlog-flood submits far more orders than MaxPendingOrders at once (admission "
        "control); compensation, cancel-in-flight, poison-in-session and "
        "upgrade-in-flight (lab/lifecycle_drills.py) drive an order's other endings: "
        "undoing a refused order, a client's cancel at each stage, a poison message in "
        "the order's session, devhost restarted with a new workflow version while orders "
        "run; remote-hang, late-replies, reply-reordering, clock-skew, "
        "duplicate-delivery, poison-input, state-store-conflicts, store-outage, "
        "starter-race and supervisor-race (issue 15; docs/devhost.md, docs/reliability.md) "
        "each inject their fault; durable-api-outage makes the Durable HTTP API answer 503 "
        "while attempts expire; bus-outage makes Service Bus busy, then time out, for devhost "
        "and the Agent; scale-out runs three devhost hosts on one task hub and "
        "kills them in turn; idle-then-burst submits orders after a quiet spell longer than "
        "the Durable queue polling ceiling (--timing azure-storage); tenant-isolation runs two submitting apps, "
        "one of them hostile (lab/tenant_drills.py); retention runs retentions of seconds (finished orders expire, "
        "their instances are purged, unfinished and kept ones stay) and forces each alarm "
        "(lab/retention_drills.py). Every drill also checks the invariants of "
        "lab/invariants.py. When every order has its final status, print the figures "
        "(a table, or "
        "one JSON object as the last line with --json). Exit code 1 unless the drill "
        "passed.",
    )
    d.add_argument("scenario", choices=DRILLS, metavar="NAME", help=f"the drill: {', '.join(DRILLS)}")
    d.add_argument(
        "--orders",
        type=int,
        default=None,
        help="number of orders to submit (default 100; retry-budget 20, backlog-flood 300, compensation "
        "8; upgrade-in-flight: 8 before the restart and half as many after; cancel-in-flight and "
        "poison-in-session run a fixed set; remote-hang, late-replies, reply-reordering 12, "
        "clock-skew 10; starter-race 60, supervisor-race 12; scale-out 200; durable-api-outage 8; bus-outage 12 "
        "and half as many as the outage begins; idle-then-burst 30 after 4 before the quiet spell; "
        "tenant-isolation 40 of app's, after as many alone; retention 12 that finish, besides one kept and two "
        "held unfinished)",
    )
    d.add_argument(
        "--kills",
        type=int,
        default=None,
        help="crash drills: kills to do (default 10 for host-crash and scale-out, 5 for agent-crash; "
        f"{PROFILE_KILLS} with --timing azure-storage)",
    )
    d.add_argument(
        "--min-gap",
        type=float,
        default=1.0,
        help="crash drills: shortest gap in seconds before a kill, from when the process is up (with --timing "
        "azure-storage: from when the restarted devhost holds the partitions again) (default 1)",
    )
    d.add_argument("--max-gap", type=float, default=4.0, help="crash drills: longest such gap in seconds (default 4)")
    d.add_argument(
        "--outage-after",
        type=float,
        default=2.0,
        help="remote-outage: seconds from the submission to the outage (default 2)",
    )
    d.add_argument(
        "--outage-for",
        type=float,
        default=15.0,
        help="remote-outage: seconds the remote stays down; store-outage: the state store; "
        "durable-api-outage: the Durable HTTP API's start and status routes; bus-outage: Service Bus, split "
        "between its kinds (default 15)",
    )
    d.add_argument(
        "--seed", type=int, default=1, help="seed of the gaps, the orders and the Agent's jitter (default 1)"
    )
    d.add_argument(
        "--settings",
        choices=SETTINGS_CHOICES,
        default=None,
        metavar="SETTINGS",
        help="local: lab/system.py LOCAL_DEFAULTS (the demo's), or sample: the values of "
        "local.settings.sample.json (the Azure defaults) (default local; sample with --timing "
        "azure-storage); a resilience drill's own settings go over these",
    )
    d.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SETTING",
        dest="overrides",
        help="NAME=VALUE: an app or Agent setting over the drill's (repeatable), e.g. --set "
        "CircuitBreakerFailureThreshold=0",
    )
    d.add_argument(
        "--servicebus-config",
        type=Path,
        default=None,
        help="queue definitions for the embedded broker (default: the repo's servicebus.config.json)",
    )
    d.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        help="give up waiting for final statuses after this many seconds (default 900)",
    )
    d.add_argument(
        "--work-dir", type=Path, default=None, help="state folder (default: a fresh .demo/drill-<timestamp>)"
    )
    d.add_argument(
        "--hang-seconds",
        type=float,
        default=8.0,
        help="cancel-in-flight, poison-in-session, remote-hang: how long a scripted hang holds the "
        "remote's answer (default 8)",
    )
    d.add_argument(
        "--latency-ms",
        type=float,
        default=800.0,
        help="upgrade-in-flight, store-outage, bus-outage: the simulator's mean latency per call, so orders "
        "are in flight at the restart or the outage (default 800)",
    )
    d.add_argument(
        "--restart",
        choices=("kill", "stop"),
        default="kill",
        help="upgrade-in-flight: how devhost goes before it restarts with the new version: kill (-9, "
        "default) or stop (SIGTERM)",
    )
    d.add_argument(
        "--from-version",
        choices=("1.0", "2.0"),
        default="1.0",
        help="upgrade-in-flight: the workflow version devhost runs before the restart (default 1.0)",
    )
    add_timing_argument(
        d,
        default=None,
        note=f"(default local; {', '.join(PROFILE_DRILLS)}: azure-storage; taken by {', '.join(TIMED_DRILLS)})",
    )
    d.add_argument("--json", action="store_true", help="print one JSON object with the figures as the last line")


@dataclass(frozen=True)
class DrillOptions:
    scenario: str  # host-crash | agent-crash
    orders: int = 100
    kills: int | None = None  # None: DEFAULT_KILLS[scenario]
    min_gap: float = 1.0
    max_gap: float = 4.0
    seed: int = 1
    settings: str = "local"
    timeout: float = 900.0
    overrides: tuple[tuple[str, str], ...] = ()  # --set NAME=VALUE, over the chosen settings
    # The simulator's mean latency per remote call: keeps a burst in flight across the kills on a fast system.
    latency_ms: float | None = None  # None: the system's default
    timing: str = "local"  # the Durable engine's: local or azure-storage (devhost/durable/timing.py)

    def __post_init__(self) -> None:
        if self.scenario not in TARGETS:
            raise ValueError(f"scenario must be one of {sorted(TARGETS)}")
        if self.settings not in SETTINGS_CHOICES:
            raise ValueError(f"settings must be one of {SETTINGS_CHOICES}")
        if not 0 <= self.min_gap <= self.max_gap:
            raise ValueError("need 0 <= min_gap <= max_gap")
        if self.orders < 1 or (self.kills is not None and self.kills < 0):
            raise ValueError("need at least one order and no negative kill count")
        if self.timing not in TIMINGS:
            raise ValueError(f"timing must be one of {TIMINGS}")

    @property
    def kill_count(self) -> int:
        if self.kills is not None:
            return self.kills
        return PROFILE_KILLS if self.timing == "azure-storage" else DEFAULT_KILLS[self.scenario]

    def gaps(self) -> list[float]:
        """The seeded gaps before each kill (the same for the same seed, whatever the timing)."""
        rng = random.Random(f"drill:{self.scenario}:{self.seed}")
        return [round(rng.uniform(self.min_gap, self.max_gap), 3) for _ in range(self.kill_count)]

    def order_ids(self, reply_queue: str = "app-status") -> list[str]:
        return [o.order_id for o in make_orders(self.orders, self.seed, reply_queue, prefix="drill")]


def drill_config(work_dir: Path, options: DrillOptions, servicebus_config: Path | None = None) -> SystemConfig:
    """The drill's system: no injected fault (the remote never fails), the chosen settings."""
    config = SystemConfig(
        work_dir=work_dir.resolve(),
        seed=options.seed,
        transient_failure_rate=0.0,
        permanent_failure_rate=0.0,
        hang_rate=0.0,
        settings={**base_settings(options.settings), **dict(options.overrides)},
        timing=options.timing,
    )
    if options.latency_ms is not None:
        config.latency_ms_mean = options.latency_ms
    return with_bus_config(config, servicebus_config)


@dataclass
class DrillResult:
    summary: dict[str, Any]
    order_ids: list[str]

    @property
    def ok(self) -> bool:
        s = self.summary
        return (
            s["processed"] == s["submitted"]
            and s["error"] == 0
            and s["lost"] == 0
            and s["duplicate_side_effects"] == 0
            and s["missing_side_effects"] == 0
            and all(s.get("checks", {}).values())
        )


def _target(system: LocalSystem, scenario: str) -> Process:
    process = system.devhost if scenario == "host-crash" else system.agent
    assert process is not None, "the system is not started"
    return process


@dataclass(frozen=True)
class Kill:
    at: float  # monotonic time of the SIGKILL
    in_flight: int  # orders without a terminal status at that moment
    takeover_s: float | None = None  # azure-storage timing: kill -> the restarted devhost holds the partitions


async def _kill_loop(system: LocalSystem, options: DrillOptions, client: ClientApp, total: int) -> list[Kill]:
    """Kill the target with SIGKILL after each gap and restart it; stop early once every order is terminal."""
    restart = system.start_devhost if options.scenario == "host-crash" else system.start_agent
    leases = options.timing == "azure-storage" and options.scenario == "host-crash"
    kills: list[Kill] = []
    for gap in options.gaps():
        if leases:  # a kill must cost the leases of a host that holds them: wait until this one took them over
            await wait_holding(system, options.timeout)
            if kills:
                kills[-1] = replace(kills[-1], takeover_s=round(time.monotonic() - kills[-1].at, 1))
        try:  # the gap is the scenario; the event ends it early when there is nothing left to crash
            await asyncio.wait_for(client.all_terminal.wait(), gap)
            break
        except TimeoutError:
            pass
        _target(system, options.scenario).kill()
        kills.append(Kill(time.monotonic(), total - len(client.terminal_at)))
        await asyncio.to_thread(restart)  # blocks until devhost prints its URL again
    if leases and kills and kills[-1].takeover_s is None:
        await wait_holding(system, options.timeout)
        kills[-1] = replace(kills[-1], takeover_s=round(time.monotonic() - kills[-1].at, 1))
    return kills


async def run_drill(
    system: LocalSystem, options: DrillOptions, console: Console | None = None, transient: bool = True
) -> DrillResult:
    """The drill on a started `system` (its simulator must inject no fault); the caller stops the system."""
    console = console or Console(quiet=True)
    install_for(system)
    orders = make_orders(options.orders, options.seed, system.config.reply_queue, prefix="drill")
    order_ids = [o.order_id for o in orders]
    async with client_app(system) as client:
        started = time.monotonic()
        await client.submit(orders)
        killer = asyncio.create_task(_kill_loop(system, options, client, len(orders)))
        waiter = asyncio.create_task(wait_terminal(client, len(orders), started, options.timeout, console, transient))
        try:
            # A restart that fails (the killed process does not come back) ends the drill at once.
            await asyncio.wait({killer, waiter}, return_when=asyncio.FIRST_EXCEPTION)
            if killer.done() and killer.exception() is not None:
                raise killer.exception()  # type: ignore[misc]
            await waiter
            kills = await killer  # after a timeout the kill loop still finishes its gaps
        finally:
            for task in (killer, waiter):
                task.cancel()
        ended = time.monotonic()
        effects = await read_effects(system)
    states = await read_states(system.env(), order_ids)
    findings = await check_system(system, order_ids)
    attempts = Counter(states.attempts.values())
    last_terminal = max(client.terminal_at.values(), default=None)
    settle = None if not kills or last_terminal is None else max(0.0, last_terminal - kills[-1].at)
    applied = {(e["orderId"], e["step"]) for e in effects.get("effects", []) if e["applied"] >= 1}
    processed = [o for o in order_ids if states.state_of.get(o) == "Processed"]
    missing_effects = sum(1 for o in processed for step in STEPS if (o, step.value) not in applied)
    counts = states.counts
    # An order loses at most one attempt to each host loss while it runs (a kill before its final status).
    over = [
        o
        for o in order_ids
        if states.attempts.get(o, 1) - 1 > sum(1 for k in kills if k.at < client.terminal_at.get(o, float("inf")))
    ]
    summary: dict[str, Any] = {
        "scenario": options.scenario,
        "settings": options.settings,
        "submitted": len(orders),
        "processed": counts.get("Processed", 0),
        "error": counts.get("Error", 0),
        "pending": counts.get("Pending", 0),
        "processing": counts.get("Processing", 0),
        "lost": client.lost(order_ids, states.missing),
        "error_reasons": dict(states.error_reasons.most_common()),
        "duplicate_side_effects": int(effects.get("duplicates", -1)),
        "missing_side_effects": missing_effects,
        "attempts": {str(a): n for a, n in sorted(attempts.items())},
        "max_attempt": max(attempts, default=0),
        "kills_requested": options.kill_count,
        "kills_done": len(kills),
        "kills_at_s": [round(k.at - started, 1) for k in kills],
        "in_flight_at_kills": [k.in_flight for k in kills],
        "settle_s": None if settle is None else round(settle, 1),
        "total_s": round((last_terminal or ended) - started, 1),
        "timing": options.timing,
        "takeover_s": [k.takeover_s for k in kills if k.takeover_s is not None],
        "work_dir": str(system.config.work_dir),
        "checks": {**findings.checks, "at most one attempt lost per kill": not over},
        **findings.figures,
    }
    return DrillResult(summary, order_ids)


def _display(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary with its lists and the attempts histogram spelled out for the table."""
    shown = dict(summary)
    shown["attempts"] = ", ".join(f"{n} order{'s' * (n != 1)} in {a}" for a, n in summary["attempts"].items())
    for key in ("kills_at_s", "in_flight_at_kills", "takeover_s"):
        shown[key] = " ".join(str(v) for v in summary[key]) or "-"
    return shown


def resolve_timing(args: argparse.Namespace) -> None:
    """Fill in `--timing` and `--settings` when not given (see TIMED_DRILLS); ValueError for a drill that runs the
    local timing only."""
    if args.timing is None:
        args.timing = "azure-storage" if args.scenario in PROFILE_DRILLS else "local"
    if args.timing != "local" and args.scenario not in TIMED_DRILLS:
        raise ValueError(f"--timing {args.timing} is for {', '.join(TIMED_DRILLS)}, not {args.scenario}")
    if args.settings is None:
        args.settings = "sample" if args.timing == "azure-storage" else "local"


def run_drill_command(args: argparse.Namespace) -> int:
    try:
        resolve_timing(args)
    except ValueError as exc:
        return usage_error(exc)
    if args.scenario in MODULE_DRILLS:
        module, function = MODULE_DRILLS[args.scenario].split(":")
        run: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), function)
        return run(args)
    if args.scenario in LIFECYCLE_DRILLS:
        return run_lifecycle_command(args)
    orders = DEFAULT_ORDERS[args.scenario] if args.orders is None else args.orders
    try:
        overrides = parse_overrides(args.overrides)
        if args.scenario in TARGETS:
            crash = DrillOptions(
                scenario=args.scenario,
                orders=orders,
                kills=args.kills,
                min_gap=args.min_gap,
                max_gap=args.max_gap,
                seed=args.seed,
                settings=args.settings,
                timeout=args.timeout,
                overrides=overrides,
                timing=args.timing,
            )
        else:
            resilience = ResilienceOptions(
                drill=args.scenario,
                orders=orders,
                seed=args.seed,
                settings=args.settings,
                overrides=overrides,
                outage_after=args.outage_after,
                outage_for=args.outage_for,
                timeout=args.timeout,
            )
    except ValueError as exc:
        return usage_error(exc)
    work = Path(args.work_dir or default_work_dir("drill-"))
    if args.scenario in TARGETS:
        console = Console(stderr=args.json)
        title = f"drill {args.scenario} ({args.settings} settings, {args.timing} timing)"
        system = LocalSystem(drill_config(work, crash, args.servicebus_config))
        result = run_on_system(system, console, lambda: run_drill(system, crash, console, transient=args.json))
        return report(
            console,
            summary_table(_display(result.summary), title),
            result.summary if args.json else None,
            []
            if result.ok
            else ["every order must end Processed, with none lost and no duplicate or missing side effect"],
        )
    system = LocalSystem(resilience_config(work, resilience, args.servicebus_config))
    return run_verdict_drill(
        args, system, lambda console: run_resilience_drill(system, resilience, console, transient=args.json)
    )
