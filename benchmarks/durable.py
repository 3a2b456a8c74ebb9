"""Benchmarks of the devhost Durable backend (devhost/durable): orchestrations per second for a
4-activity chain
at several instance counts, activity dispatch latency, the cost of an episode as the history grows (each
episode
replays the whole history, so an N-activity chain costs O(N^2) in total), what the store writes per episode
(Store.stats: commits, write transactions, idle writes, bytes), and the process's peak RSS.

The engine is built as tests/host/durable/harness.py builds it (DurableEngine + Invoker on one
asyncio loop),
without the HTTP server, which none of these measurements go through.
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from azure.durable_functions.models.history import HistoryEventType as T

from devhost.durable import DurableEngine
from devhost.durable.history import parse_time
from devhost.durable.store import StoreStats
from devhost.invoke import Invoker

from . import durable_app
from .common import latency_summary, peak_rss_self_mib, rate, rss_mib, stopwatch

FUNCTIONS = durable_app.app.get_functions()
CHAIN = "bench_chain"
MAX_CONCURRENT_ACTIVITIES = 10  # host.json extensions.durableTask.maxConcurrentActivityFunctions
TERMINAL_SQL = "SELECT COUNT(*) FROM instances WHERE status IN ('Completed', 'Failed', 'Terminated')"


@dataclass(frozen=True)
class DurableSizes:
    instance_counts: tuple[int, ...]
    chain_length: int
    dispatch_activities: int
    replay_lengths: tuple[int, ...]

    @classmethod
    def for_run(cls, quick: bool) -> DurableSizes:
        if quick:
            return cls((50,), 4, 20, (10, 50, 100))
        return cls((50, 200, 500), 4, 50, (10, 50, 100, 200, 400))


@dataclass
class Probe:
    """Times every engine step (reads + replay + commit) and every orchestrator replay call, in order; a step
    minus its replay is the engine's own part (engine_ms)."""

    steps: list[float] = field(default_factory=list)
    replays: list[float] = field(default_factory=list)


class TimedInvoker(Invoker):
    """devhost's Invoker, timing the orchestrator calls (one call = one replay of the whole history)."""

    def __init__(self, probe: Probe) -> None:
        super().__init__()
        self._probe = probe

    async def call(self, fn: Any, inputs: Any, *, invocation_id: str | None = None) -> Any:
        start = time.perf_counter()
        result = await super().call(fn, inputs, invocation_id=invocation_id)
        if fn.get_function_name() == CHAIN:
            self._probe.replays.append(time.perf_counter() - start)
        return result


def _timed_steps(step: Callable[[str], Awaitable[bool]], probe: Probe) -> Callable[[str], Awaitable[bool]]:
    async def timed(instance_id: str) -> bool:
        start = time.perf_counter()
        progressed = await step(instance_id)
        if progressed:
            probe.steps.append(time.perf_counter() - start)
        return progressed

    return timed


@asynccontextmanager
async def engine_on(db_path: Path, probe: Probe) -> AsyncIterator[DurableEngine]:
    invoker = TimedInvoker(probe)
    engine = DurableEngine(
        db_path=db_path,
        functions=FUNCTIONS,
        invoke=invoker,
        max_concurrent_activities=MAX_CONCURRENT_ACTIVITIES,
    )
    engine._step = _timed_steps(engine._step, probe)  # type: ignore[method-assign]  # instrumentation only
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()
        invoker.close()


async def wait_terminal(db_path: Path, count: int, timeout: float = 600.0) -> None:
    """Poll (own read-only connection, 10 ms) until `count` instances are terminal; bounded by `timeout`."""
    reader = sqlite3.connect(db_path)
    deadline = time.monotonic() + timeout
    try:
        while reader.execute(TERMINAL_SQL).fetchone()[0] < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count} instances did not finish within {timeout} s")
            await asyncio.sleep(0.01)
    finally:
        reader.close()


async def chain_throughput(tmp: Path, instances: int, length: int) -> dict[str, Any]:
    """Start `instances` chains of `length` activities at once; orchestrations/s and per-instance latency."""
    db_path = tmp / f"throughput-{instances}.db"
    probe = Probe()
    async with engine_on(db_path, probe) as engine:
        cpu_before = time.process_time()
        with stopwatch() as elapsed:
            ids = [await engine.start_new(CHAIN, f"chain-{instances}-{n:05d}", length) for n in range(instances)]
            await wait_terminal(db_path, instances)
        cpu = time.process_time() - cpu_before
        rows = [engine.store.instance(i) for i in ids]
        latencies = [
            (parse_time(r.last_updated_time) - parse_time(r.created_time)).total_seconds()
            for r in rows
            if r is not None
        ]
        completed = sum(1 for r in rows if r is not None and r.status == "Completed")
        dispatch = _dispatch_latencies(engine, ids)
        writes = store_writes(engine.store.stats, len(probe.steps))
    return {
        "instances": instances,
        "activities_per_instance": length,
        "completed": completed,
        "seconds": round(elapsed(), 3),
        "orchestrations_per_s": rate(instances, elapsed()),
        # CPU time of the whole process (every thread) per orchestration: steadier than rates on a shared machine.
        "cpu_ms_per_orchestration": round(cpu * 1000 / instances, 2),
        "activities_per_s": rate(instances * length, elapsed()),
        "episodes": len(probe.steps),
        "instance_latency": latency_summary(latencies),
        "dispatch_under_load": latency_summary(dispatch["dispatch"]),
        "store_writes": writes,
        "rss_after_mib": rss_mib(),
    }


