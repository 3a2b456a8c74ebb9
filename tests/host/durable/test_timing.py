"""The azure-storage timing profile (devhost/durable/timing.py), rule by rule on a fake clock: the queue poller's
randomized exponential backoff and its reset, the partition leases a lost host keeps until they expire, and the
visibility timeouts of what it had dequeued; then two engines on one task hub with the profile on.

Conformance sources, Azure/durabletask at 5217032961abf45846f462732a5e2813316e3747 (src/DurableTask.AzureStorage):
- BackoffPollingHelper.cs (RandomizedExponentialBackoffStrategy: RandomizationFactor 0.2, deltaBackoff = minimum,
  `UpdateDelay`), Messaging/TaskHubQueue.cs (minPollingDelay 50 ms, maxPollingDelay = MaxQueuePollingInterval,
  `backoffHelper.Reset()` after AddMessageAsync), Messaging/ControlQueue.cs and WorkItemQueue.cs (an empty poll
  waits, a batch found resets; dequeued with Control/WorkItemQueueVisibilityTimeout);
- AzureStorageOrchestrationServiceSettings.cs (LeaseInterval 30 s, LeaseAcquireInterval 10 s, the visibility
  timeouts 5 min, MaxQueuePollingInterval 30 s), Partitioning/TablePartitionManager.cs (the loop sleeps
  AcquireInterval; TryClaimLease takes an expired lease; ClaimLease: ExpiresAt = UtcNow.AddMinutes(1); RenewLease:
  UtcNow + LeaseInterval);
- Azure/azure-functions-durable-extension v3.x (92fecfc6671568adaf62531544f26d2197d3f271)
  src/WebJobs.Extensions.DurableTask/Options/AzureStorageOptions.cs (the host.json keys and defaults, `Validate`).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.durable_functions.models.history import HistoryEventType as T

from devhost.config import ConfigError, HostConfig
from devhost.durable.hub import plan_for
from devhost.durable.records import InstanceRow, Leases, Member, Message
from devhost.durable.store import Store
from devhost.durable.timing import (
    AzureStorageSettings,
    AzureStorageTiming,
    BackoffPoller,
    BackoffStrategy,
    LocalTiming,
    Released,
    timing_for,
)
from devhost.timing_option import TIMINGS
from tests.host.durable.harness import WAIT, HubFactory

REPO = Path(__file__).resolve().parents[3]


class Fixed(random.Random):
    """A random source whose every factor is `value` (the strategy draws uniform(0.8, 1.2))."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def uniform(self, a: float, b: float) -> float:
        assert (a, b) == (0.8, 1.2)
        return self.value


# ---- the queue poller's backoff ----------------------------------------------------------------------------------
def test_the_backoff_starts_at_zero_and_doubles_its_increment_up_to_the_ceiling() -> None:
    strategy = BackoffStrategy(0.05, 5.0, Fixed(1.0))
    waits = [strategy.current] + [strategy.update(False) for _ in range(10)]
    # min, then min + min * 2^(n-1): 50, 100, 150, 250, 450, 850, 1650, 3250 ms, then 6450 > 5 s: the ceiling.
    assert [round(w * 1000) for w in waits] == [0, 50, 100, 150, 250, 450, 850, 1650, 3250, 5000, 5000]


def test_the_backoff_is_randomized_by_up_to_a_fifth_of_each_increment() -> None:
    low, high = BackoffStrategy(0.05, 30.0, Fixed(0.8)), BackoffStrategy(0.05, 30.0, Fixed(1.2))
    for _ in range(4):
        low.update(False), high.update(False)
    # The 4th wait: 50 ms + factor x 2^2 x 50 ms.
    assert round(low.current, 4) == 0.21 and round(high.current, 4) == 0.29
    real = BackoffStrategy(0.05, 30.0, random.Random(7))
    assert real.update(False) == 0.05
    for exponent in range(1, 12):  # the n-th increment is min x 2^(n-1) x [0.8, 1.2)
        wait = real.update(False)
        assert (
            wait == 30.0 or 0.05 + 0.8 * 2 ** (exponent - 1) * 0.05 <= wait <= 0.05 + 1.2 * 2 ** (exponent - 1) * 0.05
        )


