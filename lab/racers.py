"""`python -m lab.racers starter|supervisor --host URL`: one more Starter or Supervisor, in a process of its
own, racing the host's own on the same state store and the same task hub, as another Functions instance would when
Azure scales out (the starter-race and supervisor-race drills).

Contract: it runs the product's own pass (`orderflow.starter.run_starter`, `orderflow.supervisor.run_supervisor`)
every `--every` seconds with its environment's app settings and a `DurableOrchestrationClient` bound to the host's
Durable HTTP API (devhost/durable/binding.py `client_binding_json`); on SIGTERM it writes what it did to `--stats`
(JSON: passes, claimed, lost races, recovered, escalated, ...). What races, and why: docs/modules-lab.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from pathlib import Path
from typing import Any

import azure.durable_functions as df

from devhost.config import HostConfig
from devhost.durable.binding import client_binding_json
from orderflow.runtime import get_services
from orderflow.starter import DurableStarts, run_starter
from orderflow.supervisor import run_supervisor

from .system import ROOT


async def race(role: str, host: str, every: float, stats: dict[str, Any], stop: asyncio.Event) -> None:
    hub = HostConfig.load(ROOT).durable_options().hub_name
    client = df.DurableOrchestrationClient(client_binding_json(host.rstrip("/"), hub))
    services = await get_services()
    while not stop.is_set():
        try:
            if role == "starter":
                run = await run_starter(services, client.start_new)
                stats["claimed"] += len(run.claimed)
                stats["lost_races"] += run.lost_race
                stats["start_failed"] += len(run.start_failed)
            else:
                result = await run_supervisor(services, DurableStarts(client.start_new, client.get_status))
                stats["recovered"] += len(result.recovered)
                stats["escalated"] += len(result.escalated)
                stats["restarted"] += len(result.restarted)
            stats["passes"] += 1
        except Exception as exc:  # noqa: BLE001 - a pass that fails is counted; the next one tries again
            stats["errors"] += 1
            stats["last_error"] = f"{type(exc).__name__}: {exc}"[:300]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.racers", description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=("starter", "supervisor"))
    parser.add_argument("--host", required=True, help="the devhost's base URL (its Durable HTTP API)")
    parser.add_argument("--every", type=float, default=0.2, help="seconds between passes (default 0.2)")
    parser.add_argument("--stats", type=Path, required=True, help="where to write the counts on SIGTERM")
    args = parser.parse_args(argv)
    stats: dict[str, Any] = {
        "role": args.role,
        "passes": 0,
        "claimed": 0,
        "lost_races": 0,
        "start_failed": 0,
        "recovered": 0,
        "escalated": 0,
        "restarted": 0,
        "errors": 0,
    }

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        print(f"racer {args.role} racing {args.host}", flush=True)
        await race(args.role, args.host, args.every, stats, stop)

    asyncio.run(run())
    args.stats.write_text(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
