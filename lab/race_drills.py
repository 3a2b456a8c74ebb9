"""`starter-race` and `supervisor-race`: more than one Starter, more than one Supervisor, on one state store and one
task hub, as when Azure runs the app on several instances.

Contract: two devhost hosts plus racer processes (lab/racers.py), four Starters and three Supervisors in all.
starter-race: every order Processed in attempt 1; supervisor-race: every order Processed in attempt 2 with
FailureCount 1. Both check the invariants of every drill (lab/invariants.py), report each racer's claims, lost races
and recoveries, and fail if the racers won nothing. Setup and why: docs/modules-lab.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console

from orderflow.messages import STEPS, idempotency_key

from .demo import (
    client_app,
    default_work_dir,
    make_orders,
    read_effects,
    read_states,
    simulator_json,
    wait_terminal,
)
from .drill_common import Verdict, base_settings, parse_overrides, run_verdict_drill, usage_error
from .invariants import check_system, install_for
from .system import LocalSystem, Process, SystemConfig

_EVERY_SECOND = "*/1 * * * * *"
RACE_SETTINGS: dict[str, dict[str, str]] = {
    "starter-race": {"MaxOrdersInProcessing": "8", "StarterSchedule": _EVERY_SECOND},
    # No crash here, so the crash budget's 20 s steps are not needed: a hung call expires its attempt in 6 s.
    "supervisor-race": {
        "StepTimeoutSeconds": "6",
        "ClaimLeaseSeconds": "6",
        "SupervisorSchedule": _EVERY_SECOND,
        "RetryBackoffBaseSeconds": "1",
        "RetryBackoffMaxSeconds": "2",
    },
}
RACERS = {"starter-race": ("starter", 3), "supervisor-race": ("supervisor", 2)}
DEFAULT_ORDERS = {"starter-race": 60, "supervisor-race": 12}
HANG_SECONDS = 10.0  # supervisor-race: longer than the step, so the attempt expires
# supervisor-race submits its orders this far apart, so each attempt expires on its own and is one race of its own.
# Submitted together they expired together, and the first pass after that moment recovered them all: the host's
# Supervisor (every second) came first in about one run in six, the racers (every 200 ms) won nothing, and the drill
# failed on "the racers won races" by chance. Six separate races all won by the host: about 0.17^6.
EXPIRY_SPACING_S = 1.0
# devhost hosts on the one task hub. Their own Starter and Supervisor are timer functions, which run on one host at a
# time (the listener lock, devhost/singleton.py), as on Azure; the racers are the passes beyond that.
HOSTS = 2


def _racers(system: LocalSystem, drill: str) -> list[tuple[Process, Path]]:
    role, count = RACERS[drill]
    urls = [host.url for host in system.devhosts if host is not None and host.url]
    assert len(urls) == system.config.hosts
    started = []
    for n in range(count):
        stats = system.config.work_dir / f"racer-{role}-{n}.json"
        # Each racer uses the Durable API of a host in turn: its starts land on one host and run on another.
        process = system._process(
            f"racer-{role}-{n}", ["-m", "lab.racers", role, "--host", urls[n % len(urls)], "--stats", str(stats)]
        )
        process.start(wait_for_url=False)
        started.append((process, stats))
    return started


def _stats(racers: list[tuple[Process, Path]]) -> list[dict[str, Any]]:
    for process, _ in racers:
        process.stop()
    return [json.loads(stats.read_text()) if stats.exists() else {"errors": "no stats written"} for _, stats in racers]


async def run_race(
    system: LocalSystem, drill: str, orders: int, seed: int, timeout: float, console: Console
) -> Verdict:
    install_for(system)
    batch = make_orders(orders, seed, system.config.reply_queue, prefix=drill)
    ids = [o.order_id for o in batch]
    if drill == "supervisor-race":
        await simulator_json(system, "/script", {idempotency_key(o, STEPS[0].value): ["hang"] for o in ids})
    racers = _racers(system, drill)
    try:
        async with client_app(system) as client:
            started = time.monotonic()
            if drill == "supervisor-race":
                for order in batch:
                    await client.submit([order])
                    await asyncio.sleep(EXPIRY_SPACING_S)  # shapes the races (see EXPIRY_SPACING_S), not a wait
            else:
                await client.submit(batch)
            await wait_terminal(client, len(batch), started, timeout, console, True)
            elapsed = max(client.terminal_at.values(), default=time.monotonic()) - started
    finally:
        stats = _stats(racers)
    effects = await read_effects(system)
    states = await read_states(system.env(), ids)
    attempts = Counter(states.attempts.values())
    processed = states.counts.get("Processed", 0)
    won = sum(int(s.get("claimed", 0)) if drill == "starter-race" else int(s.get("recovered", 0)) for s in stats)
    checks = {
        "every order Processed": processed == len(ids),
        "the racers won races": won > 0,
        "no racer pass failed": all(s.get("errors") == 0 for s in stats),
    }
    if drill == "starter-race":
        checks["every order in attempt 1 (a lost race costs no attempt)"] = attempts == Counter({1: len(ids)})
    else:
        checks["every order recovered once: attempt 2, FailureCount 1"] = attempts == Counter(
            {2: len(ids)}
        ) and states.failure_counts == Counter({1: len(ids)})
    figures: dict[str, Any] = {
        "attempts": {str(a): n for a, n in sorted(attempts.items())},
        "failure_counts": {str(f): n for f, n in sorted(states.failure_counts.items())},
        "racers": stats,
        "won_by_racers": won,
        "lost_races": sum(int(s.get("lost_races", 0)) for s in stats),
        "elapsed_s": round(elapsed, 1),
        "work_dir": str(system.config.work_dir),
    }
    lost = sum(1 for o in ids if o not in client.terminal_at)
    verdict = Verdict(
        drill,
        len(ids),
        lost,
        int(effects.get("duplicates", -1)),
        states.counts.get("Pending", 0) + states.counts.get("Processing", 0),
        checks,
        figures,
    )
    return verdict.with_invariants(await check_system(system, ids))


def run_command(args: argparse.Namespace) -> int:
    drill = args.scenario
    try:
        overrides = dict(parse_overrides(args.overrides))
        orders = DEFAULT_ORDERS[drill] if args.orders is None else args.orders
        if orders < 1:
            raise ValueError("--orders must be at least 1")
    except ValueError as exc:
        return usage_error(exc)
    work = Path(args.work_dir or default_work_dir("drill-")).resolve()
    config = SystemConfig(
        work_dir=work,
        seed=args.seed,
        hang_seconds=HANG_SECONDS,
        hosts=HOSTS,
        settings={**base_settings(args.settings), **RACE_SETTINGS[drill], **overrides},
    )
    system = LocalSystem(config)
    return run_verdict_drill(
        args, system, lambda console: run_race(system, drill, orders, args.seed, args.timeout, console)
    )


__all__ = ["RACE_SETTINGS", "run_command", "run_race"]
