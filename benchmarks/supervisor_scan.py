"""Benchmark of the Supervisor's catch-up over a day in each `SupervisorScanMode`: `query` (the CompleteBy query of the
state store) against `index` (the recovery index: one single-partition query per CompleteBy bucket, each hit verified
with a point read), the index as the writers leave it since issue 26: the live entries and the stale ones a crash
leaves (STALE_SHARE of the records). Extra mode `index_uncleaned`: one entry per CompleteBy, as before issue 26.

Data: N state records (1,000, 10,000, 100,000; 1,000 with --quick) over the 24 hours before the pass, built with the
state machine's own transitions; passes until the day is caught up, then an idle pass 10 s later. Per pass: cost,
request charge, wall time, on Cosmos every request by kind. Backends: the embedded store, and azure-cosmos against
tests/support/cosmos_server.py (a request counter, not Azure RU). Data mix and caveats: docs/modules-host.md."""

from __future__ import annotations

import asyncio
import math
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

from benchmarks._azure_cost_figures import RU_PER_ITEM_RETURNED, RU_RULES
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
# Share of the records that left one stale entry: a writer that crashed (or lost the index) between its state write
# and the removal of the entry it superseded, a Starter that lost a claim race. Not measured: an assumption.
STALE_SHARE = 0.01
CONCURRENCY = 32  # concurrent writes while loading a Cosmos copy
SIZES, QUICK_SIZES = [1000, 10000, 100000], [1000]
MODES = ("query", "index", "index_uncleaned")
# The extra mode reads ~4 stale entries per finished order (27 s at 10,000 on the embedded store): only up to here.
UNCLEANED_MAX = 10000
# The protocol server reads every document of the container for each query (it has no partitions or indexes):
# 100,000 records are left to the embedded store; `index_uncleaned` there took 5 minutes at 1,000 and is left out.
COSMOS_SIZES, COSMOS_QUICK_SIZES = [1000, 10000], [1000]
COSMOS_MODES = ("query", "index")
MAX_PASSES = 50  # catch-up passes (each handles at most SupervisorMaxResults records)
STEADY_PASSES, STEADY_EVERY = 30, 10  # after the catch-up: the Supervisor's timer (10 s) over one 300 s bucket
SERVER_LOG_LIMIT = 10000  # tests/support/cosmosdb_server.js MAX_LOG


@dataclass
class Dataset:
    """The records and index entries of one data set (deterministic from the seed)."""

    records: list[OrderStateRecord]
    live_entries: list[IndexEntry]  # the entry of each Processing record's current CompleteBy
    stale_entries: list[IndexEntry]  # what crashes left: one superseded entry of STALE_SHARE of the records
    superseded_entries: list[IndexEntry]  # every superseded CompleteBy (earlier ones, finished orders): before issue 26

    def entries(self, mode: str) -> list[IndexEntry]:
        """The index the mode reads."""
        if mode == "index":
            return self.live_entries + self.stale_entries
        return self.live_entries + self.superseded_entries if mode == "index_uncleaned" else []

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
            "superseded_entries": len(self.superseded_entries),
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
    """N records spread over SPAN, with the index entries the Starter and the Scheduler write for them; STALE_SHARE
    of the records (a second random stream: the records are those of the seed) keep one superseded entry."""
    rng = random.Random(seed)
    kinds = ["expired"] * round(n * EXPIRED) + ["live"] * round(n * LIVE) + ["pending"] * round(n * PENDING)
    kinds += ["processed"] * (n - len(kinds))
    rng.shuffle(kinds)
    records: list[OrderStateRecord] = []
    live: list[IndexEntry] = []
    superseded: list[list[IndexEntry]] = []  # per order that has some
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
            superseded.append(entries)
        else:
            live.append(entries[-1])
            superseded.append(entries[:-1])  # the claim lease at least
        records.append(rec)
    crashes = random.Random(seed + 1)
    crashed = sorted(crashes.sample(range(len(superseded)), round(n * STALE_SHARE)))
    stale = [crashes.choice(superseded[i]) for i in crashed]
    return Dataset(records, live, stale, [e for entries in superseded for e in entries])


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
    if index is not None:
        jobs += [lambda e=e: index.add(e) for e in data.entries(mode)]
    await _gather(jobs, concurrency)
    await state.put_checkpoint(CHECKPOINT, {"position": format_utc(NOW - SPAN)}, None)


@dataclass
class Pass:
    passes: int
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


async def _pass(services: Services, total: Pass | None = None, catch_up: bool = True) -> Pass:
    """Supervisor runs on one clock, their figures added to `total`: with `catch_up`, until one ends within its
    result budget (`SupervisorMaxResults`), the day caught up; else one."""
    total = total or Pass(0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0)
    started = time.perf_counter()
    while total.passes < MAX_PASSES:
        run = await run_supervisor(services)
        total.passes += 1
        total.recovered += len(run.recovered)
        total.escalated += len(run.escalated)
        total.skipped += run.skipped
        total.queries += run.cost.queries
        total.documents += run.cost.documents
        total.point_reads += run.cost.point_reads
        total.stale_entries += run.cost.stale
        total.request_charge = round(total.request_charge + run.request_charge, 2)
        if not catch_up or run.handled < services.tunables.max_results:
            break
    total.wall_ms = round(total.wall_ms + (time.perf_counter() - started) * 1000, 1)
    return total


