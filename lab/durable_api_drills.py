"""`python -m devhost drill durable-api-outage`: the Durable HTTP API unreachable while attempts expire.

Contract: while devhost's switch is on (devhost/durable/http_api.py `OutageSwitch`, DEVHOST_DURABLE_API_OUTAGE_FILE)
the start and status routes answer 503; every order must still end Processed with `completed` (the hung ones in
attempt 2 with FailureCount 1, the refused ones in attempt 1 with FailureCount 0), and the Supervisor's checkpoint
must not pass a record it skipped. Then the invariants of every drill (lab/invariants.py). Steps, settings and
figures: docs/modules-lab.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from devhost.durable.http_api import OUTAGE_SETTING, ledger_of
from orderflow.messages import STEPS, OrderStatus, idempotency_key
from orderflow.records import OrderStateRecord, ProcessState, format_utc, parse_utc
from orderflow.supervisor import CHECKPOINT

from .demo import ClientApp, client_app, default_work_dir, make_orders, read_effects, read_states, simulator_json
from .drill_common import Verdict, base_settings, parse_overrides, run_verdict_drill, usage_error
from .invariants import check_system, install_for, store_path
from .lifecycle_lab import until
from .store_drills import UNFINISHED, DurableFigures, missing_effects, processed_entries, settled
from .system import LocalSystem, SystemConfig

DRILL = "durable-api-outage"
DEFAULT_ORDERS = 8
_EVERY_SECOND = "*/1 * * * * *"
# Over the chosen base (LOCAL_DEFAULTS or the sample's) and under `--set`. Nothing is killed, so the crash budget of
# orderflow/session_locks.py does not apply: 4 s steps and 3 s leases expire attempts within the outage.
SETTINGS = {
    "StepTimeoutSeconds": "4",
    "ClaimLeaseSeconds": "3",
    "StarterSchedule": _EVERY_SECOND,
    "SupervisorSchedule": _EVERY_SECOND,
    "SupervisorScanWindowSeconds": "1",
    "RetryBackoffBaseSeconds": "1",
    "RetryBackoffMaxSeconds": "2",
}
HANG_SECONDS = 6.0  # the scripted hang: longer than the 4 s step, so the attempt expires
IN_FLIGHT_WAIT_S = 30.0  # the longest the drill waits for the hung calls to reach the remote
DRAIN_S = 30.0  # after the outage every order ends within this (seconds): a stranded one never does
SUBMIT_SHARE = 0.6  # the refused orders are submitted during this share of the outage


def outage_file(work_dir: Path) -> Path:
    return work_dir / "durable-api.down"


@dataclass(frozen=True)
class Snapshot:
    """The state store at the outage's end: the Supervisor's checkpoint and the attempts expired by then."""

    position: datetime | None
    expired: dict[str, datetime]  # orderId -> CompleteBy, Processing records whose CompleteBy has passed

    def passed(self) -> list[str]:
        """The expired records the checkpoint is past (never scanned again)."""
        return sorted(o for o, by in self.expired.items() if self.position is not None and by < self.position)


async def _records(system: LocalSystem, order_ids: list[str]) -> tuple[dict[str, OrderStateRecord], Any]:
    from orderflow.adapters import open_stores

    stores = open_stores(system.env())
    try:
        checkpoint = await stores.state.get_checkpoint(CHECKPOINT)
        found = {o: await stores.state.get(o) for o in order_ids}
    finally:
        await stores.aclose()
    return {o: v[0] for o, v in found.items() if v is not None}, checkpoint


async def snapshot(system: LocalSystem, order_ids: list[str]) -> Snapshot:
    records, checkpoint = await _records(system, order_ids)  # the checkpoint first, then the records
    now = datetime.now(UTC)
    expired = {
        o: r.complete_by
        for o, r in records.items()
        if r.process_state is ProcessState.PROCESSING and r.complete_by is not None and r.complete_by < now
    }
    return Snapshot(None if checkpoint is None else parse_utc(checkpoint[0]["position"]), expired)


async def _calls_arrived(system: LocalSystem, keys: list[str]) -> bool:
    by_key = (await read_effects(system)).get("callsByKey", {})
    return all(by_key.get(k, 0) >= 1 for k in keys)


def refused(work_dir: Path) -> Counter[str]:
    """The switch's ledger: requests refused, by route."""
    path = ledger_of(outage_file(work_dir))
    if not path.exists():
        return Counter()
    return Counter(json.loads(line)["route"] for line in path.read_text().splitlines() if line.strip())


async def _outage(
    system: LocalSystem, client: ClientApp, refused_orders: list[Any], outage_for: float, order_ids: list[str]
) -> tuple[float, float, Snapshot]:
    switch = outage_file(system.config.work_dir)
    switch.touch()
    started = time.monotonic()
    try:
        gap = outage_for * SUBMIT_SHARE / len(refused_orders)
        for i, order in enumerate(refused_orders):  # one by one: their CompleteBy values more than a window apart
            await asyncio.sleep(max(0.0, started + i * gap - time.monotonic()))  # the scenario's timeline
            await client.submit([order])
        await asyncio.sleep(max(0.0, outage_for - (time.monotonic() - started)))
        seen = await snapshot(system, order_ids)  # still down: what the Supervisor's passes left
    finally:
        switch.unlink(missing_ok=True)
    return started, time.monotonic(), seen


