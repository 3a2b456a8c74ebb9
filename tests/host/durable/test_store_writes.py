"""What the Durable store writes per episode, counted (Store.stats) and traced (the SQL it runs).

The claims (docs/devhost.md, Durable Functions): reads come first and a write transaction is opened only when
something is written, so an idle engine and an empty inbox cost no write transaction; an episode is one commit and
every other commit is a durable input (start, activity result, timer firing, raised event), so a chain of N
activities makes 1 + (N + 1) + N commits; the instance row is updated only in the columns that changed, history
and journal rows are appended and never rewritten; the history is kept in memory between episodes (read from
SQLite only after a restart), and the context the SDK receives is, byte for byte, the recorded history as replayed.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from azure.durable_functions.models.history import HistoryEventType as T

from devhost.durable import history as h
from devhost.durable.store import Message, Store
from tests.host.durable.harness import WAIT, Hub, HubFactory
from tests.host.sample_app.function_app import COUNTER_GATES

SET_COLUMNS = re.compile(r"UPDATE instances SET (.*?) WHERE", re.S)
QUOTED = re.compile(r"'(?:[^']|'')*'")  # a value in traced SQL
EPISODE_COLUMNS = {"status", "last_updated_time", "custom_status", "output"}  # what an episode may change


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@contextmanager
def traced(store: Store) -> Iterator[list[str]]:
    """The SQL statements the store runs meanwhile, with their values."""
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    try:
        yield statements
    finally:
        store._db.set_trace_callback(None)


def contexts_of(hub: Hub, orchestrator: str) -> list[str]:
    """Every orchestrationTrigger payload the engine hands to `orchestrator` from now on."""
    seen: list[str] = []
    call = hub.invoker.call

    async def recording(fn: Any, inputs: Any, **kwargs: Any) -> Any:
        if fn.get_function_name() == orchestrator:
            seen.append(next(iter(inputs.values())))
        return await call(fn, inputs, **kwargs)

    hub.invoker.call = recording  # type: ignore[method-assign]
    return seen


def episodes(events: list[h.Event]) -> int:
    return sum(1 for e in events if e["EventType"] == T.ORCHESTRATOR_STARTED)


async def settled(hub: Hub, instance_id: str) -> None:
    """Wait until no drain of the instance runs (its last step, which finds the inbox empty, is over)."""
    drain = next((t for t in hub.engine._tasks if t.get_name() == f"durable-instance:{instance_id}"), None)
    if drain is not None:
        await asyncio.wait_for(drain, WAIT)


async def waiting_on_approval(hub: Hub) -> str:
    instance_id = await hub.client.start_new("approval", new_id("idle"), {"timeout": 600})
    await hub.engine.wait_for_history(instance_id, lambda e: any(x["EventType"] == T.TIMER_CREATED for x in e), WAIT)
    await settled(hub, instance_id)
    return instance_id


async def test_an_idle_engine_and_an_empty_inbox_check_make_no_write_transaction(hubs: HubFactory) -> None:
    first = await hubs.start()
    instance_id = await waiting_on_approval(first)
    before = first.engine.store.stats.snapshot()
    for _ in range(5):
        assert await first.engine._step(instance_id) is False  # nothing in its inbox
    assert first.engine.store.complete_work(10**9, Message(instance_id, "gone", {})) is False  # no such work item
    assert first.engine.store.stats == before
    await hubs.stop(first)

    second = await hubs.start()  # recovery: resumes the waiting instance and its timer by reading
    # Its start-up writes only its membership of the hub (devhost/durable/hub.py): joining, and taking the partitions
    # the first engine gave back when it stopped; both change rows.
    assert second.engine.store.stats.write_transactions == 2
    assert second.engine.store.stats.idle_writes == 0
    assert await second.engine._step(instance_id) is False
    assert second.engine.store.stats.write_transactions == 2
    await second.client.raise_event(instance_id, "Approval", "ok")
    assert (await second.wait(instance_id))["output"] == 'approved:"ok"'
    assert second.engine.store.stats.idle_writes == 0


async def test_a_chain_of_n_activities_makes_two_commits_per_episode_and_no_idle_write(hub: Hub) -> None:
    cities = [f"city-{n}" for n in range(6)]  # N = 7 activities (say_hello each, then shout), N + 1 episodes
    before = hub.engine.store.stats.snapshot()
    instance_id = await hub.client.start_new("hello_sequence", new_id("chain"), cities)
    assert (await hub.wait(instance_id))["runtimeStatus"] == "Completed"
    stats = hub.engine.store.stats
    count = episodes(hub.engine.store.history(instance_id))
    activities = len(cities) + 1
    assert count == activities + 1
    commits = stats.commits - before.commits
    assert commits == 1 + count + activities  # start, one per episode, one per activity result
    assert commits <= 2 * count
    assert stats.write_transactions - before.write_transactions == commits
    assert stats.idle_writes == before.idle_writes and stats.rollbacks == before.rollbacks


async def test_episodes_append_history_and_update_only_changed_columns(hub: Hub) -> None:
    with traced(hub.engine.store) as statements:
        instance_id = await hub.client.start_new("hello_sequence", new_id("cols"), ["Oslo", "Lima", "Rome"])
        assert (await hub.wait(instance_id))["runtimeStatus"] == "Completed"
    writes = [s for s in statements if re.match(r"\s*(INSERT|UPDATE|DELETE|REPLACE)", s)]
    created = next(i for i, s in enumerate(writes) if s.startswith("INSERT INTO instances"))
    writes = writes[created + 1 :]  # after the start (which clears whatever an earlier instance of the id left)
    assert not [s for s in writes if re.search(r"(UPDATE|DELETE FROM) (history|journal)\b", s)]
    assert not [s for s in writes if "OR REPLACE INTO instances" in s]
    updates = [SET_COLUMNS.search(QUOTED.sub("?", s)) for s in writes if s.startswith("UPDATE instances")]
    assert len(updates) == episodes(hub.engine.store.history(instance_id))
    for update in updates:
        assert update is not None
        columns = {part.split("=")[0].strip() for part in update.group(1).split(",")}
        assert columns <= EPISODE_COLUMNS  # never the input, never the bookkeeping
    # The replay derives everything from the history (devhost/durable/shim.py): no bookkeeping is journaled.
    assert not [s for s in writes if s.startswith("INSERT INTO journal")]
    # The history stays in memory between episodes: no episode reads it back from SQLite.
    assert not [s for s in statements if re.search(r"SELECT .* FROM history", s)]


async def test_the_context_is_the_recorded_history_as_replayed_byte_for_byte(hubs: HubFactory) -> None:
    """The SDK receives what the backend always sent: json.dumps of the past events flagged IsPlayed and this
    episode's new events, whether the history came from memory or, after a restart, from SQLite."""
    first = await hubs.start()
    seen = contexts_of(first, "approval")
    instance_id = await waiting_on_approval(first)
    await hubs.stop(first)
    second = await hubs.start()
    after_restart = contexts_of(second, "approval")
    await second.client.raise_event(instance_id, "Approval", "ok")
    await second.wait(instance_id)
    seen += after_restart
    chain = contexts_of(second, "hello_sequence")
    chain_id = await second.client.start_new("hello_sequence", new_id("ctx"), ["Oslo", "Lima"])
    await second.wait(chain_id)

    for iid, contexts in ((instance_id, seen), (chain_id, chain)):
        recorded = second.engine.store.history(iid)
        assert len(contexts) == episodes(recorded) > 1
        for text in contexts:
            sent = json.loads(text)["history"]
            past = sum(1 for e in sent if e["IsPlayed"])
            new = len(sent) - past
            started = next(e for e in recorded if e["EventType"] == T.EXECUTION_STARTED)
            expected = json.dumps(
                {
                    "history": h.as_replayed(recorded[:past]) + recorded[past : past + new],
                    "instanceId": iid,
                    "isReplaying": past > 0,
                    "parentInstanceId": None,
                    "input": started.get("Input"),
                    "upperSchemaVersion": 2,
                    "upperSchemaVersionNew": 2,
                }
            )
            assert text == expected


