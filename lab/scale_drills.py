"""`scale-out`: several devhost hosts on one task hub, one state store and one broker, as Azure runs a scaled-out app,
with `kill -9` of a random host at seeded gaps, each restarted at once.

Contract: besides the invariants of every drill (lab/invariants.py): every order Processed; the Durable work spread
(at least as many host processes ran episodes as the drill runs hosts); hosts killed while orders ran. Figures: the
episodes and activities per host process, how the partitions ended, the attempts per order, the kills. How the hosts
share the work (devhost/durable/hub.py, devhost/singleton.py): docs/modules-lab.md.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console

from .demo import client_app, default_work_dir, make_orders, read_effects, read_states, wait_terminal
from .drill_common import Verdict, base_settings, parse_overrides, run_verdict_drill, usage_error
from .invariants import check_system, install_for
from .system import LocalSystem, SystemConfig

HOSTS = 3
DEFAULT_ORDERS = 200
DEFAULT_KILLS = 10
SETTINGS = {
    # The timer functions move to a surviving host within 2 s of their holder's death (Azure: up to one minute).
    "AzureFunctionsJobHost__singleton__listenerLockRecoveryPollingInterval": "00:00:02",
    # Partitions to spread: two per host.
    "AzureFunctionsJobHost__extensions__durableTask__storageProvider__partitionCount": str(2 * HOSTS),
}


def hub_members(system: LocalSystem) -> list[dict[str, Any]]:
    """Every host that joined the task hub: pid, episodes and activities it ran, whether it left or died."""
    db = sqlite3.connect(f"file:{system.config.work_dir / 'devhost' / 'durable.db'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT owner, pid, episodes, activities, gone FROM hosts ORDER BY rowid").fetchall()
        partitions = db.execute("SELECT partition, owner FROM partitions ORDER BY partition").fetchall()
    finally:
        db.close()
    held = Counter(owner for _, owner in partitions)
    return [
        {
            "pid": pid,
            "episodes": episodes,
            "activities": activities,
            "gone": bool(gone),
            "partitions": held.get(owner, 0),
        }
        for owner, pid, episodes, activities, gone in rows
    ]


async def run_scale_out(
    system: LocalSystem, orders: int, kills: int, gaps: tuple[float, float], seed: int, timeout: float, console: Console
) -> Verdict:
    install_for(system)
    batch = make_orders(orders, seed, system.config.reply_queue, prefix="scale")
    ids = [o.order_id for o in batch]
    rng = random.Random(f"drill:scale-out:{seed}")
    killed: list[int] = []
    async with client_app(system) as client:
        started = time.monotonic()
        await client.submit(batch)
        waiter = asyncio.create_task(wait_terminal(client, len(batch), started, timeout, console, True))
        for _ in range(kills):
            with_gap = rng.uniform(*gaps)
            done, _pending = await asyncio.wait({waiter}, timeout=with_gap)
            if done:
                break
            index = rng.randrange(system.config.hosts)
            host = system.devhosts[index]
            assert host is not None
            host.kill()
            killed.append(index)
            await asyncio.to_thread(system.start_devhost, index)
        await waiter
        elapsed = max(client.terminal_at.values(), default=time.monotonic()) - started
    effects = await read_effects(system)
    states = await read_states(system.env(), ids)
    findings = await check_system(system, ids)
    members = hub_members(system)
    ran = [m for m in members if m["episodes"] > 0]
    attempts = Counter(states.attempts.values())
    checks = {
        "every order Processed": states.counts.get("Processed", 0) == len(ids),
        f"the Durable work spread: at least {system.config.hosts} host processes ran episodes": len(ran)
        >= system.config.hosts,
        "hosts were killed while orders ran": len(killed) >= min(kills, 1),
    }
    figures: dict[str, Any] = {
        "hosts": system.config.hosts,
        "kills": len(killed),
        "killed_hosts": killed,
        "host_processes": len(members),
        "episodes_per_host_process": [m["episodes"] for m in members],
        "activities_per_host_process": [m["activities"] for m in members],
        "partitions_at_end": [m["partitions"] for m in members if not m["gone"]],
        "attempts": {str(a): n for a, n in sorted(attempts.items())},
        "elapsed_s": round(elapsed, 1),
        "work_dir": str(system.config.work_dir),
    }
    lost = sum(1 for o in ids if o not in client.terminal_at)
    verdict = Verdict(
        "scale-out",
        len(ids),
        lost,
        int(effects.get("duplicates", -1)),
        states.counts.get("Pending", 0) + states.counts.get("Processing", 0),
        checks,
        figures,
    )
    return verdict.with_invariants(findings)


def run_command(args: argparse.Namespace) -> int:
    try:
        overrides = dict(parse_overrides(args.overrides))
        orders = DEFAULT_ORDERS if args.orders is None else args.orders
        kills = DEFAULT_KILLS if args.kills is None else args.kills
        if orders < 1 or kills < 0 or not 0 <= args.min_gap <= args.max_gap:
            raise ValueError("need at least one order, no negative kill count and 0 <= --min-gap <= --max-gap")
    except ValueError as exc:
        return usage_error(exc)
    work = Path(args.work_dir or default_work_dir("drill-")).resolve()
    config = SystemConfig(
        work_dir=work, seed=args.seed, hosts=HOSTS, settings={**base_settings(args.settings), **SETTINGS, **overrides}
    )
    system = LocalSystem(config)
    return run_verdict_drill(
        args,
        system,
        lambda console: run_scale_out(
            system, orders, kills, (args.min_gap, args.max_gap), args.seed, args.timeout, console
        ),
    )


__all__ = ["HOSTS", "hub_members", "run_command", "run_scale_out"]