async def run_drill(system: LocalSystem, orders: int, seed: int, outage_for: float, timeout: float) -> Verdict:
    install_for(system)
    batch = make_orders(orders, seed, system.config.reply_queue, prefix=DRILL)
    hung, during = batch[: max(1, orders // 2)], batch[max(1, orders // 2) :]
    hung_ids, during_ids = [o.order_id for o in hung], [o.order_id for o in during]
    ids = hung_ids + during_ids
    keys = [idempotency_key(o, STEPS[0].value) for o in hung_ids]
    await simulator_json(system, "/script", {k: ["hang"] for k in keys})
    async with client_app(system) as client:
        submitted = time.monotonic()
        await client.submit(hung)
        in_flight = bool(await until(lambda: _calls_arrived(system, keys), IN_FLIGHT_WAIT_S, every=0.2))
        began, ended, seen = await _outage(system, client, during, outage_for, ids)
        await until(lambda: settled(system, client, ids), min(timeout, DRAIN_S), every=0.5)  # else: stuck
        last = max(client.terminal_at.values(), default=None)
    effects = await read_effects(system)
    states = await read_states(system.env(), ids)
    records, _ = await _records(system, ids)
    by_route = refused(system.config.work_dir)
    durable = DurableFigures.read(system.config.work_dir / "devhost" / "durable.db")
    lost = sum(1 for o in ids if o not in client.terminal_at or o not in states.state_of)
    stuck = sorted(o for o in ids if states.state_of.get(o) in UNFINISHED)
    processed = [o for o in ids if states.state_of.get(o) == ProcessState.PROCESSED.value]
    completed = [o for o in processed if any(s.state is OrderStatus.COMPLETED for s in client.statuses.get(o, []))]

    def shape(order_ids: list[str]) -> set[tuple[int, int, bool]]:  # (attempt, FailureCount, restarted)
        return {(r.attempt, r.failure_count, r.restarts > 0) for o in order_ids if (r := records.get(o))}

    checks = {
        "the hung calls reached the remote before the outage": in_flight,
        "attempts of both kinds expired during the outage": any(o in seen.expired for o in hung_ids)
        and any(o in seen.expired for o in during_ids),
        "status requests refused during the outage": by_route["status"] > 0,
        "start requests refused during the outage": by_route["start"] > 0,
        "the Supervisor's checkpoint was not past any expired attempt at the outage's end": not seen.passed(),
        "every order Processed with `completed`": len(completed) == len(ids),
        "no order entered Processed twice (transition audit)": all(
            n <= 1 for n in processed_entries(store_path(system.env()), ids).values()
        ),
        "one effect per step of every Processed order": missing_effects(effects, processed) == 0,
        "hung orders: recovered once (attempt 2, FailureCount 1)": shape(hung_ids) == {(2, 1, False)},
        "refused orders: started again in attempt 1 (FailureCount 0)": shape(during_ids) == {(1, 0, True)},
    }
    figures: dict[str, Any] = {
        "outage_s": round(ended - began, 2),
        "refused_by_route": dict(sorted(by_route.items())),
        "status_refused": by_route["status"],
        "start_refused": by_route["start"],
        "expired_at_outage_end": len(seen.expired),
        "checkpoint_at_outage_end": None if seen.position is None else format_utc(seen.position),
        "expired_passed_by_checkpoint": seen.passed(),
        "time_to_drain_s": None if last is None else round(max(0.0, last - ended), 2),
        "stuck_orders": stuck,
        "states": dict(states.counts),
        "attempts": {str(a): n for a, n in sorted(Counter(states.attempts.values()).items())},
        "failure_counts": {str(f): n for f, n in sorted(states.failure_counts.items())},
        "restarts": sum(r.restarts for r in records.values()),
        "failed_orchestrations": durable.failed_orchestrations,
        "elapsed_s": round((last or time.monotonic()) - submitted, 1),
        "work_dir": str(system.config.work_dir),
    }
    verdict = Verdict(DRILL, len(ids), lost, int(effects.get("duplicates", -1)), len(stuck), checks, figures)
    return verdict.with_invariants(await check_system(system, ids))


def drill_config(work_dir: Path, seed: int, settings: str, overrides: dict[str, str]) -> SystemConfig:
    return SystemConfig(
        work_dir=work_dir,
        seed=seed,
        hang_seconds=HANG_SECONDS,
        settings={**base_settings(settings), **SETTINGS, **overrides, OUTAGE_SETTING: str(outage_file(work_dir))},
    )


def run_command(args: argparse.Namespace) -> int:
    try:
        overrides = dict(parse_overrides(args.overrides))
        orders = DEFAULT_ORDERS if args.orders is None else args.orders
        outage_for = float(args.outage_for)
        if orders < 2 or outage_for <= 0:
            raise ValueError("durable-api-outage needs at least 2 orders and --outage-for > 0")
    except ValueError as exc:
        return usage_error(exc)
    work = Path(args.work_dir or default_work_dir("drill-")).resolve()
    system = LocalSystem(drill_config(work, args.seed, args.settings, overrides))
    return run_verdict_drill(args, system, lambda _: run_drill(system, orders, args.seed, outage_for, args.timeout))


__all__ = ["DRILL", "SETTINGS", "drill_config", "outage_file", "run_command", "run_drill"]