def test_work_found_resets_the_backoff_to_the_minimum_and_the_next_increment_to_the_first() -> None:
    strategy = BackoffStrategy(0.05, 30.0, Fixed(1.0))
    for _ in range(12):
        strategy.update(False)
    assert strategy.current == 30.0
    assert strategy.update(True) == 0.05
    assert round(strategy.update(False), 3) == 0.1  # exponent 1 again: min + min x 2^0


def test_a_ceiling_below_the_minimum_polls_at_the_minimum() -> None:
    # TaskHubQueue: `if (maxPollingDelay < minPollingDelay) maxPollingDelay = minPollingDelay`.
    poller = BackoffPoller(0.05, 0.01, Fixed(1.0))
    assert poller.strategy.maximum == 0.05


class FakeTime:
    """The poller's sleep on a fake clock: a wait of s seconds moves the clock s seconds (or less: never, here)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    async def sleep(self, _event: asyncio.Event, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


async def test_a_message_from_another_host_waits_for_the_next_poll_at_most_one_ceiling() -> None:
    clock = FakeTime()
    poller = BackoffPoller(0.05, 5.0, Fixed(1.2), sleep=clock.sleep)
    arrives, polled_at, found_at = 20.0, [], []

    def poll() -> bool:
        polled_at.append(clock.now)
        if found_at and polled_at.index(found_at[0]) + 3 < len(polled_at) - 1:
            raise Released
        if clock.now >= arrives and not found_at:
            found_at.append(clock.now)
            return True
        return False

    await asyncio.wait_for(poller.run(poll), WAIT)
    assert arrives < found_at[0] <= arrives + 5.0  # idle: the poll before it was one ceiling earlier
    assert found_at[0] - max(t for t in polled_at if t < arrives) == 5.0
    after = polled_at[polled_at.index(found_at[0]) + 1 :]
    # Found: the next poll at once, the next after a signaled wait (at once too), then 50 ms, 110 ms, ...
    assert [round(t - found_at[0], 3) for t in after] == [0.0, 0.0, 0.05, 0.16]


async def test_a_reset_ends_the_wait_at_once_and_the_next_waits_start_again_from_the_minimum() -> None:
    clock = FakeTime()
    poller = BackoffPoller(0.05, 5.0, Fixed(1.0), sleep=clock.sleep)
    for _ in range(12):
        assert await poller.wait() is False
    assert poller.strategy.current == 5.0
    poller.reset()  # a message this host enqueued (TaskHubQueue.AddMessageAsync)
    waited = len(clock.waits)
    assert await poller.wait() is True and len(clock.waits) == waited  # no sleep at all
    assert poller.strategy.current == 0.05


# ---- the settings ------------------------------------------------------------------------------------------------
def test_the_providers_defaults_when_host_json_says_nothing() -> None:
    s = AzureStorageSettings.from_host_json({})
    assert (s.max_queue_polling_s, s.control_queue_visibility_s, s.work_item_visibility_s) == (30.0, 300.0, 300.0)
    assert (s.lease_interval_s, s.lease_acquire_interval_s, s.claim_lease_s, s.min_polling_s) == (30, 10, 60, 0.05)


def test_the_products_host_json_polls_every_5_s_at_most() -> None:
    durable = HostConfig.load(REPO, environ={}).extension("durableTask")
    assert AzureStorageSettings.from_host_json(durable).max_queue_polling_s == 5.0


def test_host_json_keys_are_read_case_insensitively_and_validated_as_the_extension_does() -> None:
    s = AzureStorageSettings.from_host_json(
        {
            "storageProvider": {
                "MaxQueuePollingInterval": "00:00:02",
                "controlqueuevisibilitytimeout": "00:02:00",
                "workItemQueueVisibilityTimeout": "00:01:00",
            }
        }
    )
    assert (s.max_queue_polling_s, s.control_queue_visibility_s, s.work_item_visibility_s) == (2.0, 120.0, 60.0)
    for bad in ("00:00:59", "01:00:01"):  # "ControlQueueVisibilityTimeout must be between 1 and 60 minutes."
        with pytest.raises(ConfigError, match="between 1 and 60 minutes"):
            AzureStorageSettings.from_host_json({"storageProvider": {"controlQueueVisibilityTimeout": bad}})
    with pytest.raises(ConfigError, match="more than zero"):
        AzureStorageSettings.from_host_json({"storageProvider": {"maxQueuePollingInterval": "00:00:00"}})


def test_the_profile_is_refused_for_another_provider() -> None:
    with pytest.raises(ConfigError, match="azureManaged"):
        AzureStorageSettings.from_host_json({"storageProvider": {"type": "azureManaged"}})
    assert isinstance(timing_for("local", {"storageProvider": {"type": "azureManaged"}}), LocalTiming)
    assert TIMINGS == ("local", "azure-storage")
    with pytest.raises(ConfigError):
        timing_for("fast", {})


# ---- partition leases ----------------------------------------------------------------------------------------------
def _hub_store(tmp_path: Path, *owners: str) -> Store:
    store = Store(tmp_path / "durable.db")
    store.ensure_partitions(4)
    for owner in owners:
        store.join(Member(owner, 1, 0.0, ""))
    return store


def _look(store: Store, owner: str, dead: set[str], now: float, periodic: bool = True) -> list[int]:
    plan = plan_for(owner, lambda m: m.owner not in dead, leases=True)
    change, _ = store.rebalance(owner, plan, None, Leases(now, 30.0, 60.0, periodic))
    return change.acquired


def _holders(store: Store) -> set[str | None]:
    return set(store.partition_owners().values())


def test_a_lost_hosts_fresh_lease_holds_its_partitions_for_a_minute(tmp_path: Path) -> None:
    store = _hub_store(tmp_path, "a")
    assert _look(store, "a", set(), 1000.0) == [0, 1, 2, 3]  # claimed: ExpiresAt = now + 1 min
    store.join(Member("b", 2, 0.0, ""))
    dead = {"a"}
    assert _look(store, "b", dead, 1059.9) == [] and _holders(store) == {"a"}  # dead, but its lease holds
    assert _look(store, "b", dead, 1060.0) == [0, 1, 2, 3]  # expired: TryClaimLease


def test_a_renewed_lease_runs_30_s_from_its_last_renewal(tmp_path: Path) -> None:
    store = _hub_store(tmp_path, "a")
    _look(store, "a", set(), 1000.0)
    _look(store, "a", set(), 1010.0)  # the next pass renews: now + LeaseInterval
    store.join(Member("b", 2, 0.0, ""))
    dead = {"a"}
    assert _look(store, "b", dead, 1039.9) == []
    assert _look(store, "b", dead, 1040.0) == [0, 1, 2, 3]


def test_only_the_partition_managers_pass_takes_an_expired_lease(tmp_path: Path) -> None:
    store = _hub_store(tmp_path, "a")
    _look(store, "a", set(), 1000.0)
    store.join(Member("b", 2, 0.0, ""))
    assert _look(store, "b", {"a"}, 2000.0, periodic=False) == []  # a look woken by another host's datagram
    assert _look(store, "b", {"a"}, 2000.0, periodic=True) == [0, 1, 2, 3]


def test_a_host_alive_but_stuck_loses_its_partitions_when_its_lease_runs_out(tmp_path: Path) -> None:
    store = _hub_store(tmp_path, "a")
    _look(store, "a", set(), 1000.0)
    store.join(Member("b", 2, 0.0, ""))
    assert _look(store, "b", set(), 1059.0) == []  # "a" is alive and holds them all, its leases unexpired
    assert _look(store, "b", set(), 1061.0) == [0, 1]  # it has not renewed them: b takes its share of them


def test_without_leases_a_dead_hosts_partitions_are_free_at_once(tmp_path: Path) -> None:
    # The local timing, for contrast: devhost judges the process dead and frees its partitions at the next look.
    store = _hub_store(tmp_path, "a")
    _look(store, "a", set(), 1000.0)
    store.join(Member("b", 2, 0.0, ""))
    change, _ = store.rebalance("b", plan_for("b", lambda m: m.owner != "a"), None)
    assert change.acquired == [0, 1, 2, 3]


# ---- visibility timeouts -------------------------------------------------------------------------------------------
def _instance(store: Store, instance_id: str) -> None:
    """An instance whose ExecutionStarted waits in its inbox."""
    now = datetime.now(UTC).isoformat()
    store.create(InstanceRow(instance_id, "hello_sequence", "e1", "Pending", None, None, None, now, now), {"n": 0})


def test_messages_a_lost_host_dequeued_stay_hidden_from_the_others_until_the_control_visibility_timeout(
    tmp_path: Path,
) -> None:
    store = _hub_store(tmp_path, "a", "b")
    _instance(store, "i1")
    ids = [i for i, _ in store.pending("i1", "e1").messages]
    store.hide(ids, "a", until=1300.0)  # dequeued by "a" at 1000 with ControlQueueVisibilityTimeout 5 min
    assert store.pending("i1", "e1", viewer="b", now=1299.9).messages == []
    assert store.visible_inbox(1299.9) == {}
    assert [i for i, _ in store.pending("i1", "e1", viewer="a", now=1299.9).messages] == ids  # its own
    assert [i for i, _ in store.pending("i1", "e1", viewer="b", now=1300.0).messages] == ids
    assert list(store.visible_inbox(1300.0)) == ["i1"]


def test_an_episode_dequeues_what_it_reads_for_the_visibility_timeout_and_a_fenced_one_gives_it_back(
    tmp_path: Path,
) -> None:
    store = _hub_store(tmp_path, "a", "b")
    _instance(store, "i1")
    timing = AzureStorageTiming(AzureStorageSettings(control_queue_visibility_s=120.0))
    at = datetime.fromtimestamp(1000.0, UTC)
    pending = timing.dequeue(store, "a", "i1", "e1", at)  # what host "a" reads for an episode of i1
    assert len(pending.messages) == 1
    assert store.pending("i1", "e1", viewer="b", now=1119.9).messages == []
    assert len(store.pending("i1", "e1", viewer="b", now=1120.0).messages) == 1
    timing.abandon(store, pending)  # its commit was fenced: the partition's new holder reads them now
    assert len(store.pending("i1", "e1", viewer="b", now=1000.0).messages) == 1
    assert LocalTiming().dequeue(store, "a", "i1", "e1", at) == store.pending(
        "i1", "e1"
    )  # the local timing hides nothing


def test_a_work_item_a_lost_host_started_is_another_hosts_only_after_the_work_item_visibility_timeout(
    tmp_path: Path,
) -> None:
    store = _hub_store(tmp_path, "a", "b")
    store._db.execute(
        "INSERT INTO work(instance_id, execution_id, task_id, name, input, owner) VALUES "
        "('i1','e1',0,'say_hello',NULL,'a'), ('i2','e1',0,'say_hello',NULL,'a')"
    )
    started, waiting = store.pending_work()
    store.take_work(started.id, visible_at=1300.0)  # "a" ran it at 1000; the other waited for a slot
    assert [w.id for w in store.adopt_work("b", {"b"}, 1000.0)] == [waiting.id]  # never dequeued: visible
    assert store.adopt_work("b", {"b"}, 1299.9) == []
    assert [w.id for w in store.adopt_work("b", {"b"}, 1300.0)] == [started.id]


def test_an_orderly_stop_leaves_nothing_hidden(tmp_path: Path) -> None:
    store = _hub_store(tmp_path, "a", "b")
    _instance(store, "i1")
    store.hide([i for i, _ in store.pending("i1", "e1").messages], "a", until=1e12)
    store.leave("a", 0, 0)
    assert list(store.visible_inbox(0.0)) == ["i1"]


# ---- two engines on one task hub with the profile on ---------------------------------------------------------------
def _profile(**changes: float) -> AzureStorageTiming:
    # Short polling for the suite; the lease and visibility rules are the provider's, on the engines' fake clock.
    return AzureStorageTiming(AzureStorageSettings(max_queue_polling_s=0.2, **changes))


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


async def _until(condition: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), WAIT)


async def test_with_the_profile_a_start_through_another_host_is_found_by_the_holders_poll(hubs: HubFactory) -> None:
    first = await hubs.start(partition_count=4, timing=_profile())
    second = await hubs.start(partition_count=4, timing=_profile())
    assert first.engine.hub is not None and second.engine.hub is not None
    await _until(lambda: len(second.engine.hub.mine) == 2)  # type: ignore[union-attr]
    woken: list[str] = []
    first.engine.hub.wake_owner_of = woken.append  # type: ignore[method-assign]
    instance_id = next(i for i in (f"poll-{uuid.uuid4().hex[:8]}" for _ in range(100)) if second.engine.hub.owns(i))
    await first.client.start_new("hello_sequence", instance_id, ["Oslo"])
    assert (await second.wait(instance_id))["runtimeStatus"] == "Completed"
    assert woken == []  # no wake-up datagram: the holder polled its control queue
    assert second.engine.hub.episodes >= 1 and first.engine.hub.episodes == 0


async def test_with_the_profile_a_lost_hosts_partitions_and_activity_wait_for_their_lease_and_visibility(
    hubs: HubFactory,
) -> None:
    import threading

    from tests.host.sample_app.function_app import GATES

    clock, dead = Clock(), set()
    alive = lambda m: m.owner not in dead  # noqa: E731
    first = await hubs.start(partition_count=1, timing=_profile(), clock=clock, alive=alive)
    gate = f"gate-{uuid.uuid4().hex[:8]}"
    instance_id = await first.client.start_new("waits_on_gate", f"lost-{uuid.uuid4().hex[:8]}", gate)
    await _until(lambda: bool(first.engine.store.pending_work()))
    await _until(lambda: first.engine.store._db.execute("SELECT visible_at FROM work").fetchone()[0] is not None)
    assert first.engine.hub is not None
    lost = first.engine.hub.owner
    await first.engine.stop(leave=False)  # a crash: its lease, its dequeued activity message stay
    dead.add(lost)
    second = await hubs.start(partition_count=1, timing=_profile(), clock=clock, alive=alive)
    assert second.engine.hub is not None and second.engine.hub.mine == set()  # the lease (1 min from the claim)
    clock.now += timedelta(seconds=61)
    await second.engine._look(periodic=True)  # the partition manager's next pass
    assert second.engine.hub.mine == {0}
    assert second.engine.timing._poll_work(second.engine, second.engine.hub) is False  # type: ignore[attr-defined]
    GATES.setdefault(gate, threading.Event()).set()
    clock.now += timedelta(seconds=300)  # WorkItemQueueVisibilityTimeout after the dequeue
    assert (await second.wait(instance_id))["output"] == f"ran {gate}"


async def test_with_the_profile_a_durable_timer_is_read_at_the_poll_after_it_fires(hubs: HubFactory) -> None:
    # TaskHubQueue.GetVisibilityDelay: a TimerFired message is enqueued invisible until FireAt; nothing wakes the
    # poller when it becomes visible, its next poll reads it.
    clock = Clock()
    hub = await hubs.start(timing=_profile(), clock=clock)
    await hub.engine.stop()  # and started again: the same profile polls the new membership's partitions
    await hub.engine.start()
    instance_id = await hub.client.start_new("approval", f"timer-{uuid.uuid4().hex[:8]}", {"timeout": 30})
    await hub.engine.wait_for_history(instance_id, lambda events: len(events) >= 3, WAIT)
    await _until(lambda: instance_id not in hub.engine._running)
    [timer] = hub.engine.store.pending_timers()
    clock.now += timedelta(seconds=31)
    hub.engine._fire(timer)  # what the timer loop does at the fire time
    assert instance_id not in hub.engine._running  # written, not run: left to the poll
    assert (await hub.wait(instance_id))["output"] == "timeout"
    assert any(e["EventType"] == T.TIMER_FIRED for e in hub.engine.store.history(instance_id))


async def test_a_poll_hands_an_instance_over_again_only_with_a_newer_message(hubs: HubFactory) -> None:
    # A message the engine cannot consume (its instance is gone) must not make the poller spin at its minimum.
    hub = await hubs.start(partition_count=1, timing=_profile())
    timing = hub.engine.timing
    assert isinstance(timing, AzureStorageTiming)
    poll = timing._poll_control(hub.engine, 0, timing._control[0])
    hub.engine.store.send(Message("ghost", "e1", {"EventType": 6}))
    handed: list[str] = []
    hub.engine._mark = handed.append  # type: ignore[method-assign]
    assert poll() is True and handed == ["ghost"]
    assert poll() is False and handed == ["ghost"]
    hub.engine.store.send(Message("ghost", "e1", {"EventType": 6}))
    assert poll() is True and handed == ["ghost", "ghost"]
