"""Benchmark of one Supervisor pass in each `SupervisorScanMode`: `query` (the CompleteBy query of the state store)
against `index` (the recovery index: one single-partition query per CompleteBy bucket, each hit verified with a point
read of the state record), and `index_live_only` (index mode over the live entries only: its lower bound).

Data: N state records (1,000 and 10,000; 1,000 with --quick) over the 24 hours before the pass, built with the state
machine's own transitions; a whole-day pass, then an idle pass 10 s later. Per pass: `SupervisorRun.cost`,
`request_charge`, wall time and, on Cosmos, every request by kind. Backends: the embedded store, and azure-cosmos
against tests/support/cosmos_server.py (`@vercel/cosmosdb-server`) when node and the package are present, whose RU
figure is a request count and whose bucket queries read too much. Data mix and caveats: docs/modules-host.md.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from orderflow.clock import FakeClock
from orderflow.messages import STEPS, SubmitOrder
from orderflow.ports import IndexEntry, RecoveryIndex, StateStore
from orderflow.records import OrderStateRecord, StepStatus, format_utc, instance_id
from orderflow.runtime import Services, Tunables
from orderflow.state_machine import claim, complete, record_step, set_step_deadline
from orderflow.supervisor import CHECKPOINT, run_supervisor

ANY_KEY = "dGVzdC1rZXktbm90LWEtc2VjcmV0"  # the protocol server accepts any key
NOW = datetime(2024, 6, 3, 12, 0, tzinfo=UTC)  # the pass's clock
SPAN = timedelta(hours=24)  # records created over the day before NOW; the checkpoint is this far back
LEASE = timedelta(seconds=30)  # ClaimLeaseSeconds
STEP_TIMEOUT = timedelta(seconds=10)
BUCKET_SECONDS = 300  # RecoveryIndexBucketSeconds (the default)
EXPIRED, LIVE, PENDING = 0.01, 0.01, 0.02  # shares of N; the rest is Processed
CONCURRENCY = 32  # concurrent writes while loading a Cosmos copy
MODES = ("query", "index", "index_live_only")
# On the protocol server every query reads the whole container (it has no partitions), so index mode over the stale
# entries of 10,000 orders would take hours: the server runs the 1,000-record set only, and --quick skips `index` there.
COSMOS_SIZES = [1000]
SERVER_LOG_LIMIT = 10000  # tests/support/cosmosdb_server.js MAX_LOG


@dataclass
class Dataset:
    """The records and index entries of one data set (deterministic from the seed)."""

    records: list[OrderStateRecord]
    live_entries: list[IndexEntry]  # the entry of each Processing record's current CompleteBy
    stale_entries: list[IndexEntry]  # earlier CompleteBys and finished orders

    def counts(self) -> dict[str, int]:
        by_state: dict[str, int] = {}
        for rec in self.records:
            by_state[rec.process_state.value] = by_state.get(rec.process_state.value, 0) + 1
        expired = sum(1 for e in self.live_entries if e.complete_by <= NOW)
        return {
            "records": len(self.records),
            **by_state,
            "expired": expired,
            "live_entries": len(self.live_entries),
            "stale_entries": len(self.stale_entries),
        }


def _order(order_id: str) -> SubmitOrder:
    return SubmitOrder.model_validate(
        {
            "orderId": order_id,
            "replyTo": "app-status",
            "customer": {"id": "c-1", "name": "Ada"},
            "items": [{"sku": "SKU-001", "quantity": 2, "unitPrice": "9.99"}],
            "currency": "EUR",
            "submittedAt": "2024-06-01T00:00:00+00:00",
        }
    )


def build(n: int, seed: int = 12) -> Dataset:
    """N records spread over SPAN, with the index entries the Starter and the Scheduler write for them."""
    rng = random.Random(seed)
    kinds = ["expired"] * round(n * EXPIRED) + ["live"] * round(n * LIVE) + ["pending"] * round(n * PENDING)
    kinds += ["processed"] * (n - len(kinds))
    rng.shuffle(kinds)
    records: list[OrderStateRecord] = []
    live: list[IndexEntry] = []
    stale: list[IndexEntry] = []
    for i, kind in enumerate(kinds):
        order_id = f"bench-{i:06d}"
        if kind == "live":  # claimed in the last minute: its step deadline has not passed
            t = NOW - timedelta(seconds=rng.uniform(1, 60))
        else:
            t = NOW - SPAN + timedelta(seconds=rng.uniform(60, SPAN.total_seconds() - 600))
        rec = OrderStateRecord.new(_order(order_id), t)
        if kind == "pending":
            records.append(rec)
            continue
        instance = instance_id(order_id, 1)
        rec = claim(rec, instance, t + LEASE, t)
        entries = [IndexEntry(order_id, t + LEASE, instance)]
        steps = STEPS if kind == "processed" else STEPS[: rng.randint(1, len(STEPS))]
        for k, step in enumerate(steps):
            at = t + timedelta(seconds=k + 1)
            deadline = at + (timedelta(minutes=5) if kind == "live" else STEP_TIMEOUT)
            rec = set_step_deadline(rec, instance, step, deadline, at)
            entries.append(IndexEntry(order_id, deadline, instance))
            if kind == "processed" or k < len(steps) - 1:
                rec = record_step(rec, instance, step, StepStatus.SUCCEEDED, at)
        if kind == "processed":
            done = t + timedelta(seconds=len(steps) + 1)
            rec = complete(rec, instance, done).model_copy(update={"notified_at": done})
            stale.extend(entries)
        else:
            live.append(entries[-1])
            stale.extend(entries[:-1])
        records.append(rec)
    return Dataset(records, live, stale)


def _tunables(mode: str) -> Tunables:
    base = Tunables.from_env(
        {
            "ClaimLeaseSeconds": str(int(LEASE.total_seconds())),
            "StepTimeoutSeconds": str(int(STEP_TIMEOUT.total_seconds())),
        }
    )
    return replace(base, scan_mode="index" if mode.startswith("index") else "query")


async def _gather(jobs: list[Callable[[], Awaitable[Any]]], concurrency: int) -> None:
    for start in range(0, len(jobs), concurrency):
        await asyncio.gather(*(job() for job in jobs[start : start + concurrency]))


async def _load(state: StateStore, index: RecoveryIndex | None, data: Dataset, mode: str, concurrency: int) -> None:
    jobs: list[Callable[[], Awaitable[Any]]] = [lambda r=r: state.create_if_absent(r) for r in data.records]
    if index is not None and mode != "query":
        entries = data.live_entries + (data.stale_entries if mode == "index" else [])
        jobs += [lambda e=e: index.add(e) for e in entries]
    await _gather(jobs, concurrency)
    await state.put_checkpoint(CHECKPOINT, {"position": format_utc(NOW - SPAN)}, None)


@dataclass
class Pass:
    recovered: int
    escalated: int
    skipped: int
    queries: int
    documents: int
    point_reads: int
    stale_entries: int
    request_charge: float
    wall_ms: float
    requests: dict[str, int] | None = None  # Cosmos only: what the backend received, by kind


async def _pass(services: Services, count_requests: Callable[[], dict[str, int]] | None) -> Pass:
    started = time.perf_counter()
    run = await run_supervisor(services)
    wall = time.perf_counter() - started
    return Pass(
        len(run.recovered),
        len(run.escalated),
        run.skipped,
        run.cost.queries,
        run.cost.documents,
        run.cost.point_reads,
        run.cost.stale,
        round(run.request_charge, 2),
        round(wall * 1000, 1),
        count_requests() if count_requests else None,
    )


async def _two_passes(
    services: Services, count: Callable[[], dict[str, int]] | None, clear: Callable[[], None] | None
) -> dict[str, Any]:
    """The catch-up pass over the day, then an idle pass 10 s later."""
    assert isinstance(services.clock, FakeClock)
    if clear:
        clear()
    first = await _pass(services, count)
    services.clock.advance(10)
    if clear:
        clear()
    idle = await _pass(services, count)
    return {"pass": asdict(first), "idle_pass": asdict(idle)}


# --- embedded ---------------------------------------------------------------------------------------------


async def _embedded(data: Dataset) -> dict[str, Any]:
    from orderflow.embedded.store import open_sqlite_recovery_index, open_sqlite_stores

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-supervisor-") as tmp:
        for mode in MODES:
            path = Path(tmp) / f"{mode}.db"
            orders, state = open_sqlite_stores(path)
            index = open_sqlite_recovery_index(path, BUCKET_SECONDS)
            try:
                await _load(state, index, data, mode, 1)
                services = Services(
                    orders=orders,
                    state=state,
                    bus=None,
                    tunables=_tunables(mode),
                    clock=FakeClock(NOW),
                    index=index if mode != "query" else None,
                )
                out[mode] = await _two_passes(services, None, None)
                out[mode]["index_rows_after"] = _rows(path)
            finally:
                await index.aclose()
                await state.aclose()
    return out


def _rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM recovery_index").fetchone()[0])


# --- Cosmos protocol server -------------------------------------------------------------------------------


def _cosmos_available() -> str | None:
    from tests.support.cosmos_server import missing_prerequisite

    return missing_prerequisite()


def _kind(method: str, path: str, query: bool) -> str:
    if query:
        return "query"
    if "/docs/" in path:
        return {"GET": "point_read", "DELETE": "delete"}.get(method, "write")
    if path.endswith("/docs"):
        return "write"
    return "metadata"  # partition key ranges, collection reads of the SDK


async def _cosmos(data: Dataset, endpoint: str, server: Any, modes: tuple[str, ...]) -> dict[str, Any]:
    from azure.cosmos.aio import CosmosClient

    from orderflow.azure.cosmos import CosmosNames, cosmos_recovery_index, open_cosmos_with_key

    def count() -> dict[str, int]:
        kinds: dict[str, int] = {}
        for r in server.requests():
            k = _kind(r.method, r.path, r.query)
            kinds[k] = kinds.get(k, 0) + 1
        kinds["total"] = sum(kinds.values())
        kinds["log_truncated"] = int(kinds["total"] >= SERVER_LOG_LIMIT)  # the server keeps the last 10,000 only
        return kinds

    out: dict[str, Any] = {}
    for mode in modes:
        tag = uuid.uuid4().hex[:10]
        names = CosmosNames(f"orders-{tag}", "orders", f"state-{tag}", "orderState", "supervisorCheckpoints")
        orders, state = await open_cosmos_with_key(endpoint, ANY_KEY, names)
        index = cosmos_recovery_index(CosmosClient(endpoint, credential=ANY_KEY), names, BUCKET_SECONDS)
        try:
            await _load(state, index, data, mode, CONCURRENCY)
            services = Services(
                orders=orders,
                state=state,
                bus=None,
                tunables=_tunables(mode),
                clock=FakeClock(NOW),
                index=index if mode != "query" else None,
            )
            out[mode] = await _two_passes(services, count, server.clear_requests)
        finally:
            await index.aclose()
            await state.aclose()
    return out


def _run_cosmos(sizes: list[int], datasets: dict[int, Dataset], modes: tuple[str, ...]) -> dict[str, Any]:
    from tests.support.cosmos_server import run_cosmos_server

    with run_cosmos_server() as server:
        return {str(n): asyncio.run(_cosmos(datasets[n], server.endpoint, server, modes)) for n in sizes}


# --- entry point ------------------------------------------------------------------------------------------


def run(quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    sizes = [1000] if quick else [1000, 10000]
    datasets = {n: build(n) for n in sorted({*sizes, *COSMOS_SIZES})}
    figures: dict[str, Any] = {"datasets": {str(n): d.counts() for n, d in datasets.items()}}
    figures["embedded"] = {str(n): asyncio.run(_embedded(datasets[n])) for n in sizes}
    problem = _cosmos_available()
    if problem is None:
        cosmos_modes = tuple(m for m in MODES if not (quick and m == "index"))
        figures["cosmos_protocol_server"] = _run_cosmos(COSMOS_SIZES, datasets, cosmos_modes)
    else:
        figures["cosmos_protocol_server"] = {"skipped": problem}
    params = {
        "sizes": sizes,
        "cosmos_sizes": COSMOS_SIZES,
        "span_hours": SPAN.total_seconds() / 3600,
        "expired_share": EXPIRED,
        "live_share": LIVE,
        "pending_share": PENDING,
        "bucket_seconds": BUCKET_SECONDS,
        "scan_window_seconds": int(_tunables("query").scan_window.total_seconds()),
        "page_size": _tunables("query").page_size,
        "max_results": _tunables("query").max_results,
        "checkpoint": "24 h back (the pass covers the day), then an idle pass 10 s later",
    }
    return figures, params
