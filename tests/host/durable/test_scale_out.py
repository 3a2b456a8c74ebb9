"""Several devhost hosts on one task hub (devhost/durable/hub.py): partitions spread over the members, only the
holder runs an instance's episodes, wake-ups cross hosts, and a member that dies or leaves is taken over.

The engines here share one SQLite task hub inside one process, each with its own connection, HTTP API and wake-up
socket, as separate devhost processes do (the scale-out drill, lab/scale_drills.py, runs real processes). A crash
is simulated by `stop(leave=False)` and a liveness check that reports the member dead.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections import Counter
from collections.abc import Callable

import pytest

from devhost.durable import InstanceAlreadyExists
from devhost.durable.hub import partition_of, plan_for
from devhost.durable.records import Member
from tests.host.durable.harness import WAIT, Hub, HubFactory


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def liveness() -> tuple[set[str], Callable[[Member], bool]]:
    dead: set[str] = set()
    return dead, lambda member: member.owner not in dead


async def until(condition: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), WAIT)


def ids_in(hub: Hub, count: int, *, held_by: Hub, prefix: str) -> list[str]:
    """`count` instance ids whose partition `held_by` holds."""
    assert held_by.engine.hub is not None
    found: list[str] = []
    while len(found) < count:
        candidate = new_id(prefix)
        if held_by.engine.hub.owns(candidate):
            found.append(candidate)
    return found


def test_partition_of_is_fnv1a_32_of_the_utf8_id_modulo_the_count() -> None:
    # DurableTask.AzureStorage: `Fnv1aHashHelper.ComputeHash(instanceId) % (uint)settings.PartitionCount`
    # (AzureStorageOrchestrationService.cs), FNV-1a 32-bit over UTF-8 (offset basis 2166136261, prime 16777619).
    # Published FNV-1a 32 test vectors: "a" -> 0xe40c292c, "foobar" -> 0xbf9cf968.
    assert partition_of("a", 2**32 - 1) == 0xE40C292C % (2**32 - 1)
    assert partition_of("foobar", 1000) == 0xBF9CF968 % 1000
    spread = Counter(partition_of(f"order-{n}:1", 4) for n in range(4000))
    assert set(spread) == {0, 1, 2, 3} and min(spread.values()) > 800


@pytest.mark.parametrize("partitions", [1, 4, 5, 16])
@pytest.mark.parametrize("members", [1, 2, 3, 5])
def test_the_rebalancing_rule_spreads_the_partitions_evenly_and_settles(partitions: int, members: int) -> None:
    owners = [f"m{n}" for n in range(members)]
    held: dict[int, str | None] = {p: None for p in range(partitions)}
    everyone = [Member(o, 1, 0.0, "") for o in owners]
    for _ in range(4 * partitions * members):  # each member looks in turn until nothing changes
        changed = False
        for owner in owners:
            change = plan_for(owner, lambda m: True)(everyone, held)
            for p in change.release:
                held[p] = None
            for p in change.acquire:
                if held[p] is None:
                    held[p] = owner
            changed |= bool(change.release or change.acquire)
        if not changed:
            break
    assert not changed, "the rule never settles"
    counts = Counter(held.values())
    assert None not in counts, "a partition is left without a holder"
    assert max(counts.values()) - min(counts.get(o, 0) for o in owners) <= 1


async def test_two_hosts_split_the_partitions_and_each_runs_the_episodes_of_its_own(hubs: HubFactory) -> None:
    first = await hubs.start(partition_count=4)
    second = await hubs.start(partition_count=4)
    assert first.engine.hub is not None and second.engine.hub is not None
    await until(lambda: len(first.engine.hub.mine) == 2 and len(second.engine.hub.mine) == 2)  # type: ignore[union-attr]
    assert first.engine.hub.mine.isdisjoint(second.engine.hub.mine)

    # Every instance is started through the first host's HTTP API; half of them belong to the second host.
    ids = [await first.client.start_new("hello_sequence", new_id("spread"), ["Oslo", "Rome"]) for _ in range(16)]
    for instance_id in ids:
        assert (await first.wait(instance_id))["runtimeStatus"] == "Completed"
    assert first.engine.hub.episodes > 0 and second.engine.hub.episodes > 0
    # 16 instances x 4 episodes (3 activities), each run by one host only: no episode ran twice.
    assert first.engine.hub.episodes + second.engine.hub.episodes == 16 * 4
    assert first.engine.store.stats.conflicts + second.engine.store.stats.conflicts == 0


async def test_a_start_and_an_event_through_one_host_wake_the_host_that_holds_the_instance(hubs: HubFactory) -> None:
    first = await hubs.start(partition_count=4)
    second = await hubs.start(partition_count=4)
    await until(lambda: len(second.engine.hub.mine) == 2)  # type: ignore[union-attr]
    [instance_id] = ids_in(first, 1, held_by=second, prefix="woken")
    await first.client.start_new("approval", instance_id, {"timeout": 60})
    await second.engine.wait_for_history(
        instance_id, lambda events: any(e.get("Name") == "Approval" for e in events) or len(events) >= 3, WAIT
    )
    await first.client.raise_event(instance_id, "Approval", "yes")
    # The first host waits on a status the second host's episode writes: the holder wakes it when the instance ends.
    status = await first.wait(instance_id)
    assert status["output"] == 'approved:"yes"'
    assert second.engine.hub.episodes >= 2 and first.engine.hub.episodes == 0  # type: ignore[union-attr]


async def test_a_host_that_dies_is_taken_over_its_partitions_timers_and_work_items(hubs: HubFactory) -> None:
    dead, alive = liveness()
    first = await hubs.start(partition_count=4, alive=alive)
    second = await hubs.start(partition_count=4, alive=alive)
    await until(lambda: len(second.engine.hub.mine) == 2)  # type: ignore[union-attr]
    timed = ids_in(first, 2, held_by=second, prefix="timer")
    for instance_id in timed:  # a durable timer (0.5 s) held by the second host
        await first.client.start_new("approval", instance_id, {"timeout": 0.5})
    gate = new_id("gate")
    [worker] = ids_in(first, 1, held_by=second, prefix="work")
    await first.client.start_new("waits_on_gate", worker, gate)  # its activity runs on the second host
    await until(lambda: bool(second.engine.store.pending_work()))
    second_owner = second.engine.hub.owner  # type: ignore[union-attr]

    await second.engine.stop(leave=False)  # a crash: no goodbye, partitions and work still in its name
    dead.add(second_owner)
    first.engine._woken()  # what the next look (every second) does; here at once
    await until(lambda: len(first.engine.hub.mine) == 4)  # type: ignore[union-attr]
    import threading

    from tests.host.sample_app.function_app import GATES

    GATES.setdefault(gate, threading.Event()).set()
    assert (await first.wait(worker))["output"] == f"ran {gate}"
    for instance_id in timed:
        assert (await first.wait(instance_id))["output"] == "timeout"
    owners = {m.owner: m for m in first.engine.store.all_members()}
    assert second_owner in owners and second_owner not in {m.owner for m in first.engine.store.members()}


async def test_a_host_that_leaves_gives_its_partitions_back_at_once(hubs: HubFactory) -> None:
    first = await hubs.start(partition_count=4)
    second = await hubs.start(partition_count=4)
    await until(lambda: len(second.engine.hub.mine) == 2)  # type: ignore[union-attr]
    await hubs.stop(second)
    await until(lambda: len(first.engine.hub.mine) == 4)  # type: ignore[union-attr]
    instance_id = await first.client.start_new("hello_sequence", new_id("after"), ["Lima"])
    assert (await first.wait(instance_id))["runtimeStatus"] == "Completed"


async def test_an_episode_whose_partition_moved_commits_nothing_and_the_new_holder_runs_it(
    hubs: HubFactory,
) -> None:
    first = await hubs.start(partition_count=1)
    second = await hubs.start(partition_count=1)
    assert first.engine.hub is not None and second.engine.hub is not None
    assert first.engine.hub.mine == {0} and second.engine.hub.mine == set()
    instance_id = await first.client.start_new("approval", new_id("fenced"), {"timeout": 60})
    await first.engine.wait_for_history(instance_id, lambda events: len(events) >= 3, WAIT)
    # The partition goes to the second host behind the first one's back (as when a look of the second one finds the
    # first dead while it still runs): the first host's next episode must not commit.
    first.engine.store._db.execute("UPDATE partitions SET owner=?", (second.engine.hub.owner,))
    before = first.engine.hub.episodes
    await first.client.raise_event(instance_id, "Approval", "late")
    status = await first.wait(instance_id)
    assert status["output"] == 'approved:"late"'
    assert first.engine.hub.episodes == before  # refused by the fence, nothing written by the first host
    assert second.engine.hub.episodes == 1  # the holder ran it, once
    assert first.engine.hub.mine == set() and second.engine.hub.mine == {0}


async def test_a_second_start_of_a_running_id_through_another_host_is_refused(hubs: HubFactory) -> None:
    # StartNewAsync's dedupe holds across hosts: the status check and the create are one transaction.
    first = await hubs.start(partition_count=4)
    second = await hubs.start(partition_count=4)
    instance_id = await first.client.start_new("approval", new_id("dedupe"), {"timeout": 60})
    with pytest.raises(InstanceAlreadyExists):
        await second.engine.start_new("approval", instance_id, {"timeout": 60})


async def test_the_looks_of_a_host_alone_on_its_hub_write_nothing(hubs: HubFactory) -> None:
    # A lone host (the default, and every test that counts commits) pays nothing for scale-out once it has started.
    hub = await hubs.start()
    instance_id = await hub.client.start_new("hello_sequence", new_id("alone"), ["Lima"])
    assert (await hub.wait(instance_id))["runtimeStatus"] == "Completed"
    before = hub.engine.store.stats.snapshot()
    for _ in range(3):
        await hub.engine._look()
    assert hub.engine.store.stats == before
    assert hub.engine.hub is not None and hub.engine.hub.mine == {0, 1, 2, 3}


async def test_a_wake_up_whose_look_fails_is_read_by_the_next_look(hubs: HubFactory) -> None:
    first = await hubs.start(partition_count=4)
    second = await hubs.start(partition_count=4)
    await until(lambda: len(second.engine.hub.mine) == 2)  # type: ignore[union-attr]
    store = second.engine.store
    real = store.instances_with_inbox
    failures = []

    def busy_once() -> list[str]:
        if not failures:
            failures.append(1)
            raise sqlite3.OperationalError("database is locked")  # the hub file busy past its timeout
        return real()

    store.instances_with_inbox = busy_once  # type: ignore[method-assign]
    [instance_id] = ids_in(first, 1, held_by=second, prefix="owed")
    await first.client.start_new("hello_sequence", instance_id, ["Kyiv"])
    # The wake-up's look failed before it read the inbox; the periodic look (every second) owes that read.
    assert (await first.wait(instance_id))["runtimeStatus"] == "Completed"
    assert failures == [1]


async def test_a_message_committed_by_a_host_that_died_before_its_wake_up_is_read_by_the_host_that_finds_it_dead(
    hubs: HubFactory,
) -> None:
    dead, alive = liveness()
    first = await hubs.start(partition_count=4, alive=alive)
    second = await hubs.start(partition_count=4, alive=alive)
    await until(lambda: len(first.engine.hub.mine) == 2 and len(second.engine.hub.mine) == 2)  # type: ignore[union-attr]
    [instance_id] = ids_in(first, 1, held_by=first, prefix="stranded")
    await first.client.start_new("approval", instance_id, {"timeout": 60})
    await first.engine.wait_for_history(instance_id, lambda events: len(events) >= 3, WAIT)
    await until(lambda: instance_id not in first.engine._running)
    assert second.engine.hub is not None
    second.engine.hub.wake_owner_of = lambda _: None  # type: ignore[method-assign]  # killed after COMMIT, before the datagram
    await second.engine.raise_event(instance_id, "Approval", "yes")
    owner = second.engine.hub.owner
    await second.engine.stop(leave=False)
    dead.add(owner)
    # The first host's own periodic look finds the member dead; the event it left for the first host's own partition
    # had no wake-up, so that look reads the first host's inboxes too.
    assert (await first.wait(instance_id))["output"] == 'approved:"yes"'


async def test_a_terminate_through_another_host_tells_the_parent_and_wakes_the_waits(hubs: HubFactory) -> None:
    first = await hubs.start(partition_count=4)
    second = await hubs.start(partition_count=4)
    await until(lambda: len(second.engine.hub.mine) == 2)  # type: ignore[union-attr]
    parent_id = new_id("parent")
    await first.client.start_new("waiting_parent", parent_id)
    child_id = f"{parent_id}-child"
    await until(lambda: (row := first.engine.store.instance(child_id)) is not None and row.status == "Running")
    holder = first if first.engine.hub.owns(child_id) else second  # type: ignore[union-attr]
    other = second if holder is first else first
    await other.client.terminate(child_id, "operator")
    assert (await holder.wait(child_id))["runtimeStatus"] == "Terminated"
    status = await other.wait(parent_id)
    assert status["runtimeStatus"] == "Completed" and "terminated" in status["output"]["error"]