def _dispatch_latencies(engine: DurableEngine, ids: list[str]) -> dict[str, list[float]]:
    """From history and the activity's own start stamps: TaskScheduled → activity start ("dispatch"), and
    TaskCompleted → the next episode's TaskScheduled ("resume": completion commit, reads, replay)."""
    dispatch: list[float] = []
    resume: list[float] = []
    for instance_id in ids:
        events = engine.store.history(instance_id)
        scheduled = [parse_time(e["Timestamp"]).timestamp() for e in events if e["EventType"] == T.TASK_SCHEDULED]
        done = [parse_time(e["Timestamp"]).timestamp() for e in events if e["EventType"] == T.TASK_COMPLETED]
        for index, at in enumerate(scheduled):
            started = durable_app.STARTS.get((instance_id, index))
            if started is not None:
                dispatch.append(max(0.0, started - at))
        resume.extend(max(0.0, nxt - fin) for fin, nxt in zip(done, scheduled[1:], strict=False))
    return {"dispatch": dispatch, "resume": resume}


async def dispatch_latency(tmp: Path, activities: int) -> dict[str, Any]:
    """One chain alone on an idle engine: the unloaded cost of each hop between activities."""
    db_path = tmp / "dispatch.db"
    probe = Probe()
    async with engine_on(db_path, probe) as engine:
        instance_id = await engine.start_new(CHAIN, "dispatch-1", activities)
        await wait_terminal(db_path, 1)
        found = _dispatch_latencies(engine, [instance_id])
    return {
        "activities": activities,
        "scheduled_to_activity_start": latency_summary(found["dispatch"]),
        "completed_to_next_scheduled": latency_summary(found["resume"]),
        "episode": latency_summary(probe.steps),
    }


async def replay_cost(tmp: Path, length: int) -> dict[str, Any]:
    """One chain of `length` activities: episode k replays ~2k+3 history events, so episode time grows
    with k."""
    db_path = tmp / f"replay-{length}.db"
    probe = Probe()
    async with engine_on(db_path, probe) as engine:
        with stopwatch() as elapsed:
            instance_id = await engine.start_new(CHAIN, f"replay-{length}", length)
            await wait_terminal(db_path, 1)
        history_events = len(engine.store.history(instance_id))
        writes = store_writes(engine.store.stats, len(probe.steps))
    steps_ms = [s * 1000 for s in probe.steps]
    replays_ms = [s * 1000 for s in probe.replays]
    own_ms = [step - replay for step, replay in zip(steps_ms, replays_ms, strict=True)]
    return {
        "activities": length,
        "history_events": history_events,
        "episodes": len(steps_ms),
        "total_s": round(elapsed(), 3),
        "per_activity_ms": round(elapsed() * 1000 / length, 3),
        "episode_ms_first": round(steps_ms[0], 3),
        "episode_ms_median": round(statistics.median(steps_ms), 3),
        "episode_ms_last": round(steps_ms[-1], 3),
        "episode_ms_sum": round(sum(steps_ms), 1),
        "replay_ms_first": round(replays_ms[0], 3),
        "replay_ms_last": round(replays_ms[-1], 3),
        "replay_us_per_history_event": round(_slope(replays_ms) * 1000 / 2, 2),
        "engine_ms_median": round(statistics.median(own_ms), 3),
        "engine_ms_last": round(own_ms[-1], 3),
        "store_writes": writes,
    }


def store_writes(stats: StoreStats, episodes: int) -> dict[str, Any]:
    """What the store wrote over a run, per episode: commits (write transactions that committed), write
    transactions, idle writes (write transactions that changed no row; 0 is the claim), and the text bound to
    INSERT/UPDATE statements, by table."""
    per = max(episodes, 1)
    return {
        "episodes": episodes,
        "commits": stats.commits,
        "write_transactions": stats.write_transactions,
        "idle_writes": stats.idle_writes,
        "conflicts": stats.conflicts,
        "commits_per_episode": round(stats.commits / per, 3),
        "write_transactions_per_episode": round(stats.write_transactions / per, 3),
        "bytes_per_episode": round(stats.bytes_written / per, 1),
        "bytes_per_episode_by_table": {k: round(v / per, 1) for k, v in sorted(stats.bytes_by_table.items())},
    }


def _slope(values: list[float]) -> float:
    """Least-squares slope of values against their index (ms per episode)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    num = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values))
    den = sum((x - mean_x) ** 2 for x in range(n))
    return num / den


async def _run_all(sizes: DurableSizes) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-durable-") as tmp_name:
        tmp = Path(tmp_name)
        figures: dict[str, Any] = {"rss_start_mib": rss_mib()}
        figures["dispatch"] = await dispatch_latency(tmp, sizes.dispatch_activities)
        figures["replay"] = [await replay_cost(tmp, n) for n in sizes.replay_lengths]
        figures["throughput"] = [await chain_throughput(tmp, n, sizes.chain_length) for n in sizes.instance_counts]
        figures["peak_rss_mib"] = peak_rss_self_mib()
    return figures


def run(quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """All Durable backend benchmarks; returns (figures, parameters)."""
    sizes = DurableSizes.for_run(quick)
    params = {
        "sizes": {k: list(v) if isinstance(v, tuple) else v for k, v in sizes.__dict__.items()},
        "max_concurrent_activities": MAX_CONCURRENT_ACTIVITIES,
    }
    return asyncio.run(_run_all(sizes)), params
