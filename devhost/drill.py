"""`python -m devhost drill NAME`: drills on the whole local system in real processes (devhost, the Agent, the
remote-service simulator and a client app, as the demo runs them).

Crash drills, `host-crash` and `agent-crash` (issue 8):

The drill starts devhost, the Agent and the remote-service simulator (`LocalSystem`, as the demo does), with a
simulator that injects no fault (the remote never fails), submits the orders through the demo's client app, and
while they are in flight kills one process with SIGKILL (`host-crash`: devhost; `agent-crash`: the Agent) at seeded
random gaps and restarts it each time. Then it waits until every order has its terminal status and prints:

- submitted, processed, error, pending, processing (the state store), lost (no state record or no terminal status);
- duplicate side effects (the simulator's ledger: effects beyond one per order and step) and missing side effects
  (a step of a Processed order without its effect);
- attempts per order (the state record's `attempt`: histogram and max);
- settle time: from the last kill to the last terminal status; total time; kills done.

A gap runs from the moment the previous process is up again (devhost printed its URL; the Agent was started), so
every kill hits a running process; kills stop early when every order is terminal (`kills_done` says how many ran).
`--settings local` runs with `devhost.system.LOCAL_DEFAULTS` (the demo's), `--settings sample` with the values of
`local.settings.sample.json` (the Azure defaults of `orderflow/settings.py`; the Agent with its own defaults). The
exit code is non-zero unless every order is Processed, with none lost and no duplicate or missing side effect.

Resilience drills, `retry-budget`, `remote-outage` and `backlog-flood` (issue 11: when a dependency fails). Each runs
with its own settings (`DRILL_SETTINGS`, over `--settings`, under `--set NAME=VALUE`), samples the system every
200 ms while the orders run (`Monitor`: Processing and Pending counts from the state store, the circuit breaker's
document, the RSS of devhost and the Agent), and ends with a `Verdict`: `{drill, passed, orders, lost,
duplicate_side_effects, stuck, checks, figures}`, the last line of `--json`; `passed` iff every check holds.
- `retry-budget`: every remote call fails transiently (simulator transient_failure_rate 1), the breaker is off. Every
  order must end failed (its sent step compensated at FailureThreshold; the drill lets compensations through) with
  its reason and status, none stuck, and the calls per order step (the simulator's `callsByKey`) must stay within
  `RemoteCallBudgetPerStep` (orderflow/retry_budget.py).
- `remote-outage`: the remote is healthy, goes down (every call 503, `POST /outage`) `--outage-after` seconds after the
  submission for `--outage-for` seconds, then recovers. No order may reach Error, every order must be Processed once,
  and the calls that reached the remote while the breaker was not closed must be at most its probes per half-open
  round (the breaker's document, polled, against the simulator's call log; a call arriving within
  orderflow.breaker.CACHE_TTL of the opening was granted before it).
- `backlog-flood`: far more orders at once than `MaxPendingOrders`, with a small `MaxOrdersInProcessing`. Every order
  gets one answer: `rejected` (`backlog full`, no state record and no orders-DB record) or admitted and Processed in
  attempt 1; the sampled Processing count stays within MaxOrdersInProcessing and the Pending count within
  MaxPendingOrders; peak RSS of devhost and of the Agent is reported.

Lifecycle drills, `compensation`, `cancel-in-flight`, `poison-in-session` and `upgrade-in-flight` (issue 12): in
devhost/lifecycle_drills.py (dispatched from `run_drill_command`), with the same `Verdict`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import random
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil
from rich.console import Console

from agent.config import AGENT_SETTINGS
from orderflow import settings as app_settings
from orderflow.breaker import CACHE_TTL, BreakerDoc, BreakerState
from orderflow.messages import COMPENSATION_OF, STEPS, OrderStatus, idempotency_key
from orderflow.records import ProcessState
from orderflow.retry_budget import RetryBudget
from orderflow.settings import SETTING_NAMES, SETTINGS

from .demo import (
    FAILED_STATES,
    ClientApp,
    StateSummary,
    client_app,
    default_work_dir,
    make_orders,
    read_effects,
    read_states,
    simulator_json,
    summary_table,
    wait_terminal,
)
from .invariants import Findings, check_system, install_for
from .system import LOCAL_DEFAULTS, ROOT, LocalSystem, Process, SystemConfig

R = TypeVar("R")

TARGETS = {"host-crash": "devhost", "agent-crash": "agent"}
DEFAULT_KILLS = {"host-crash": 10, "agent-crash": 5}
RESILIENCE_DRILLS = ("retry-budget", "remote-outage", "backlog-flood")
# The lifecycle drills (issue 12: compensation, cancel, poison, upgrade) live in devhost/lifecycle_drills.py.
LIFECYCLE_DRILLS = ("compensation", "cancel-in-flight", "poison-in-session", "upgrade-in-flight")
# Drills in modules of their own (issue 15): name -> "module:function". The function takes the parsed `drill`
# arguments and returns the exit code; with --json the verdict (Verdict.to_json, invariants included) is the last line
# of stdout.
MODULE_DRILLS: dict[str, str] = {
    "remote-hang": "devhost.timing_drills:run_command",
    "late-replies": "devhost.timing_drills:run_command",
    "reply-reordering": "devhost.timing_drills:run_command",
    "clock-skew": "devhost.timing_drills:run_command",
    "duplicate-delivery": "devhost.input_drills:run_command",
    "poison-input": "devhost.input_drills:run_command",
    "state-store-conflicts": "devhost.store_drills:run_command",
    "store-outage": "devhost.store_drills:run_command",
    "starter-race": "devhost.race_drills:run_command",
    "supervisor-race": "devhost.race_drills:run_command",
    "scale-out": "devhost.scale_drills:run_command",
    "durable-api-outage": "devhost.durable_api_drills:run_command",
}
DRILLS = (*sorted(TARGETS), *RESILIENCE_DRILLS, *LIFECYCLE_DRILLS, *MODULE_DRILLS)
DEFAULT_ORDERS = {"host-crash": 100, "agent-crash": 100, "retry-budget": 20, "remote-outage": 100,
                  "backlog-flood": 300}
# Each resilience drill's settings, over the chosen base (LOCAL_DEFAULTS or the sample's) and under `--set`. The
# Starter runs every second so that a retried or deferred order is claimed again at once, and admission figures are
# refreshed each second. Step timeout, lease, backoffs and FailureThreshold stay those of the base: the crash budget
# (orderflow/session_locks.py) holds for them.
_EVERY_SECOND = "*/1 * * * * *"
DRILL_SETTINGS: dict[str, dict[str, str]] = {
    # The breaker off: the retry budget alone must bound the calls. Steps of 8 s (no crash here, so the crash budget
    # of orderflow/session_locks.py does not apply): the Agent's 5 calls per request (backoffs of about 3 s) still fit
    # in a step, so the product is the same as with 20 s steps, and FailureThreshold attempts take 24 s, not 60 s.
    "retry-budget": {"CircuitBreakerFailureThreshold": "0", "StarterSchedule": _EVERY_SECOND,
                     "StepTimeoutSeconds": "8", "ClaimLeaseSeconds": "8"},
    # A breaker that opens and recovers within seconds: 5 failed requests in 10 s open it, 3 s cool-down (doubled per
    # failed probe, at most 6 s), one probe per half-open round. Steps of 8 s, as for retry-budget (no crash here):
    # the orders caught at the Agent by the outage wait for their step's CompleteBy before the first probe.
    "remote-outage": {"CircuitBreakerFailureThreshold": "5", "CircuitBreakerWindowSeconds": "10",
                      "CircuitBreakerCooldownSeconds": "3", "CircuitBreakerMaxCooldownSeconds": "6",
                      "CircuitBreakerProbes": "1", "StarterSchedule": _EVERY_SECOND,
                      "StepTimeoutSeconds": "8", "ClaimLeaseSeconds": "8"},
    # Bounds far below the flood: 300 orders at once against 60 Pending and 20 Processing.
    "backlog-flood": {"MaxPendingOrders": "60", "MaxOrdersInProcessing": "20", "StarterSchedule": _EVERY_SECOND},
}
SAMPLE_EVERY_S = 0.2  # store counts and memory
BREAKER_EVERY_S = 0.05  # the breaker's document: one point read
SETTINGS_CHOICES = ("local", "sample")
SAMPLE_FILE = ROOT / "local.settings.sample.json"
# Values of the sample that name this machine's resources, not tunables: the drill's system sets its own.
_CONNECTIONS = frozenset({"ServiceBusConnection", "CosmosDb__accountEndpoint", "AllowedReplyQueues"})


def add_command(sub: Any) -> None:
    d = sub.add_parser("drill", help="drills on the local system: crashes (kill -9 devhost or the Agent), the retry "
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
                                   "upgrade-in-flight (devhost/lifecycle_drills.py) drive an order's other endings: "
                                   "undoing a refused order, a client's cancel at each stage, a poison message in "
                                   "the order's session, devhost restarted with a new workflow version while orders "
                                   "run; remote-hang, late-replies, reply-reordering, clock-skew, "
                                   "duplicate-delivery, poison-input, state-store-conflicts, store-outage, "
                                   "starter-race and supervisor-race (issue 15; docs/devhost.md, docs/reliability.md) "
                                   "each inject their fault; durable-api-outage makes the Durable HTTP API answer 503 "
                                   "while attempts expire; scale-out runs three devhost hosts on one task hub and "
                                   "kills them in turn. Every drill also checks the invariants of "
                                   "devhost/invariants.py. When every order has its final status, print the figures "
                                   "(a table, or "
                                   "one JSON object as the last line with --json). Exit code 1 unless the drill "
                                   "passed.")
    d.add_argument("scenario", choices=DRILLS, metavar="NAME", help=f"the drill: {', '.join(DRILLS)}")
    d.add_argument("--orders", type=int, default=None,
                   help="number of orders to submit (default 100; retry-budget 20, backlog-flood 300, compensation "
                        "8; upgrade-in-flight: 8 before the restart and half as many after; cancel-in-flight and "
                        "poison-in-session run a fixed set; remote-hang, late-replies, reply-reordering 12, "
                        "clock-skew 10; starter-race 60, supervisor-race 12; scale-out 200; durable-api-outage 8)")
    d.add_argument("--kills", type=int, default=None,
                   help="crash drills: kills to do (default 10 for host-crash and scale-out, 5 for agent-crash)")
    d.add_argument("--min-gap", type=float, default=1.0,
                   help="crash drills: shortest gap in seconds before a kill, from when the process is up "
                        "(default 1)")
    d.add_argument("--max-gap", type=float, default=4.0, help="crash drills: longest such gap in seconds (default 4)")
    d.add_argument("--outage-after", type=float, default=2.0,
                   help="remote-outage: seconds from the submission to the outage (default 2)")
    d.add_argument("--outage-for", type=float, default=15.0,
                   help="remote-outage: seconds the remote stays down; store-outage: the state store; "
                        "durable-api-outage: the Durable HTTP API's start and status routes (default 15)")
    d.add_argument("--seed", type=int, default=1, help="seed of the gaps, the orders and the Agent's jitter "
                                                       "(default 1)")
    d.add_argument("--settings", choices=SETTINGS_CHOICES, default="local", metavar="SETTINGS",
                   help="local: devhost/system.py LOCAL_DEFAULTS (the demo's), or sample: the values of "
                        "local.settings.sample.json (the Azure defaults) (default local); a resilience drill's "
                        "own settings go over these")
    d.add_argument("--set", action="append", default=[], metavar="SETTING", dest="overrides",
                   help="NAME=VALUE: an app or Agent setting over the drill's (repeatable), e.g. --set "
                        "CircuitBreakerFailureThreshold=0")
    d.add_argument("--servicebus-config", type=Path, default=None,
                   help="queue definitions for the embedded broker (default: the repo's servicebus.config.json)")
    d.add_argument("--timeout", type=float, default=900.0,
                   help="give up waiting for final statuses after this many seconds (default 900)")
    d.add_argument("--work-dir", type=Path, default=None,
                   help="state folder (default: a fresh .demo/drill-<timestamp>)")
    d.add_argument("--hang-seconds", type=float, default=8.0,
                   help="cancel-in-flight, poison-in-session, remote-hang: how long a scripted hang holds the "
                        "remote's answer (default 8)")
    d.add_argument("--latency-ms", type=float, default=800.0,
                   help="upgrade-in-flight: the simulator's mean latency per call, so orders are in flight at the "
                        "restart (default 800)")
    d.add_argument("--restart", choices=("kill", "stop"), default="kill",
                   help="upgrade-in-flight: how devhost goes before it restarts with the new version: kill (-9, "
                        "default) or stop (SIGTERM)")
    d.add_argument("--from-version", choices=("1.0", "2.0"), default="1.0",
                   help="upgrade-in-flight: the workflow version devhost runs before the restart (default 1.0)")
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

    def __post_init__(self) -> None:
        if self.scenario not in TARGETS:
            raise ValueError(f"scenario must be one of {sorted(TARGETS)}")
        if self.settings not in SETTINGS_CHOICES:
            raise ValueError(f"settings must be one of {SETTINGS_CHOICES}")
        if not 0 <= self.min_gap <= self.max_gap:
            raise ValueError("need 0 <= min_gap <= max_gap")
        if self.orders < 1 or (self.kills is not None and self.kills < 0):
            raise ValueError("need at least one order and no negative kill count")

    @property
    def kill_count(self) -> int:
        return DEFAULT_KILLS[self.scenario] if self.kills is None else self.kills

    def gaps(self) -> list[float]:
        """The seeded gaps before each kill (the same for the same seed, whatever the timing)."""
        rng = random.Random(f"drill:{self.scenario}:{self.seed}")
        return [round(rng.uniform(self.min_gap, self.max_gap), 3) for _ in range(self.kill_count)]

    def order_ids(self, reply_queue: str = "app-status") -> list[str]:
        return [o.order_id for o in make_orders(self.orders, self.seed, reply_queue, prefix="drill")]


def sample_settings() -> dict[str, str]:
    """What `--settings sample` runs with: every LOCAL_DEFAULTS key back at its registered default (app settings
    from orderflow/settings.py, the Agent's from agent/config.py), then the tunables of local.settings.sample.json."""
    defaults = {s.name: s.default for s in (*SETTINGS, *AGENT_SETTINGS) if s.default is not None}
    values: dict[str, str] = json.loads(SAMPLE_FILE.read_text())["Values"]
    out = {k: defaults[k] for k in LOCAL_DEFAULTS if k in defaults}
    out.update({k: str(v) for k, v in values.items() if k in SETTING_NAMES and k not in _CONNECTIONS})
    return out


def base_settings(choice: str) -> dict[str, str]:
    """`--settings`: local ({}: LOCAL_DEFAULTS, which every LocalSystem runs with) or sample."""
    return sample_settings() if choice == "sample" else {}


def parse_overrides(values: list[str]) -> tuple[tuple[str, str], ...]:
    """`--set NAME=VALUE` arguments; ValueError on one without `=` or with an empty name."""
    pairs = []
    for value in values:
        name, sep, setting = value.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--set takes NAME=VALUE, got {value!r}")
        pairs.append((name.strip(), setting))
    return tuple(pairs)


def drill_config(work_dir: Path, options: DrillOptions, servicebus_config: Path | None = None) -> SystemConfig:
    """The drill's system: no injected fault (the remote never fails), the chosen settings."""
    config = SystemConfig(work_dir=work_dir.resolve(), seed=options.seed, transient_failure_rate=0.0,
                          permanent_failure_rate=0.0, hang_rate=0.0,
                          settings={**base_settings(options.settings), **dict(options.overrides)})
    if options.latency_ms is not None:
        config.latency_ms_mean = options.latency_ms
    if servicebus_config is not None:
        config.servicebus_config = servicebus_config.resolve()
    return config


@dataclass
class DrillResult:
    summary: dict[str, Any]
    order_ids: list[str]

    @property
    def ok(self) -> bool:
        s = self.summary
        return (s["processed"] == s["submitted"] and s["error"] == 0 and s["lost"] == 0
                and s["duplicate_side_effects"] == 0 and s["missing_side_effects"] == 0
                and all(s.get("checks", {}).values()))


def _target(system: LocalSystem, scenario: str) -> Process:
    process = system.devhost if scenario == "host-crash" else system.agent
    assert process is not None, "the system is not started"
    return process


@dataclass(frozen=True)
class Kill:
    at: float  # monotonic time of the SIGKILL
    in_flight: int  # orders without a terminal status at that moment


async def _kill_loop(system: LocalSystem, options: DrillOptions, client: ClientApp, total: int) -> list[Kill]:
    """Kill the target with SIGKILL after each gap and restart it; stop early once every order is terminal."""
    restart = system.start_devhost if options.scenario == "host-crash" else system.start_agent
    kills: list[Kill] = []
    for gap in options.gaps():
        try:  # the gap is the scenario; the event ends it early when there is nothing left to crash
            await asyncio.wait_for(client.all_terminal.wait(), gap)
            break
        except TimeoutError:
            pass
        _target(system, options.scenario).kill()
        kills.append(Kill(time.monotonic(), total - len(client.terminal_at)))
        await asyncio.to_thread(restart)  # blocks until devhost prints its URL again
    return kills


async def run_drill(system: LocalSystem, options: DrillOptions, console: Console | None = None,
                    transient: bool = True) -> DrillResult:
    """The drill on a started `system` (its simulator must inject no fault); the caller stops the system."""
    console = console or Console(quiet=True)
    install_for(system)
    orders = make_orders(options.orders, options.seed, system.config.reply_queue, prefix="drill")
    order_ids = [o.order_id for o in orders]
    async with client_app(system) as client:
        started = time.monotonic()
        await client.submit(orders)
        killer = asyncio.create_task(_kill_loop(system, options, client, len(orders)))
        waiter = asyncio.create_task(wait_terminal(client, len(orders), started, options.timeout, console,
                                                   transient))
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
    summary: dict[str, Any] = {
        "scenario": options.scenario, "settings": options.settings,
        "submitted": len(orders), "processed": counts.get("Processed", 0), "error": counts.get("Error", 0),
        "pending": counts.get("Pending", 0), "processing": counts.get("Processing", 0),
        "lost": client.lost(order_ids, states.missing),
        "error_reasons": dict(states.error_reasons.most_common()),
        "duplicate_side_effects": int(effects.get("duplicates", -1)),
        "missing_side_effects": missing_effects,
        "attempts": {str(a): n for a, n in sorted(attempts.items())},
        "max_attempt": max(attempts, default=0),
        "kills_requested": options.kill_count, "kills_done": len(kills),
        "kills_at_s": [round(k.at - started, 1) for k in kills],
        "in_flight_at_kills": [k.in_flight for k in kills],
        "settle_s": None if settle is None else round(settle, 1),
        "total_s": round((last_terminal or ended) - started, 1),
        "work_dir": str(system.config.work_dir),
        "checks": findings.checks, **findings.figures,
    }
    return DrillResult(summary, order_ids)


def _display(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary with its lists and the attempts histogram spelled out for the table."""
    shown = dict(summary)
    shown["attempts"] = ", ".join(f"{n} order{'s' * (n != 1)} in {a}" for a, n in summary["attempts"].items())
    for key in ("kills_at_s", "in_flight_at_kills"):
        shown[key] = " ".join(str(v) for v in summary[key]) or "-"
    return shown


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _run_on_system(system: LocalSystem, console: Console, drill: Callable[[], Awaitable[R]]) -> R:
    """Start `system`, run `drill` on it and stop it, on SIGTERM too (its processes never outlive the command)."""

    async def drive() -> R:
        with console.status("starting devhost, the Agent and the simulator…"):
            await asyncio.to_thread(system.start)
        try:
            return await drill()
        finally:
            system.stop()

    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return asyncio.run(drive())
    finally:
        signal.signal(signal.SIGTERM, previous)
        system.stop()


def run_drill_command(args: argparse.Namespace) -> int:
    if args.scenario in MODULE_DRILLS:
        module, function = MODULE_DRILLS[args.scenario].split(":")
        run: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), function)
        return run(args)
    if args.scenario in LIFECYCLE_DRILLS:
        from .lifecycle_drills import run_lifecycle_command  # noqa: PLC0415

        return run_lifecycle_command(args)
    orders = DEFAULT_ORDERS[args.scenario] if args.orders is None else args.orders
    try:
        overrides = parse_overrides(args.overrides)
        if args.scenario in TARGETS:
            crash = DrillOptions(scenario=args.scenario, orders=orders, kills=args.kills, min_gap=args.min_gap,
                                 max_gap=args.max_gap, seed=args.seed, settings=args.settings, timeout=args.timeout,
                                 overrides=overrides)
        else:
            resilience = ResilienceOptions(drill=args.scenario, orders=orders, seed=args.seed, settings=args.settings,
                                           overrides=overrides, outage_after=args.outage_after,
                                           outage_for=args.outage_for, timeout=args.timeout)
    except ValueError as exc:
        return usage_error(exc)
    work = Path(args.work_dir or default_work_dir("drill-"))
    if args.scenario in TARGETS:
        console = Console(stderr=args.json)
        title = f"drill {args.scenario} ({args.settings} settings)"
        system = LocalSystem(drill_config(work, crash, args.servicebus_config))
        result = _run_on_system(system, console, lambda: run_drill(system, crash, console, transient=args.json))
        return _report(console, summary_table(_display(result.summary), title), result.summary if args.json else None,
                       [] if result.ok else ["every order must end Processed, with none lost and no duplicate or "
                                             "missing side effect"])
    system = LocalSystem(resilience_config(work, resilience, args.servicebus_config))
    return run_verdict_drill(args, system,
                             lambda console: run_resilience_drill(system, resilience, console, transient=args.json))


def usage_error(exc: Exception) -> int:
    """A mistake on the drill's command line: one line on stderr, no traceback; exit code 2."""
    Console(stderr=True).print(f"devhost drill: {exc}")
    return 2


def run_verdict_drill(args: argparse.Namespace, system: LocalSystem,
                      drill: Callable[[Console], Awaitable[Verdict]]) -> int:
    """Start `system`, run a drill that ends in a Verdict on it, stop it; print the table (and with --json the
    verdict as the last line of stdout); the exit code."""
    console = Console(stderr=args.json)
    verdict = _run_on_system(system, console, lambda: drill(console))
    title = f"drill {args.scenario} ({args.settings} settings)"
    return _report(console, summary_table(verdict.display(), title), verdict.to_json() if args.json else None,
                   verdict.failed_checks())


def _report(console: Console, table: Any, line: dict[str, Any] | None, failures: list[str]) -> int:
    """Print the table, then the JSON line (with --json: the last line of stdout) and why it failed; the exit code."""
    console.print(table)
    if line is not None:
        print(json.dumps(line), flush=True)
    if failures:
        console.print(f"[red]drill failed: {'; '.join(failures)}[/]")
    return 1 if failures else 0


# --- the resilience drills (issue 11) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ResilienceOptions:
    drill: str  # retry-budget | remote-outage | backlog-flood
    orders: int | None = None  # None: DEFAULT_ORDERS[drill]
    seed: int = 1
    settings: str = "local"  # the base under DRILL_SETTINGS: local (LOCAL_DEFAULTS) or sample
    overrides: tuple[tuple[str, str], ...] = ()  # --set NAME=VALUE, over DRILL_SETTINGS
    outage_after: float = 2.0  # remote-outage: seconds from the submission to the outage
    outage_for: float = 15.0  # remote-outage: seconds the remote stays down
    timeout: float = 900.0

    def __post_init__(self) -> None:
        if self.drill not in RESILIENCE_DRILLS:
            raise ValueError(f"drill must be one of {RESILIENCE_DRILLS}")
        if self.settings not in SETTINGS_CHOICES:
            raise ValueError(f"settings must be one of {SETTINGS_CHOICES}")
        if self.order_count < 1 or self.outage_after < 0 or self.outage_for <= 0:
            raise ValueError("need at least one order, outage_after >= 0 and outage_for > 0")

    @property
    def order_count(self) -> int:
        return DEFAULT_ORDERS[self.drill] if self.orders is None else self.orders

    def settings_values(self) -> dict[str, str]:
        """What the system runs with over LOCAL_DEFAULTS: the base, the drill's settings, then `--set`."""
        return {**base_settings(self.settings), **DRILL_SETTINGS[self.drill], **dict(self.overrides)}


def resilience_config(work_dir: Path, options: ResilienceOptions,
                      servicebus_config: Path | None = None) -> SystemConfig:
    """The drill's system: retry-budget's remote fails every call transiently; the others' never fails by itself
    (remote-outage takes it down through the outage switch)."""
    config = SystemConfig(work_dir=work_dir.resolve(), seed=options.seed,
                          transient_failure_rate=1.0 if options.drill == "retry-budget" else 0.0,
                          permanent_failure_rate=0.0, hang_rate=0.0, settings=options.settings_values())
    if servicebus_config is not None:
        config.servicebus_config = servicebus_config.resolve()
    return config


def _tree_rss(pid: int) -> int:
    """Resident bytes of a process and its descendants now (0 if it is gone)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def _high_water_rss(pid: int) -> int:
    """The kernel's peak resident set of one process (`VmHWM`, Linux), 0 where unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class Monitor:
    """Samples the running system while a drill runs: every `every` seconds the Processing and Pending counts of the
    state store and the resident memory of devhost and the Agent (process trees); every `breaker_every` seconds the
    circuit breaker's document (each change, with the time it was first seen). Peaks: the sampled maxima; for memory
    also the kernel's high-water mark of each main process, read at the end (it catches a peak between samples)."""

    def __init__(self, system: LocalSystem, every: float = SAMPLE_EVERY_S,
                 breaker_every: float = BREAKER_EVERY_S) -> None:
        self.system = system
        self.every = every
        self.breaker_every = breaker_every
        self.env = system.env()
        self.service = app_settings.get("RemoteServiceName", self.env) or "fulfilment"
        self.max_processing = 0
        self.max_pending = 0
        self.breaker: list[tuple[float, BreakerDoc]] = []  # (first seen, Unix s; the document) at each change
        self.rss_peak: dict[str, int] = {}  # bytes, by process name
        self.counts: list[tuple[int, int]] = []  # (Processing, Pending) of each sample
        self._last_doc: dict[str, Any] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Monitor:
        from orderflow.adapters import open_breaker_documents, open_stores  # noqa: PLC0415

        self._stores = open_stores(self.env)
        self._documents = open_breaker_documents(self.env)
        await self.sample()
        await self.sample_breaker()
        self._tasks = [asyncio.create_task(self._every(self.every, self.sample)),
                       asyncio.create_task(self._every(self.breaker_every, self.sample_breaker))]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await self.sample()
            await self.sample_breaker()
            for name, process in self._processes():
                self.rss_peak[name] = max(self.rss_peak.get(name, 0), _high_water_rss(_pid(process)))
        finally:
            await self._stores.aclose()
            await self._documents.aclose()

    @staticmethod
    async def _every(seconds: float, sample: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(seconds)
            await sample()

    def _processes(self) -> list[tuple[str, Process]]:
        return [(name, p) for name, p in (("devhost", self.system.devhost), ("agent", self.system.agent))
                if p is not None and p.running]

    async def sample(self) -> None:
        state = self._stores.state
        processing = await state.count_in_state(ProcessState.PROCESSING)
        pending = await state.count_in_state(ProcessState.PENDING)
        self.counts.append((processing, pending))
        self.max_processing = max(self.max_processing, processing)
        self.max_pending = max(self.max_pending, pending)
        for name, process in self._processes():
            self.rss_peak[name] = max(self.rss_peak.get(name, 0), _tree_rss(_pid(process)))

    @property
    def samples(self) -> int:
        return len(self.counts)

    def samples_over(self, max_processing: int, max_pending: int) -> tuple[int, int]:
        """How many samples had more than `max_processing` Processing, and more than `max_pending` Pending."""
        return (sum(1 for p, _ in self.counts if p > max_processing),
                sum(1 for _, q in self.counts if q > max_pending))

    async def sample_breaker(self) -> None:
        found = await self._documents.get(self.service)
        if found is not None and found[0] != self._last_doc:
            self._last_doc = found[0]
            self.breaker.append((time.time(), BreakerDoc.model_validate(found[0])))

    def peak_rss_mb(self) -> dict[str, float]:
        return {name: round(rss / 2**20, 1) for name, rss in sorted(self.rss_peak.items())}


def _pid(process: Process) -> int:
    assert process.proc is not None
    return process.proc.pid


@dataclass(frozen=True)
class Outage:
    """remote-outage's outage as it happened: the simulator's times (Unix s) and the orders it caught in flight."""

    in_flight: int  # orders without a final status when it began (0: it never began, every order was done)
    start: float | None = None
    end: float | None = None
    ended: float | None = None  # the drill's monotonic clock when the remote was back


async def _outage(system: LocalSystem, client: ClientApp, total: int, after: float, duration: float) -> Outage:
    """Take the remote down `after` seconds from now for `duration` seconds (not if every order is done by then)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(client.all_terminal.wait(), after)
        return Outage(in_flight=0)
    in_flight = total - len(client.terminal_at)
    await simulator_json(system, "/outage", {"down": True})
    try:
        await asyncio.sleep(duration)
    finally:  # the remote comes back even when the drill is cut short
        report = await simulator_json(system, "/outage", {"down": False})
    last = report["outages"][-1]
    return Outage(in_flight, last["start"], last["end"], time.monotonic())


@dataclass(frozen=True)
class OpenRound:
    """One open period of the breaker: from `opened_at` to `open_until` (None: forced open), Unix seconds; `seen_at`:
    when the drill first read it (the open document was stored by then: from here on no call is let through)."""

    opened_at: float
    open_until: float | None
    seen_at: float
    reason: str


@dataclass(frozen=True)
class Episode:
    """The breaker away from closed: from its first round's opening to its closing (or the end of the drill)."""

    opened_at: float
    seen_at: float  # the first round's `seen_at`
    closed_at: float
    half_open_rounds: int  # every open round whose cool-down ended before the closing is followed by one


@dataclass(frozen=True)
class BreakerHistory:
    """The breaker's open rounds and closings, rebuilt from the documents a `Monitor` saw. Every round shows (it lasts
    at least the cool-down, many samples); the document's own times (openedAt, openUntil, changedAt) date it."""

    rounds: tuple[OpenRound, ...]
    closings: tuple[float, ...]

    @classmethod
    def from_docs(cls, docs: list[tuple[float, BreakerDoc]]) -> BreakerHistory:
        rounds: dict[float, OpenRound] = {}
        closings: set[float] = set()
        for seen, doc in docs:
            if doc.state is BreakerState.CLOSED:
                if doc.changed_at is not None:
                    closings.add(doc.changed_at.timestamp())
            elif doc.opened_at is not None:  # open, or half-open (which keeps its round's openedAt/openUntil)
                opened = doc.opened_at.timestamp()
                until = None if doc.open_until is None else doc.open_until.timestamp()
                reason = (doc.reason or "") if doc.state is BreakerState.OPEN else ""
                first = rounds.get(opened)
                rounds[opened] = OpenRound(opened, until, first.seen_at if first else seen,
                                           (first.reason if first else "") or reason)
        return cls(tuple(sorted(rounds.values(), key=lambda r: r.opened_at)), tuple(sorted(closings)))

    def episodes(self, end: float) -> list[Episode]:
        out: list[Episode] = []
        for r in self.rounds:
            if out and r.opened_at < out[-1].closed_at:
                continue
            closed = next((c for c in self.closings if c > r.opened_at), end)
            inside = [x for x in self.rounds if r.opened_at <= x.opened_at < closed]
            half_open = sum(1 for x in inside if x.open_until is not None and x.open_until < closed)
            out.append(Episode(r.opened_at, r.seen_at, closed, half_open))
        return out


@dataclass(frozen=True)
class CallsWhileOpen:
    """The remote's calls against the breaker's episodes: `at_opening` arrived after an episode's openedAt but before
    its document was seen stored or within the grace (let through while it was still closed: in flight, or from a
    cached read), `while_open` from then to the closing (each must be a half-open probe), `strictly_open` those of
    `while_open` outside a half-open round."""

    at_opening: int
    while_open: int
    strictly_open: int
    half_open_rounds: int

    @classmethod
    def count(cls, history: BreakerHistory, calls: list[dict[str, Any]], end: float,
              grace: float = CACHE_TTL.total_seconds()) -> CallsWhileOpen:
        """`grace`: calls granted before the opening may still arrive after it (in flight, or granted from an Agent's
        read of the breaker up to orderflow.breaker.CACHE_TTL old): those arriving within it of the opening count as
        `at_opening`, not as calls while open."""
        episodes = history.episodes(end)

        def excused_until(e: Episode) -> float:
            return max(e.seen_at, e.opened_at + grace)

        at_opening = [c for c in calls if any(e.opened_at <= c["at"] < excused_until(e) for e in episodes)]
        while_open = [c for c in calls if any(excused_until(e) <= c["at"] < e.closed_at for e in episodes)]
        strictly = [c for c in while_open if any(
            r.opened_at <= c["at"] < (end if r.open_until is None else r.open_until) for r in history.rounds)]
        return cls(len(at_opening), len(while_open), len(strictly), sum(e.half_open_rounds for e in episodes))


@dataclass
class DrillRun:
    """What a resilience drill saw, for its judge."""

    options: ResilienceOptions
    env: dict[str, str]
    work_dir: Path
    order_ids: list[str]
    client: ClientApp
    states: StateSummary
    effects: dict[str, Any]
    monitor: Monitor
    elapsed_s: float
    outage: Outage | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)  # the simulator's call log (remote-outage)
    ended_at: float = 0.0  # Unix s at the end of the run

    def got(self, order_id: str, state: OrderStatus) -> list[Any]:
        return [s for s in self.client.statuses.get(order_id, []) if s.state is state]

    def lost(self) -> int:
        """Orders without a final status, plus those whose answer was not `rejected` and have no state record."""
        unanswered = sum(1 for o in self.order_ids if o not in self.client.terminal_at)
        unrecorded = sum(1 for o in self.order_ids if o in self.client.terminal_at and o not in self.states.state_of
                         and not self.got(o, OrderStatus.REJECTED))
        return unanswered + unrecorded

    def attempts(self, order_ids: list[str] | None = None) -> dict[str, int]:
        ids = self.order_ids if order_ids is None else order_ids
        counted = Counter(self.states.attempts[o] for o in ids if o in self.states.attempts)
        return {str(a): n for a, n in sorted(counted.items())}


@dataclass
class Verdict:
    """A resilience drill's result: `passed` iff every check holds. `to_json()` is the `--json` line."""

    drill: str
    orders: int
    lost: int
    duplicate_side_effects: int
    stuck: int
    checks: dict[str, bool]
    figures: dict[str, Any]

    @property
    def passed(self) -> bool:
        return all(self.checks.values())

    def failed_checks(self) -> list[str]:
        return [name for name, ok in self.checks.items() if not ok]

    def to_json(self) -> dict[str, Any]:
        return {"drill": self.drill, "passed": self.passed, "orders": self.orders, "lost": self.lost,
                "duplicate_side_effects": self.duplicate_side_effects, "stuck": self.stuck, "checks": self.checks,
                "figures": self.figures}

    def with_invariants(self, findings: Findings) -> Verdict:
        """This verdict with the invariants every drill checks (devhost/invariants.py): their checks and figures
        added, and lost, duplicates and stuck as the larger of the drill's count and theirs."""
        return Verdict(self.drill, self.orders, max(self.lost, findings.lost),
                       max(self.duplicate_side_effects, findings.duplicates), max(self.stuck, findings.stuck),
                       {**self.checks, **findings.checks}, {**self.figures, **findings.figures})

    def display(self) -> dict[str, Any]:
        """The rows of the table: the verdict, each check, each figure."""
        rows: dict[str, Any] = {"passed": "yes" if self.passed else "NO", "orders": self.orders, "lost": self.lost,
                                "duplicate side effects": self.duplicate_side_effects, "stuck": self.stuck}
        rows.update({f"check: {name}": "ok" if ok else "FAILED" for name, ok in self.checks.items()})
        for name, value in self.figures.items():
            rows[name] = " ".join(str(v) for v in value) if isinstance(value, list) else value
        return rows


def _verdict(run: DrillRun, checks: dict[str, bool], figures: dict[str, Any]) -> Verdict:
    """The verdict with the checks every drill has: none lost, no duplicate side effect, none stuck."""
    lost = run.lost()
    duplicates = int(run.effects.get("duplicates", -1))  # -1: the simulator's ledger could not be read
    stuck = run.states.counts.get(ProcessState.PENDING.value, 0) + \
        run.states.counts.get(ProcessState.PROCESSING.value, 0)
    common = {"none lost": lost == 0, "no duplicate side effect": duplicates == 0, "none stuck": stuck == 0}
    figures = {**figures, "elapsed_s": round(run.elapsed_s, 1), "work_dir": str(run.work_dir)}
    return Verdict(run.options.drill, len(run.order_ids), lost, duplicates, stuck, {**common, **checks}, figures)


def _missing_effects(run: DrillRun) -> int:
    """Steps of Processed orders without their side effect in the simulator's ledger."""
    applied = {(e["orderId"], e["step"]) for e in run.effects.get("effects", []) if e["applied"] >= 1}
    processed = [o for o in run.order_ids if run.states.state_of.get(o) == ProcessState.PROCESSED.value]
    return sum(1 for o in processed for step in STEPS if (o, step.value) not in applied)


FAILURE_STATUSES = (OrderStatus.FAILED, OrderStatus.COMPENSATED, OrderStatus.COMPENSATION_FAILED)


def judge_retry_budget(run: DrillRun) -> Verdict:
    """Every call fails: every order ends failed (Error, or its sent steps compensated or CompensationFailed) with its
    reason and status, the calls per step (compensations included, each its own key) within budget."""
    budget = RetryBudget.from_env(run.env)
    agent_max_retries = int(run.env.get("AGENT_MAX_RETRIES") or
                            next(s.default for s in AGENT_SETTINGS if s.name == "AGENT_MAX_RETRIES") or 0)
    by_key: dict[str, int] = run.effects.get("callsByKey", {})
    calls = sum(by_key.values())
    most = max(by_key.values(), default=0)
    n = len(run.order_ids)
    checks = {
        # Error when nothing was sent; a step sent (its record `running`) is compensated, and with every call failing
        # its compensation fails too (CompensationFailed).
        "every order ended failed": sum(run.states.counts.get(s, 0) for s in FAILED_STATES) == n,
        "every failure has its reason": run.states.errors_without_reason == 0,
        "every order got its failure status": all(any(run.got(o, s) for s in FAILURE_STATUSES)
                                                  for o in run.order_ids),
        "the remote was called": calls > 0,
        "calls per order step <= RemoteCallBudgetPerStep": most <= budget.budget,
    }
    figures = {
        "budget": budget.budget,
        "arithmetic": budget.arithmetic(agent_max_retries),
        "max_calls_per_step": most,
        "mean_calls_per_step": round(calls / len(by_key), 2) if by_key else 0.0,
        "steps_called": len(by_key),
        "calls": calls,
        "calls_per_step": {str(c): k for c, k in sorted(Counter(by_key.values()).items())},
        "error_reasons": dict(run.states.error_reasons.most_common()),
        "attempts": run.attempts(),
    }
    return _verdict(run, checks, figures)


def judge_remote_outage(run: DrillRun) -> Verdict:
    """No order in Error, every order Processed once; calls while the breaker was open <= its probes."""
    outage = run.outage or Outage(in_flight=0)
    history = BreakerHistory.from_docs(run.monitor.breaker)
    episodes = history.episodes(run.ended_at)
    counted = CallsWhileOpen.count(history, run.calls, run.ended_at)
    probes = app_settings.get_int("CircuitBreakerProbes", run.env)
    allowed = probes * counted.half_open_rounds
    n = len(run.order_ids)
    last_final = max(run.client.terminal_at.values(), default=None)

    def since_outage(at: float | None) -> float | None:
        return None if at is None or outage.start is None else round(at - outage.start, 2)

    checks = {
        "the outage caught orders in flight": outage.in_flight > 0,
        "no order in Error": run.states.counts.get(ProcessState.ERROR.value, 0) == 0,
        "every order Processed": run.states.counts.get(ProcessState.PROCESSED.value, 0) == n,
        "no missing side effect": _missing_effects(run) == 0,
        "the breaker opened": bool(history.rounds),
        "the breaker closed after the outage": bool(episodes) and episodes[-1].closed_at < run.ended_at,
        "calls while open <= probes x half-open rounds": counted.while_open <= allowed,
    }
    figures = {
        "outage_s": None if outage.end is None or outage.start is None else round(outage.end - outage.start, 2),
        "in_flight_at_outage": outage.in_flight,
        "time_to_open_s": since_outage(history.rounds[0].opened_at if history.rounds else None),
        "calls_during_outage": int(run.effects.get("callsWhileDown", -1)),
        "calls_at_opening": counted.at_opening,
        "calls_while_open": counted.while_open,
        "calls_while_strictly_open": counted.strictly_open,
        "probes": probes,
        "half_open_rounds": counted.half_open_rounds,
        "allowed_calls_while_open": allowed,
        "open_rounds_s": [_round_label(r, since_outage(r.opened_at)) for r in history.rounds],
        "closed_at_s": since_outage(episodes[-1].closed_at) if episodes else None,
        "time_to_drain_s": None if last_final is None or outage.ended is None else
        round(max(0.0, last_final - outage.ended), 2),
        "deferrals": run.states.deferrals,
        "failure_count": {str(f): k for f, k in sorted(run.states.failure_counts.items())},
        "error": run.states.counts.get(ProcessState.ERROR.value, 0),
        "attempts": run.attempts(),
    }
    return _verdict(run, checks, figures)


def _round_label(r: OpenRound, opened_s: float | None) -> str:
    """`2.1+3.0`: opened 2.1 s after the outage began, for a 3 s cool-down (`+held`: forced open)."""
    return f"{opened_s}+{'held' if r.open_until is None else round(r.open_until - r.opened_at, 1)}"


def judge_backlog_flood(run: DrillRun) -> Verdict:
    """One answer per order: rejected with nothing written, or admitted and Processed in attempt 1; both bounds."""
    max_processing = app_settings.get_int("MaxOrdersInProcessing", run.env)
    max_pending = app_settings.get_int("MaxPendingOrders", run.env)
    rejected = [o for o in run.order_ids if run.got(o, OrderStatus.REJECTED)]
    admitted = [o for o in run.order_ids if o in run.states.state_of]
    rejections = [s for o in rejected for s in run.got(o, OrderStatus.REJECTED)]
    checks = {
        "one outcome per order": not set(rejected) & set(admitted)
        and not any(run.got(o, OrderStatus.COMPLETED) or run.got(o, OrderStatus.FAILED) for o in rejected),
        "rejected: reason `backlog full`": all(s.reason == "backlog full" for s in rejections),
        "rejected: no state record, no orders-DB record": not any(
            o in run.states.state_of or o in run.states.in_orders_db for o in rejected),
        "admitted: every one Processed": all(run.states.state_of[o] == ProcessState.PROCESSED.value
                                             and run.got(o, OrderStatus.COMPLETED) for o in admitted),
        "admitted: every one in attempt 1": all(run.states.attempts[o] == 1 for o in admitted),
        "Processing <= MaxOrdersInProcessing": run.monitor.max_processing <= max_processing,
        "Pending <= MaxPendingOrders": run.monitor.max_pending <= max_pending,
        "no missing side effect": _missing_effects(run) == 0,
    }
    figures = {
        "admitted": len(admitted),
        "rejected": len(rejected),
        "max_orders_in_processing": max_processing,
        "max_processing_seen": run.monitor.max_processing,
        "max_pending_orders": max_pending,
        "max_pending_seen": run.monitor.max_pending,
        "attempts": run.attempts(admitted),
        "peak_rss_mb": run.monitor.peak_rss_mb(),
        "samples": run.monitor.samples,
        "samples_over_bounds": dict(zip(("processing", "pending"),
                                        run.monitor.samples_over(max_processing, max_pending), strict=True)),
    }
    return _verdict(run, checks, figures)


JUDGES: dict[str, Callable[[DrillRun], Verdict]] = {
    "retry-budget": judge_retry_budget,
    "remote-outage": judge_remote_outage,
    "backlog-flood": judge_backlog_flood,
}


async def run_resilience_drill(system: LocalSystem, options: ResilienceOptions, console: Console | None = None,
                               transient: bool = True) -> Verdict:
    """The drill on a started `system` (built from `resilience_config`); the caller stops the system."""
    console = console or Console(quiet=True)
    install_for(system)
    orders = make_orders(options.order_count, options.seed, system.config.reply_queue, prefix=options.drill)
    order_ids = [o.order_id for o in orders]
    env = system.env()
    outage: Outage | None = None
    calls: list[dict[str, Any]] = []
    if options.drill == "retry-budget":
        # Every step call fails; at FailureThreshold the step that was sent is compensated. Its compensation is let
        # through (a no-op: nothing was applied), so the drill measures the steps' budget without three more rounds.
        await simulator_json(system, "/script", {
            idempotency_key(o.order_id, COMPENSATION_OF[step].value): ["ok"] for o in orders for step in STEPS})
    async with client_app(system) as client, Monitor(system) as monitor:
        started = time.monotonic()
        await client.submit(orders)
        switch = None
        if options.drill == "remote-outage":
            switch = asyncio.create_task(_outage(system, client, len(orders), options.outage_after,
                                                 options.outage_for))
        try:
            await wait_terminal(client, len(orders), started, options.timeout, console, transient)
            if switch is not None:
                outage = await switch  # every order may be final before the outage is over
        finally:
            if switch is not None:
                switch.cancel()
        elapsed = max(client.terminal_at.values(), default=time.monotonic()) - started
        effects = await read_effects(system)
        if options.drill == "remote-outage":
            calls = (await simulator_json(system, "/calls")).get("calls", [])
    states = await read_states(env, order_ids, orders_db=options.drill == "backlog-flood")
    run = DrillRun(options, env, system.config.work_dir, order_ids, client, states, effects, monitor, elapsed, outage,
                   calls, time.time())
    # A `rejected` order (backlog-flood) has no record, by design.
    findings = await check_system(system, order_ids, lambda o: not run.got(o, OrderStatus.REJECTED))
    return JUDGES[options.drill](run).with_invariants(findings)