async def _passes(
    services: Services, count: Callable[[], dict[str, int]] | None, clear: Callable[[], None] | None
) -> dict[str, Any]:
    """The catch-up over the day; an idle pass 10 s later; then STEADY_PASSES more every STEADY_EVERY s (the
    Supervisor's timer: what it costs a day once caught up), summed."""
    assert isinstance(services.clock, FakeClock)
    out: dict[str, Any] = {}
    for name in ("pass", "idle_pass", "steady"):
        if clear:
            clear()
        total = None
        for _ in range(STEADY_PASSES if name == "steady" else 1):
            services.clock.advance(0 if name == "pass" else STEADY_EVERY)
            total = await _pass(services, total, catch_up=name == "pass")
        assert total is not None
        total.requests = count() if count else None
        out[name] = asdict(total)
    return out


# --- embedded ---------------------------------------------------------------------------------------------


async def _embedded(data: Dataset) -> dict[str, Any]:
    from orderflow.embedded.store import open_sqlite_recovery_index, open_sqlite_stores

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-supervisor-") as tmp:
        for mode in MODES:
            if mode == "index_uncleaned" and len(data.records) > UNCLEANED_MAX:
                continue
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
                out[mode] = {"index_rows_before": _rows(path)}
                out[mode].update(await _passes(services, None, None))
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
            out[mode] = await _passes(services, count, server.clear_requests)
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
    sizes, cosmos_sizes = (QUICK_SIZES, COSMOS_QUICK_SIZES) if quick else (SIZES, COSMOS_SIZES)
    datasets = {n: build(n) for n in sorted({*sizes, *cosmos_sizes})}
    figures: dict[str, Any] = {"datasets": {str(n): d.counts() for n, d in datasets.items()}}
    figures["embedded"] = {str(n): asyncio.run(_embedded(datasets[n])) for n in sizes}
    problem = _cosmos_available()
    if problem is None:
        figures["cosmos_protocol_server"] = _run_cosmos(cosmos_sizes, datasets, COSMOS_MODES)
    else:
        figures["cosmos_protocol_server"] = {"skipped": problem}
    figures["modeled_azure_ru"] = {str(n): _modeled(figures["embedded"][str(n)]) for n in sizes}
    figures["cheaper_at"] = {str(n): _cheaper(figures, str(n)) for n in sizes}
    params = {
        "sizes": sizes,
        "cosmos_sizes": cosmos_sizes,
        "stale_share": STALE_SHARE,
        "span_hours": SPAN.total_seconds() / 3600,
        "expired_share": EXPIRED,
        "live_share": LIVE,
        "pending_share": PENDING,
        "bucket_seconds": BUCKET_SECONDS,
        "scan_window_seconds": int(_tunables("query").scan_window.total_seconds()),
        "page_size": _tunables("query").page_size,
        "steady": f"{STEADY_PASSES} passes every {STEADY_EVERY} s after the idle pass, summed",
        "max_results": _tunables("query").max_results,
        "checkpoint": "24 h back: passes until the day is caught up, then an idle pass 10 s later",
    }
    return figures, params


def _modeled_ru(p: dict[str, Any], mode: str, partitions: int = 1) -> float:
    """Azure RU of a pass's reads by docs/cost.md's rules (benchmarks/_azure_cost_figures.py RU_RULES): a query 3 RU
    per physical partition it visits + 1 RU per item returned (the index's ~200-byte entries too: an overestimate),
    a point read 1 RU; in index mode each stale entry's delete 5.5 RU. Query mode's CompleteBy query visits
    `partitions`; the index's queries one (a bucket is one partition; the index of live entries is small)."""
    if mode == "query":
        per_query = RU_RULES["query_cross"] * partitions
        return p["queries"] * per_query + p["documents"] * RU_PER_ITEM_RETURNED
    reads = p["queries"] * RU_RULES["query_single"] + p["documents"] * RU_PER_ITEM_RETURNED
    return reads + p["point_reads"] * RU_RULES["point_read"] + p["stale_entries"] * RU_RULES["delete"]


def _modeled(modes: dict[str, Any]) -> dict[str, Any]:
    """Modeled Azure RU of each mode's catch-up and steady passes on one physical partition, and for each the number
    of physical partitions of the state container from which query mode would cost more than index mode."""
    out: dict[str, Any] = {}
    for name in ("pass", "steady"):
        q, i = modes["query"][name], modes["index"][name]
        row: dict[str, Any] = {m: round(_modeled_ru(modes[m][name], m), 1) for m in ("query", "index")}
        out[name] = row
        per_partition = q["queries"] * RU_RULES["query_cross"]
        rest = _modeled_ru(i, "index") - q["documents"] * RU_PER_ITEM_RETURNED
        row["query_dearer_from_partitions"] = max(1, math.floor(rest / per_partition) + 1) if per_partition else None
    return out


def _cheaper(figures: dict[str, Any], n: str) -> dict[str, str]:
    """Per measure of the catch-up, the mode (`query` or `index`) that spent less ("equal" on a tie); `requests`:
    queries + point reads, what the store is asked."""
    out: dict[str, str] = {}
    for backend in ("embedded", "cosmos_protocol_server"):
        modes = figures.get(backend, {}).get(n)
        if not isinstance(modes, dict) or "query" not in modes or "index" not in modes:
            continue
        q, i = modes["query"]["pass"], modes["index"]["pass"]
        for measure in ("queries", "documents", "point_reads", "requests", "request_charge", "wall_ms"):
            a, b = (q[measure], i[measure]) if measure != "requests" else (_requests(q), _requests(i))
            out[f"{backend}.{measure}"] = "equal" if a == b else ("query" if a < b else "index")
    modeled = figures.get("modeled_azure_ru", {}).get(n)
    if modeled:
        a, b = modeled["pass"]["query"], modeled["pass"]["index"]
        out["modeled_azure_ru_1_partition"] = "equal" if a == b else ("query" if a < b else "index")
    return out


def _requests(figures: dict[str, Any]) -> int:
    return int(figures["queries"] + figures["point_reads"])
