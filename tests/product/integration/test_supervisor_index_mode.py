"""Integration: the Supervisor in `SupervisorScanMode` index (the recovery index, orderflow/recovery_index.py) against
query mode, on the embedded store with a FakeClock.

Spec: issue 12 part 4, issue 26. An entry is written before the state write that sets its CompleteBy and removed after
the write that supersedes it; a crash in between leaves a stale entry (made here by removals that fail,
`CrashedRemovals`). The state record stays the truth. Index mode must find every expired record that query mode
finds, ignore (and remove) stale entries, not end a scan early on a page of stale entries, and jump over long empty
stretches. Each comparison builds the same data twice, in lockstep on one clock, through the real writers: one
deployment in query mode (no index), one in index mode (services.index on the same store file); then one Supervisor
run on each. The writers' removals: tests/product/integration/test_recovery_index_live.py."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support.integration_support import FakeDurable, Pipeline, encode, open_pipeline, order_body

from orderflow import runtime
from orderflow.clock import FakeClock
from orderflow.embedded.store import SqliteRecoveryIndex, open_sqlite_recovery_index
from orderflow.messages import STEPS, StepName
from orderflow.ports import IndexEntry
from orderflow.records import OrderStateRecord, ProcessState, format_utc, parse_utc
from orderflow.starter import DurableStarts, try_claim
from orderflow.submission import Accepted, submit
from orderflow.supervisor import CHECKPOINT, CLOCK_SKEW, EPOCH, SupervisorRun, run_supervisor

BUCKET = 300  # RecoveryIndexBucketSeconds (the default)
WIDTH = timedelta(seconds=BUCKET)
THRESHOLD = 3


def _activity(name: str) -> Callable[[dict[str, Any]], Any]:
    """The activity as the worker calls it, from its blueprint (as tests/product/unit/test_order_workflow.py does)."""
    from support.product_app import user_function

    return user_function(name)  # type: ignore[no-any-return]


@dataclass
class Deployment:
    """One deployment of the pair: its pipeline (store, bus, services) and, in index mode, its index."""

    mode: str
    pipeline: Pipeline
    index: SqliteRecoveryIndex | None

    @property
    def services(self) -> Any:
        return self.pipeline.services

    async def record(self, order_id: str) -> OrderStateRecord:
        found = await self.services.state.get(order_id)
        assert found is not None
        return found[0]

    def entries(self) -> list[IndexEntry]:
        """Every entry of the index table, read straight from the file."""
        with sqlite3.connect(self.pipeline.store_path) as conn:
            rows = conn.execute(
                "SELECT order_id, complete_by, locked_by FROM recovery_index ORDER BY complete_by, order_id"
            ).fetchall()
        return [IndexEntry(r[0], parse_utc(r[1]), r[2]) for r in rows]


async def open_deployment(root: Path, mode: str, clock: FakeClock, **tunables: Any) -> Deployment:
    root.mkdir()
    p = await open_pipeline(root)
    p.clock = clock
    p.services.clock = clock
    p.services.tunables = replace(p.services.tunables, scan_mode=mode, failure_threshold=THRESHOLD, **tunables)
    index = open_sqlite_recovery_index(p.store_path, BUCKET) if mode == "index" else None
    p.services.index = index
    return Deployment(mode, p, index)


@dataclass
class Pair:
    """Query mode and index mode on identical data, driven in lockstep on one clock."""

    clock: FakeClock
    query: Deployment
    index: Deployment
    both: tuple[Deployment, Deployment] = field(init=False)

    def __post_init__(self) -> None:
        self.both = (self.query, self.index)

    async def submit(self, order_id: str, failure_count: int = 0) -> None:
        for d in self.both:
            assert isinstance(await submit(d.services, encode(order_body(order_id)), order_id), Accepted)
            if failure_count:  # as if earlier attempts had expired
                await d.services.state.update_with_retry(
                    order_id, lambda r: r.model_copy(update={"failure_count": failure_count})
                )

    async def claim(self, order_id: str) -> str:
        """The Starter's claim (the real try_claim: index entry first, then the record). Returns the instance id."""
        claimed = set()
        for d in self.both:
            found = await d.services.state.get(order_id)
            assert found is not None
            inp = await try_claim(d.services, *found)
            assert inp is not None
            claimed.add(f"{order_id}:{inp.attempt}")
        [instance] = claimed
        return instance

    async def call(self, activity: str, request: dict[str, Any]) -> None:
        for d in self.both:
            runtime.use_services(d.services)  # what the activity's get_services() returns on this loop
            assert await _activity(activity)(request) is True

    async def step_deadline(self, order_id: str, instance: str, step: StepName, complete_by: datetime) -> None:
        """The Scheduler's set_step_deadline activity (index entry first, then the fenced record write)."""
        await self.call(
            "set_step_deadline",
            {"orderId": order_id, "instanceId": instance, "step": step.value, "completeBy": format_utc(complete_by)},
        )

    async def finish(self, order_id: str, instance: str, outcome: str = "completed") -> None:
        attempt = int(instance.rsplit(":", 1)[1])
        for step in STEPS:
            self.clock.advance(1)  # each step its own deadline: its own entry
            await self.step_deadline(order_id, instance, step, self.clock.now() + timedelta(seconds=10))
            await self.call(
                "record_step_result",
                {"orderId": order_id, "instanceId": instance, "step": step.value, "status": "succeeded"},
            )
        await self.call(
            "finish_order",
            {
                "orderId": order_id,
                "instanceId": instance,
                "attempt": attempt,
                "outcome": outcome,
                "reason": "ok" if outcome == "completed" else "bad",
            },
        )

    async def set_position(self, at: datetime) -> None:
        """Both checkpoints at `at`; the index deployment's has written its index from the start (EPOCH)."""
        for d in self.both:
            data = {"position": format_utc(at)}
            if d is self.index:
                data["indexSince"] = format_utc(EPOCH)
            await d.services.state.put_checkpoint(CHECKPOINT, data, None)

    async def run(self) -> tuple[SupervisorRun, SupervisorRun]:
        return await run_supervisor(self.query.services), await run_supervisor(self.index.services)

    def crashing(self, crashed: bool = True) -> None:
        """From now on every writer of the index deployment crashes (or not) between its state write and the removal
        of the entry that write superseded: the entry stays, stale, as before issue 26."""
        assert self.index.index is not None
        self.index.services.index = CrashedRemovals(self.index.index) if crashed else self.index.index


