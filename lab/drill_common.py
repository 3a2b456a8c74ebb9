"""What every drill shares: the drill names, the settings bases (`--settings local|sample`, `--set`), the
`Verdict` a drill ends in, and running a drill on a started local system with its report."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Self, TypeVar

from rich.console import Console

from agent.config import AGENT_SETTINGS
from orderflow.settings import SETTING_NAMES, SETTINGS

from .demo import (
    summary_table,
)
from .invariants import Findings
from .system import LOCAL_DEFAULTS, ROOT, LocalSystem

R = TypeVar("R")

TARGETS = {"host-crash": "devhost", "agent-crash": "agent"}
RESILIENCE_DRILLS = ("retry-budget", "remote-outage", "backlog-flood")
# The lifecycle drills (issue 12: compensation, cancel, poison, upgrade) live in lab/lifecycle_drills.py.
LIFECYCLE_DRILLS = ("compensation", "cancel-in-flight", "poison-in-session", "upgrade-in-flight")
# Drills in modules of their own (issue 15): name -> "module:function". The function takes the parsed `drill`
# arguments and returns the exit code; with --json the verdict (Verdict.to_json, invariants included) is the last line
# of stdout.
MODULE_DRILLS: dict[str, str] = {
    "remote-hang": "lab.timing_drills:run_command",
    "late-replies": "lab.timing_drills:run_command",
    "reply-reordering": "lab.timing_drills:run_command",
    "clock-skew": "lab.timing_drills:run_command",
    "duplicate-delivery": "lab.input_drills:run_command",
    "poison-input": "lab.input_drills:run_command",
    "state-store-conflicts": "lab.store_drills:run_command",
    "store-outage": "lab.store_drills:run_command",
    "starter-race": "lab.race_drills:run_command",
    "supervisor-race": "lab.race_drills:run_command",
    "scale-out": "lab.scale_drills:run_command",
    "durable-api-outage": "lab.durable_api_drills:run_command",
    "bus-outage": "lab.bus_drills:run_command",
    "idle-then-burst": "lab.profile_drills:run_command",
    # Issue 25: two submitting apps on one system, one hostile (lab/tenant_drills.py).
    "tenant-isolation": "lab.tenant_drills:run_command",
    # Issue 26: data that ends (retention, purge, keep) and the alarms, forced and quiet (lab/retention_drills.py).
    "retention": "lab.retention_drills:run_command",
}
DRILLS = (*sorted(TARGETS), *RESILIENCE_DRILLS, *LIFECYCLE_DRILLS, *MODULE_DRILLS)
DEFAULT_ORDERS = {"host-crash": 100, "agent-crash": 100, "retry-budget": 20, "remote-outage": 100, "backlog-flood": 300}
SETTINGS_CHOICES = ("local", "sample")
SAMPLE_FILE = ROOT / "local.settings.sample.json"
# Values of the sample that name this machine's resources, not tunables: the drill's system sets its own.
_CONNECTIONS = frozenset({"ServiceBusConnection", "CosmosDb__accountEndpoint"})


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


def drill_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """What every drill's options take from its command line: --orders, --seed, --settings, --set, --timeout."""
    return {
        "orders": args.orders,
        "seed": args.seed,
        "settings": args.settings,
        "overrides": parse_overrides(args.overrides),
        "timeout": args.timeout,
    }


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run_on_system(system: LocalSystem, console: Console, drill: Callable[[], Awaitable[R]]) -> R:
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


def usage_error(exc: Exception) -> int:
    """A mistake on the drill's command line: one line on stderr, no traceback; exit code 2."""
    Console(stderr=True).print(f"devhost drill: {exc}")
    return 2


def run_verdict_drill(
    args: argparse.Namespace, system: LocalSystem, drill: Callable[[Console], Awaitable[Verdict]]
) -> int:
    """Start `system`, run a drill that ends in a Verdict on it, stop it; print the table (and with --json the
    verdict as the last line of stdout); the exit code."""
    console = Console(stderr=args.json)
    return report_verdict(args, console, run_on_system(system, console, lambda: drill(console)))


def report_verdict(args: argparse.Namespace, console: Console, verdict: Verdict) -> int:
    """The verdict's table (and with --json the verdict as the last line of stdout); the exit code."""
    title = f"drill {args.scenario} ({args.settings} settings)"
    return report(
        console,
        summary_table(verdict.display(), title),
        verdict.to_json() if args.json else None,
        verdict.failed_checks(),
    )


class Periodic:
    """A drill's background look every `every` seconds (`tick`), from `async with` until its exit."""

    every = 0.2

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    async def tick(self) -> object:
        raise NotImplementedError

    async def _loop(self) -> None:
        while True:
            await self.tick()
            await asyncio.sleep(self.every)

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def report(console: Console, table: Any, line: dict[str, Any] | None, failures: list[str]) -> int:
    """Print the table, then the JSON line (with --json: the last line of stdout) and why it failed; the exit code."""
    console.print(table)
    if line is not None:
        print(json.dumps(line), flush=True)
    if failures:
        console.print(f"[red]drill failed: {'; '.join(failures)}[/]")
    return 1 if failures else 0


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
        return {
            "drill": self.drill,
            "passed": self.passed,
            "orders": self.orders,
            "lost": self.lost,
            "duplicate_side_effects": self.duplicate_side_effects,
            "stuck": self.stuck,
            "checks": self.checks,
            "figures": self.figures,
        }

    def with_invariants(self, findings: Findings) -> Verdict:
        """This verdict with the invariants every drill checks (lab/invariants.py): their checks and figures
        added, and lost, duplicates and stuck as the larger of the drill's count and theirs."""
        return Verdict(
            self.drill,
            self.orders,
            max(self.lost, findings.lost),
            max(self.duplicate_side_effects, findings.duplicates),
            max(self.stuck, findings.stuck),
            {**self.checks, **findings.checks},
            {**self.figures, **findings.figures},
        )

    def display(self) -> dict[str, Any]:
        """The rows of the table: the verdict, each check, each figure."""
        rows: dict[str, Any] = {
            "passed": "yes" if self.passed else "NO",
            "orders": self.orders,
            "lost": self.lost,
            "duplicate side effects": self.duplicate_side_effects,
            "stuck": self.stuck,
        }
        rows.update({f"check: {name}": "ok" if ok else "FAILED" for name, ok in self.checks.items()})
        for name, value in self.figures.items():
            rows[name] = " ".join(str(v) for v in value) if isinstance(value, list) else value
        return rows