async def held_episode(hub: Hub) -> tuple[str, threading.Event, Callable[[], None]]:
    """An eternal_counter instance whose episode for "add" is running, held open by the orchestrator's gate."""
    iid = new_id("race")
    entered, release = threading.Event(), threading.Event()
    COUNTER_GATES[iid] = (entered, release)
    await hub.client.start_new("eternal_counter", iid, 0)
    await hub.engine.wait_for_history(iid, lambda e: episodes(e) == 1, WAIT)
    await hub.client.raise_event(iid, "add", 1)
    return iid, entered, release.set


async def test_an_episode_whose_inbox_was_consumed_meanwhile_writes_nothing(hub: Hub) -> None:
    """The race of reading outside the write transaction: another writer takes the message the running episode
    read. The episode's commit finds it gone and writes nothing; the engine reads the instance again."""
    iid, entered, release = await held_episode(hub)
    assert await asyncio.to_thread(entered.wait, WAIT)
    history = hub.engine.store.history(iid)
    other = sqlite3.connect(hub.engine.db_path, isolation_level=None)  # another writer on the same file
    assert other.execute("DELETE FROM inbox WHERE instance_id=?", (iid,)).rowcount == 1
    other.close()
    before = hub.engine.store.stats.snapshot()
    release()
    await settled(hub, iid)  # the drain met the conflict, read again, found nothing and ended
    stats = hub.engine.store.stats
    assert stats.conflicts == before.conflicts + 1 and stats.rollbacks == before.rollbacks + 1
    assert stats.commits == before.commits
    assert hub.engine.store.history(iid) == history  # nothing of the episode was written
    assert iid not in hub.engine.store.timelines  # and its cached history was dropped
    await hub.engine.raise_event_token(iid, "add", '"stop"')  # the str "stop" (the client would post '"stop"')
    assert (await hub.wait(iid))["output"] == 0  # the consumed "add 1" never counted


async def test_messages_of_an_older_execution_go_in_the_next_episodes_commit(hub: Hub) -> None:
    instance_id = await waiting_on_approval(hub)
    store = hub.engine.store
    store.send(
        Message(
            instance_id,
            "an-older-execution",
            h.event_raised(h.parse_time("2030-01-01T00:00:00Z"), "Approval", '"stale"'),
        )
    )
    before = store.stats.snapshot()
    await hub.client.raise_event(instance_id, "Approval", "ok")
    assert (await hub.wait(instance_id))["output"] == 'approved:"ok"'
    assert store.stats.commits - before.commits == 2  # the raised event, then one episode that also drops the stale
    assert store.pending(instance_id, "an-older-execution").messages == []
    assert store.stats.idle_writes == 0


async def test_an_activity_result_whose_work_item_went_meanwhile_is_not_recorded(hub: Hub) -> None:
    """The race of complete_work: the work item was there when read, gone when the write transaction began."""
    instance_id = await waiting_on_approval(hub)
    store = hub.engine.store
    before = store.stats.snapshot()
    store.work_exists = lambda work_id: True  # type: ignore[method-assign]  # the read saw it
    assert (
        store.complete_work(
            12345, Message(instance_id, "x", h.task_completed(h.parse_time("2030-01-01T00:00:00Z"), 0, "1"))
        )
        is False
    )
    assert store.stats.rollbacks == before.rollbacks + 1 and store.stats.commits == before.commits
    assert store.pending(instance_id, "x").messages == []
