"""`python -m devhost drill host-crash|agent-crash`: crash drills on the whole local system in real processes.

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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from agent.config import AGENT_SETTINGS
from orderflow.messages import STEPS
from orderflow.settings import SETTING_NAMES, SETTINGS

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
from .system import LOCAL_DEFAULTS, ROOT, LocalSystem, Process, SystemConfig

TARGETS = {"host-crash": "devhost", "agent-crash": "agent"}
DEFAULT_KILLS = {"host-crash": 10, "agent-crash": 5}
SETTINGS_CHOICES = ("local", "sample")
SAMPLE_FILE = ROOT / "local.settings.sample.json"
# Values of the sample that name this machine's resources, not tunables: the drill's system sets its own.
_CONNECTIONS = frozenset({"ServiceBusConnection", "CosmosDb__accountEndpoint", "AllowedReplyQueues"})


def add_command(sub: Any) -> None:
    d = sub.add_parser("drill", help="crash drill: kill -9 devhost or the Agent repeatedly during a burst of orders",
                       description="Start devhost, the Agent and a simulator that never fails, submit orders, kill "
                                   "one process with SIGKILL at seeded random gaps while they are in flight and "
                                   "restart it each time; when every order is terminal print the figures (processed, "
                                   "error, lost, duplicate side effects, attempts per order, settle time). Exit code "
                                   "1 unless every order is Processed with none lost and no duplicate.")
    d.add_argument("scenario", choices=sorted(TARGETS), help="host-crash kills devhost, agent-crash the Agent")
    d.add_argument("--orders", type=int, default=100, help="number of orders to submit (default 100)")
    d.add_argument("--kills", type=int, default=None,
                   help="kills to do (default 10 for host-crash, 5 for agent-crash)")
    d.add_argument("--min-gap", type=float, default=1.0,
                   help="shortest gap in seconds before a kill, from when the process is up (default 1)")
    d.add_argument("--max-gap", type=float, default=4.0, help="longest such gap in seconds (default 4)")
    d.add_argument("--seed", type=int, default=1, help="seed of the gaps, the orders and the Agent's jitter "
                                                       "(default 1)")
    d.add_argument("--settings", choices=SETTINGS_CHOICES, default="local", metavar="SETTINGS",
                   help="local: devhost/system.py LOCAL_DEFAULTS (the demo's), or sample: the values of "
                        "local.settings.sample.json (the Azure defaults) (default local)")
    d.add_argument("--servicebus-config", type=Path, default=None,
                   help="queue definitions for the embedded broker (default: the repo's servicebus.config.json)")
    d.add_argument("--timeout", type=float, default=900.0,
                   help="give up waiting for terminal orders after this many seconds (default 900)")
    d.add_argument("--work-dir", type=Path, default=None,
                   help="state folder (default: a fresh .demo/drill-<timestamp>)")
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


def drill_config(work_dir: Path, options: DrillOptions, servicebus_config: Path | None = None) -> SystemConfig:
    """The drill's system: no injected fault (the remote never fails), the chosen settings."""
    config = SystemConfig(work_dir=work_dir.resolve(), seed=options.seed, transient_failure_rate=0.0,
                          permanent_failure_rate=0.0, hang_rate=0.0,
                          settings=sample_settings() if options.settings == "sample" else {})
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
                and s["duplicate_side_effects"] == 0 and s["missing_side_effects"] == 0)


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


def run_drill_command(args: argparse.Namespace) -> int:
    options = DrillOptions(scenario=args.scenario, orders=args.orders, kills=args.kills, min_gap=args.min_gap,
                           max_gap=args.max_gap, seed=args.seed, settings=args.settings, timeout=args.timeout)
    work = Path(args.work_dir or default_work_dir("drill-"))
    system = LocalSystem(drill_config(work, options, args.servicebus_config))
    console = Console(stderr=args.json)

    async def drive() -> DrillResult:
        with console.status("starting devhost, the Agent and the simulator…"):
            await asyncio.to_thread(system.start)
        try:
            return await run_drill(system, options, console, transient=args.json)
        finally:
            system.stop()

    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)  # stop the system's processes on SIGTERM too
    try:
        result = asyncio.run(drive())
    finally:
        signal.signal(signal.SIGTERM, previous)
        system.stop()
    console.print(summary_table(_display(result.summary), f"drill {options.scenario} ({options.settings} settings)"))
    if args.json:
        print(json.dumps(result.summary), flush=True)
    if not result.ok:
        console.print("[red]drill failed: every order must end Processed, with none lost and no duplicate or "
                      "missing side effect[/]")
    return 0 if result.ok else 1
