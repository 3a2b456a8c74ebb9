"""The drills of the azure-storage timing profile (devhost/durable/timing.py): `idle-then-burst` (orders after a quiet
spell longer than the polling ceiling, on two hosts of one task hub), and what `host-crash --timing azure-storage`
(lab/drill.py) waits on between its kills: the restarted host holding the partitions again.

Contract of idle-then-burst: besides the invariants of every drill, every order Processed, each in its first attempt.
Figures: the quiet spell, the first order's latency after it, the time to drain the burst, attempts. Why these
settings and what they measure: docs/modules-lab.md.
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

from devhost.config import HostConfig

from .demo import client_app, default_work_dir, make_orders, read_effects, read_states, wait_terminal
from .drill_common import Verdict, base_settings, parse_overrides, run_verdict_drill, usage_error
from .invariants import check_system, install_for
from .system import LocalSystem, SystemConfig

DRILL = "idle-then-burst"
HOSTS = 2  # a scaled-out app: on one host every message is the host's own, and no poll ever delays it
DEFAULT_ORDERS = 30
WARM_ORDERS = 4  # orders before the first quiet spell, so that it follows work, as on a running app
ROUNDS = 3  # quiet spells, each followed by one order alone (the first order after idle), the last by the burst


def profile_settings(system: LocalSystem) -> Any:
    """The azure-storage timing's settings the system's devhost reads (host.json with the app settings' overrides)."""
    from devhost.durable.timing import AzureStorageSettings

    config = HostConfig.load(system.config.app_dir, environ=system.env())
    return AzureStorageSettings.from_host_json(config.extension("durableTask"))


class _Slowest(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return b


def quiet_seconds(minimum: float, maximum: float) -> float:
    """The quiet spell: the slowest backoff of a poller from its last work to the ceiling (every random factor at
    its top, 1.2), then two ceilings more, so that every poller of both hosts waits the ceiling when the burst comes."""
    from devhost.durable.timing import BackoffStrategy

    strategy, total = BackoffStrategy(minimum, maximum, _Slowest()), 0.0
    strategy.update(True)
    while strategy.current < maximum:
        total += strategy.current
        strategy.update(False)
    return round(total + 2 * maximum, 1)


def partitions_held(system: LocalSystem, pid: int) -> tuple[int, int]:
    """How many of the task hub's partitions the devhost process `pid` holds, and how many there are."""
    path = system.config.work_dir / "devhost" / "durable.db"
    if not path.exists():
        return 0, 0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        rows = db.execute("SELECT p.owner, h.pid FROM partitions p LEFT JOIN hosts h ON h.owner = p.owner").fetchall()
    except sqlite3.Error:  # the tables are not created yet
        return 0, 0
    finally:
        db.close()
    return sum(1 for _, owner_pid in rows if owner_pid == pid), len(rows)


async def wait_holding(system: LocalSystem, timeout: float) -> float:
    """Wait (a read of the hub file every 0.25 s, at most `timeout` s) until the running devhost processes hold
    every partition between them, each its fair share; returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        pids = [h.proc.pid for h in system.devhosts if h is not None and h.proc is not None and h.running]
        counts = [partitions_held(system, pid) for pid in pids]
        total = counts[0][1] if counts else 0
        if total and sum(held for held, _ in counts) == total and all(held >= total // len(pids) for held, _ in counts):
            return time.monotonic() - started
        await asyncio.sleep(0.25)
    raise TimeoutError(f"the devhost hosts did not hold their partitions within {timeout:g} s")


def _latency(client: Any, order_id: str) -> float | None:
    done = client.terminal_at.get(order_id)
    return None if done is None else round(done - client.sent_at[order_id], 2)


async def run_idle_then_burst(system: LocalSystem, orders: int, seed: int, timeout: float, console: Console) -> Verdict:
    install_for(system)
    settings = profile_settings(system) if system.config.timing == "azure-storage" else None
    ceiling = settings.max_queue_polling_s if settings is not None else 0.0
    quiet = quiet_seconds(settings.min_polling_s, ceiling) if settings is not None else 10.0
    warm = make_orders(WARM_ORDERS, seed, system.config.reply_queue, prefix="warm")
    lone = make_orders(ROUNDS, seed, system.config.reply_queue, prefix="lone")
    burst = make_orders(orders, seed, system.config.reply_queue, prefix="burst")
    ids = [o.order_id for o in (*warm, *lone, *burst)]
    quiet_spells: list[float] = []
    async with client_app(system) as client:
        await wait_holding(system, 120)
        started = time.monotonic()
        await client.submit(warm)
        await wait_terminal(client, len(warm), started, timeout, console, True)
        for batch in [[o] for o in lone] + [burst]:
            idle_from = max(client.terminal_at.values(), default=time.monotonic())
            await asyncio.sleep(max(0.0, idle_from + quiet - time.monotonic()))  # the quiet spell is the scenario
            burst_at = time.monotonic()
            quiet_spells.append(round(burst_at - idle_from, 1))
            await client.submit(batch)
            await wait_terminal(client, len(client.sent_at), burst_at, timeout, console, True)
        drained = max((client.terminal_at.get(o.order_id, 0.0) for o in burst), default=burst_at)
    effects = await read_effects(system)
    states = await read_states(system.env(), ids)
    findings = await check_system(system, ids)
    attempts = Counter(states.attempts.values())
    latencies = sorted(x for o in burst if (x := _latency(client, o.order_id)) is not None)
    checks = {
        "every order Processed": states.counts.get("Processed", 0) == len(ids),
        "every order in its first attempt, after the quiet spell too": set(attempts) == {1},
        "each quiet spell outlasted the polling ceiling": min(quiet_spells) > ceiling,
    }
    figures: dict[str, Any] = {
        "hosts": system.config.hosts,
        "timing": system.config.timing,
        "max_queue_polling_s": ceiling,
        "quiet_s": quiet_spells,
        "first_order_latency_s": [_latency(client, o.order_id) for o in lone],
        "burst_first_latency_s": _latency(client, burst[0].order_id),
        "burst_latency_s": {
            "min": latencies[0] if latencies else None,
            "p50": latencies[len(latencies) // 2] if latencies else None,
            "max": latencies[-1] if latencies else None,
        },
        "warm_first_latency_s": _latency(client, warm[0].order_id),
        "time_to_drain_s": round(drained - burst_at, 1),
        "attempts": {str(a): n for a, n in sorted(attempts.items())},
        "elapsed_s": round(time.monotonic() - started, 1),
        "work_dir": str(system.config.work_dir),
    }
    lost = sum(1 for o in ids if o not in client.terminal_at)
    unfinished = states.counts.get("Pending", 0) + states.counts.get("Processing", 0)
    verdict = Verdict(DRILL, len(ids), lost, int(effects.get("duplicates", -1)), unfinished, checks, figures)
    return verdict.with_invariants(findings)


def run_command(args: argparse.Namespace) -> int:
    try:
        overrides = dict(parse_overrides(args.overrides))
        orders = DEFAULT_ORDERS if args.orders is None else args.orders
        if orders < 1:
            raise ValueError("need at least one order")
    except ValueError as exc:
        return usage_error(exc)
    work = Path(args.work_dir or default_work_dir("drill-")).resolve()
    config = SystemConfig(
        work_dir=work,
        seed=args.seed,
        hosts=HOSTS,
        timing=args.timing,
        settings={**base_settings(args.settings), **overrides},
    )
    system = LocalSystem(config)
    return run_verdict_drill(
        args, system, lambda console: run_idle_then_burst(system, orders, args.seed, args.timeout, console)
    )


__all__ = ["DRILL", "HOSTS", "partitions_held", "quiet_seconds", "run_command", "run_idle_then_burst", "wait_holding"]