class CrashedRemovals:
    """The index, its removals lost (the writer crashed after its state write): superseded entries stay."""

    def __init__(self, inner: SqliteRecoveryIndex) -> None:
        self.bucket_seconds = inner.bucket_seconds
        self.inner = inner

    async def remove(self, entry: IndexEntry) -> None:
        raise ConnectionError(f"crashed before removing {entry.id}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    clock = FakeClock()
    made = Pair(
        clock,
        await open_deployment(tmp_path / "query", "query", clock),
        await open_deployment(tmp_path / "index", "index", clock),
    )
    yield made
    runtime.reset_services()
    for d in made.both:
        if d.index is not None:
            await d.index.aclose()
        await d.pipeline.aclose()


async def reconfigure(pair: Pair, **tunables: Any) -> None:
    for d in pair.both:
        d.services.tunables = replace(d.services.tunables, **tunables)


def stale_before(d: Deployment, records: dict[str, OrderStateRecord], before: datetime) -> list[IndexEntry]:
    return [e for e in d.entries() if e.complete_by < before and not e.matches(records[e.order_id])]


# --- the seeded mix ---------------------------------------------------------------------------------------

KINDS = (
    "expired-claim",
    "expired-step",
    "expired-later-step",
    "moved-to-future",
    "finished",
    "failed",
    "at-threshold",
    "second-attempt",
    "pending",
)


@dataclass
class Mix:
    orders: dict[str, str] = field(default_factory=dict)  # order id → kind
    live: list[str] = field(default_factory=list)  # claimed last: not expired when the Supervisor runs


async def build_mix(pair: Pair, seed: int, n: int = 36) -> Mix:
    """`n` orders of every kind, spread over time (0..400 s apart: several index buckets), then `live` orders claimed
    just before the Supervisor runs. Everything claimed before the last step has expired by then, except the
    orders whose step deadline was moved past it."""
    rng = random.Random(seed)
    mix = Mix()
    horizon = pair.clock.now() + timedelta(days=2)  # past the Supervisor's run: "moved-to-future" deadlines
    for i in range(n):
        kind = KINDS[i % len(KINDS)] if i < len(KINDS) else rng.choice(KINDS)
        order_id = f"o-{seed}-{i:03d}"
        mix.orders[order_id] = kind
        pair.clock.advance(rng.randint(0, 400))
        await pair.submit(order_id, failure_count=THRESHOLD - 1 if kind == "at-threshold" else 0)
        if kind == "pending":
            continue
        instance = await pair.claim(order_id)  # entry at the claim lease
        now = pair.clock.now()
        if kind == "expired-step":
            await pair.step_deadline(order_id, instance, StepName.RESERVE_INVENTORY, now + timedelta(seconds=10))
        elif kind == "expired-later-step":  # two CompleteBy changes: the lease and the first deadline go stale
            await pair.step_deadline(order_id, instance, StepName.RESERVE_INVENTORY, now + timedelta(seconds=10))
            await pair.step_deadline(order_id, instance, StepName.CHARGE_PAYMENT, now + timedelta(seconds=25))
        elif kind == "moved-to-future":  # the expired lease's entry is stale: the record's CompleteBy is later
            await pair.step_deadline(order_id, instance, StepName.RESERVE_INVENTORY, horizon)
        elif kind in ("finished", "failed"):
            await pair.finish(order_id, instance, "completed" if kind == "finished" else "failed")
        elif kind == "second-attempt":  # attempt 1 recovered (as the Supervisor writes it), attempt 2 claimed
            for d in pair.both:
                await d.services.state.update_with_retry(
                    order_id,
                    lambda r: r.model_copy(
                        update={
                            "process_state": ProcessState.PENDING,
                            "locked_by": None,
                            "complete_by": None,
                            "failure_count": 1,
                        }
                    ),
                )
            pair.clock.advance(1)
            await pair.claim(order_id)  # attempt 2's lease; attempt 1's entry is stale (another lock)
    pair.clock.advance(pair.query.services.tunables.claim_lease + timedelta(seconds=1))
    for j in range(3):
        order_id = f"o-{seed}-live-{j}"
        await pair.submit(order_id)
        await pair.claim(order_id)
        mix.live.append(order_id)
    return mix


def expected(mix: Mix) -> tuple[set[str], set[str]]:
    recovered = {
        o
        for o, k in mix.orders.items()
        if k in ("expired-claim", "expired-step", "expired-later-step", "second-attempt")
    }
    escalated = {o for o, k in mix.orders.items() if k == "at-threshold"}
    return recovered, escalated


@pytest.mark.parametrize(("seed", "page_size"), [(1, 100), (2, 2), (3, 1), (4, 5)])
async def test_index_mode_recovers_what_query_mode_recovers(pair: Pair, seed: int, page_size: int) -> None:
    """The mix built by writers that all crashed before their removals: one entry per CompleteBy (the index before
    issue 26), the most stale entries a scan can meet."""
    await reconfigure(pair, page_size=page_size)
    pair.crashing()
    mix = await build_mix(pair, seed)
    pair.crashing(False)
    every = [*mix.orders, *mix.live]
    before = {o: await pair.index.record(o) for o in every}
    assert before == {o: await pair.query.record(o) for o in every}  # the same data in both copies
    assert pair.query.entries() == []  # query mode writes no index
    now = pair.clock.now()
    stale = stale_before(pair.index, before, now)
    stale_kinds = {mix.orders[e.order_id] for e in stale}  # leases, superseded deadlines, finished, another lock
    assert stale_kinds == {
        "expired-step",
        "expired-later-step",
        "moved-to-future",
        "finished",
        "failed",
        "second-attempt",
    }

    by_query, by_index = await pair.run()

    recovered, escalated = expected(mix)
    assert (set(by_query.recovered), set(by_query.escalated)) == (recovered, escalated)
    assert (sorted(by_index.recovered), sorted(by_index.escalated)) == (
        sorted(by_query.recovered),
        sorted(by_query.escalated),
    )
    assert by_index.skipped == by_query.skipped == 0  # nothing found that was not due (a stale hit would be)
    # Index mode's probe for the next window answers the first entry, stale or not: its checkpoint may stay a little
    # behind query mode's (never ahead of it), and still reaches now - CLOCK_SKEW.
    assert by_index.position is not None and by_query.position is not None
    assert min(by_query.position, now - CLOCK_SKEW) <= by_index.position <= by_query.position
    for o in every:  # the same outcome, record for record
        assert await pair.index.record(o) == await pair.query.record(o), o
    # Every stale entry in the scanned range was seen once and deleted, and the recovery of each record removed its
    # entry: nothing is left before now; entries later than now are untouched.
    assert by_index.cost.stale == len(stale)
    handled = recovered | escalated
    left = pair.index.entries()
    assert [e for e in left if e.complete_by < now] == []
    assert {e.order_id for e in left if e.complete_by >= now} == {
        *mix.live,
        *(o for o, k in mix.orders.items() if k == "moved-to-future"),
    }
    # One point read per entry examined: each stale one once (then deleted), each live one once in its window and
    # at most once more as the probe that found the window.
    assert len(stale) + len(handled) <= by_index.cost.point_reads <= len(stale) + 2 * len(handled)

    # A second run finds nothing in either mode, and no stale entry: the recoveries removed theirs.
    pair.clock.advance(5)
    again_query, again_index = await pair.run()
    assert (again_query.scanned, again_index.scanned, again_index.cost.stale) == (0, 0, 0)


async def test_with_writers_that_remove_what_they_supersede_the_scan_meets_live_entries(pair: Pair) -> None:
    """The same mix through writers that do not crash: the only stale entries are those of the mix's second attempts,
    whose first attempt was recovered by a hand-made write (not a writer that removes)."""
    mix = await build_mix(pair, 1)
    every = [*mix.orders, *mix.live]
    before = {o: await pair.index.record(o) for o in every}
    now = pair.clock.now()
    stale = stale_before(pair.index, before, now)
    assert {mix.orders[e.order_id] for e in stale} == {"second-attempt"}
    assert len(stale) == sum(1 for k in mix.orders.values() if k == "second-attempt")
    assert all(e.matches(before[e.order_id]) for e in pair.index.entries() if e not in stale)

    by_query, by_index = await pair.run()

    recovered, escalated = expected(mix)
    assert (set(by_index.recovered), set(by_index.escalated)) == (set(by_query.recovered), set(by_query.escalated))
    assert (set(by_index.recovered), set(by_index.escalated)) == (recovered, escalated)
    assert by_index.cost.stale == len(stale)
    assert by_index.cost.point_reads <= len(stale) + 2 * len(recovered | escalated)


async def test_a_probe_whose_first_entry_is_stale_finds_the_live_one_behind_it(pair: Pair) -> None:
    """The first window is empty; the probe over [window end, now) asks for one record: its first entry is a finished
    order's (stale). The live expired record behind it must be found, not the scan ended at now."""
    start = pair.clock.now()
    await pair.set_position(start)
    pair.clock.set(start + timedelta(hours=2) - timedelta(seconds=30))
    await pair.submit("o-finished")
    pair.crashing()
    await pair.finish("o-finished", await pair.claim("o-finished"))  # four stale entries around start + 2 h
    pair.crashing(False)
    pair.clock.set(start + timedelta(hours=3) - timedelta(seconds=30))
    await pair.submit("o-expired")
    await pair.claim("o-expired")  # lease ends at start + 3 h
    pair.clock.set(start + timedelta(hours=5))

    by_query, by_index = await pair.run()

    assert by_query.recovered == by_index.recovered == ["o-expired"]
    assert by_index.cost.stale == 4
    assert pair.index.entries() == []  # the stale ones deleted by the scan, the recovered one's by its recovery


async def test_a_window_page_of_only_stale_entries_does_not_end_the_window(pair: Pair) -> None:
    """Page size 2 and five stale entries ahead of the live one, all in one window."""
    await reconfigure(pair, page_size=2)
    start = pair.clock.now()
    await pair.set_position(start)
    pair.crashing()
    for i in range(5):
        pair.clock.advance(60)
        await pair.submit(f"o-done-{i}")
        await pair.finish(f"o-done-{i}", await pair.claim(f"o-done-{i}"))
    pair.crashing(False)
    pair.clock.advance(60)
    await pair.submit("o-expired")
    await pair.claim("o-expired")
    pair.clock.advance(600)

    by_query, by_index = await pair.run()

    assert by_query.recovered == by_index.recovered == ["o-expired"]
    assert by_index.cost.stale == 5 * 4  # each finished order: its lease and three step deadlines


class QueryBudget:
    """The index, failing fast once more than `limit` queries were made (a walk over years would take minutes)."""

    def __init__(self, inner: SqliteRecoveryIndex, limit: int) -> None:
        self.bucket_seconds = inner.bucket_seconds
        self.inner = inner
        self.left = limit

    def _spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise AssertionError("the index scan walked bucket by bucket instead of jumping")

    async def page(self, *args: Any) -> Any:
        self._spend()
        return await self.inner.page(*args)

    async def first_at_or_after(self, *args: Any) -> Any:
        self._spend()
        return await self.inner.first_at_or_after(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_long_empty_stretch_is_jumped_over(pair: Pair) -> None:
    """No checkpoint yet: the scan starts at the Supervisor's EPOCH (2000), 24 years before the clock. Walking bucket by
    bucket would take ~2.5 million queries; the index jumps to the first entry."""
    await pair.submit("o-1")
    await pair.claim("o-1")
    pair.clock.advance(pair.query.services.tunables.claim_lease + timedelta(seconds=1))
    pair.index.services.index = QueryBudget(pair.index.index, 1000)  # type: ignore[arg-type]
    by_query, by_index = await pair.run()
    assert by_query.recovered == by_index.recovered == ["o-1"]
    # One empty 1 h window from EPOCH (12 bucket queries: fewer than MAX_BUCKETS_WITHOUT_JUMP, so walked), one jump,
    # then the buckets from the entry to now; a walk would be ~2.5 million.
    assert by_index.cost.queries < 40, by_index.cost  # measured: 15 (query mode: 3)
    assert by_query.cost.queries < 5, by_query.cost


async def test_an_empty_stretch_between_two_entries_is_jumped_over(pair: Pair) -> None:
    """Two expired records three days apart (a quiet weekend; the Supervisor was down), the checkpoint before the
    first. After the first entry the scan must jump to the second, not read the 864 empty buckets between them."""
    start = pair.clock.now()
    await pair.set_position(start)
    pair.clock.set(start + timedelta(hours=2))
    await pair.submit("o-friday")
    await pair.claim("o-friday")
    pair.clock.set(start + timedelta(days=3, hours=2))
    await pair.submit("o-monday")
    await pair.claim("o-monday")
    pair.clock.advance(timedelta(hours=1))
    pair.index.services.index = QueryBudget(pair.index.index, 5000)  # type: ignore[arg-type]

    by_query, by_index = await pair.run()

    assert sorted(by_query.recovered) == sorted(by_index.recovered) == ["o-friday", "o-monday"]
    gap_buckets = timedelta(days=3) / WIDTH
    assert by_index.cost.queries < 100, (  # with a jump after each empty bucket: 55 (query mode: 5)
        f"{by_index.cost.queries} index queries for {gap_buckets:.0f} empty buckets between two entries"
    )


async def test_index_mode_without_an_index_is_refused(pair: Pair) -> None:
    pair.index.services.index = None
    with pytest.raises(ValueError, match="no recovery index"):
        await run_supervisor(pair.index.services)


async def test_a_missing_index_entry_is_not_found_by_index_mode(pair: Pair) -> None:
    """The index is the only source in index mode: a record written without its entry (what the write order --
    entry first -- prevents) is not found. Shows that index mode does not fall back to the state query."""
    for d in pair.both:
        d.services.index = None  # claim without writing the entry
    await pair.submit("o-1")
    await pair.claim("o-1")
    pair.index.services.index = pair.index.index
    pair.clock.advance(pair.query.services.tunables.claim_lease + timedelta(seconds=1))
    by_query, by_index = await pair.run()
    assert (by_query.recovered, by_index.recovered) == (["o-1"], [])


# --- the write order: the entry before the record ----------------------------------------------------------


class UnreachableIndex:
    """An index whose writes fail (a crash or an outage between the index write and the record write)."""

    def __init__(self, inner: SqliteRecoveryIndex) -> None:
        self.bucket_seconds = inner.bucket_seconds
        self.inner = inner

    async def add(self, entry: IndexEntry) -> None:
        raise ConnectionError(f"index unreachable: {entry.id} not written")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_claim_whose_entry_is_not_written_is_not_made(pair: Pair) -> None:
    """try_claim writes the entry first: when that fails the record stays Pending (never Processing without an
    entry the Supervisor could find)."""
    d = pair.index
    await pair.submit("o-1")
    d.services.index = UnreachableIndex(d.index)  # type: ignore[arg-type]
    found = await d.services.state.get("o-1")
    assert found is not None
    with pytest.raises(ConnectionError):
        await try_claim(d.services, *found)
    rec = await d.record("o-1")
    assert (rec.process_state, rec.locked_by, rec.complete_by) == (ProcessState.PENDING, None, None)


async def test_a_step_deadline_whose_entry_is_not_written_is_not_set(pair: Pair) -> None:
    """set_step_deadline writes the entry first: when that fails the record keeps the CompleteBy that has an entry."""
    d = pair.index
    await pair.submit("o-1")
    instance = await pair.claim("o-1")
    lease = (await d.record("o-1")).complete_by
    d.services.index = UnreachableIndex(d.index)  # type: ignore[arg-type]
    runtime.use_services(d.services)
    with pytest.raises(ConnectionError):
        await _activity("set_step_deadline")(
            {
                "orderId": "o-1",
                "instanceId": instance,
                "step": StepName.RESERVE_INVENTORY.value,
                "completeBy": format_utc(pair.clock.now() + timedelta(hours=1)),
            }
        )
    assert (await d.record("o-1")).complete_by == lease
    assert [(e.order_id, e.complete_by) for e in d.entries()] == [("o-1", lease)]


# --- a record skipped for a reason that may pass holds the checkpoint, in both modes ---------------------------------


class DownFor:
    """A Durable client (FakeDurable) whose status route fails for the instances in `down`: the Durable HTTP API
    answering 503, which azure-functions-durable 1.x's DurableOrchestrationClient.get_status raises as a plain
    Exception."""

    def __init__(self, down: set[str]) -> None:
        self.durable = FakeDurable()
        self.down = down

    async def get_status(self, instance_id: str) -> Any:
        if instance_id in self.down:
            raise Exception("The operation failed with an unexpected status code 503")
        return await self.durable.get_status(instance_id)

    def client(self) -> DurableStarts:
        return DurableStarts(self.durable.starts, self.get_status)


async def test_a_record_whose_status_failed_is_not_passed_in_either_mode(pair: Pair) -> None:
    """Two never-started claims three hours apart (windows of 10 min, so the pass jumps from one to the other); the
    first one's status fails. Both modes must keep the checkpoint at the first one's CompleteBy (its index entry
    still matches: not deleted) and start it in a pass a day later."""
    await reconfigure(pair, scan_window=timedelta(minutes=10))
    start = pair.clock.now()
    await pair.set_position(start)
    await pair.submit("o-first")
    first = await pair.claim("o-first")
    pair.clock.advance(timedelta(hours=3))
    await pair.submit("o-second")
    await pair.claim("o-second")
    first_by = (await pair.query.record("o-first")).complete_by
    pair.clock.advance(timedelta(hours=1))
    clients = {d.mode: DownFor({first}) for d in pair.both}

    runs = [await run_supervisor(d.services, clients[d.mode].client()) for d in pair.both]

    assert [(r.restarted, r.held, r.position) for r in runs] == [(["o-second"], ["o-first"], first_by)] * 2
    assert [e.order_id for e in pair.index.entries() if e.complete_by == first_by] == ["o-first"]
    pair.clock.advance(timedelta(days=1))
    for d in pair.both:
        clients[d.mode].down.clear()
        again = await run_supervisor(d.services, clients[d.mode].client())
        assert (again.restarted, again.held) == (["o-first"], []), d.mode
        assert (await d.record("o-first")).restarts == 1


# --- the switch from query to index (issue 27: only index mode writes the index) ------------------------------------


async def test_after_a_switch_from_query_the_supervisor_reads_by_query_until_the_index_covers_every_order(
    tmp_path: Path,
) -> None:
    """In query mode nothing writes the index; an order claimed then has no entry. After the switch the Supervisor
    finds it by the CompleteBy query, and reads the index once its position passed index_since + the longest
    CompleteBy (+ CLOCK_SKEW)."""
    clock = FakeClock()
    before = await open_deployment(tmp_path / "q", "query", clock)
    assert before.services.index is None  # query mode: no write that the scan does not read
    assert isinstance(await submit(before.services, encode(order_body("o-old")), "o-old"), Accepted)
    found = await before.services.state.get("o-old")
    assert found is not None and await try_claim(before.services, *found) is not None
    first = await run_supervisor(before.services)  # a query-mode checkpoint, without indexSince
    assert first.reads == "query"
    # The same store, now in index mode (the settings change restarts every instance).
    index = open_sqlite_recovery_index(before.pipeline.store_path, BUCKET)
    before.services.tunables = replace(before.services.tunables, scan_mode="index")
    before.services.index = index
    assert before.entries() == []  # written in query mode: no entry
    clock.advance(before.services.tunables.claim_lease * 2)  # o-old expired, and it has no entry
    switched = await run_supervisor(before.services)
    assert switched.reads == "query" and switched.recovered == ["o-old"]
    t = before.services.tunables
    clock.advance(max(t.claim_lease, t.step_timeout) + CLOCK_SKEW * 3)
    # This run starts from the position the last one saved (before the cover), reads by query and moves past it ...
    assert (await run_supervisor(before.services)).reads == "query"
    assert (await run_supervisor(before.services)).reads == "index"  # ... so the next one reads the index
    await index.aclose()
    await before.pipeline.aclose()


async def test_a_new_deployment_in_index_mode_reads_the_index_at_once(tmp_path: Path) -> None:
    d = await open_deployment(tmp_path / "i", "index", FakeClock())
    assert (await run_supervisor(d.services)).reads == "index"
    back = replace(d.services.tunables, scan_mode="query")
    d.services.tunables = back
    assert (await run_supervisor(d.services)).reads == "query"
    saved = await d.services.state.get_checkpoint(CHECKPOINT)
    assert saved is not None and "indexSince" not in saved[0]  # a later switch starts a new transition
    await d.pipeline.aclose()
