"""`kill -9` at each commit boundary of the Durable store loses nothing.

The store reads before it writes (an episode reads the instance, its inbox and its cached timeline, replays, then
opens one write transaction), keeps each instance's history in memory between episodes, and folds the removal of
older executions' messages into the episode's transaction. Each case kills a real process (crash_child.py, SIGKILL)
at one of those boundaries, starts a new engine on the same file, and checks that the instance ends as an uncrashed
run does: same output, the same sequence of history events, every row number once, no message, work item or timer
left over.

Source of the guarantee: Durable Functions reliability (seed 004; learn.microsoft.com "Durable orchestrations":
event-sourced history, replay after a host crash, at-least-once activity execution).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from azure.durable_functions.models.history import HistoryEventType as T

from tests.host.durable.harness import HubFactory
from tests.host.sample_app.function_app import ATTEMPTS

ROOT = Path(__file__).resolve().parents[3]
ID_EVENTS = (T.TASK_SCHEDULED, T.TIMER_CREATED, T.SUB_ORCHESTRATION_INSTANCE_CREATED)
COMPLETIONS = (T.TASK_COMPLETED, T.TASK_FAILED)

CASES = [
    # An episode's reads are done and the orchestrator has replayed; its write transaction has not begun.
    pytest.param("commit:before", 3, "hello_sequence", ["Oslo", "Lima"], id="episode-between-read-and-write"),
    # Inside the episode's one transaction: inbox rows deleted, history and journal appended, the instance row and
    # the next work item written, COMMIT not reached.
    pytest.param("_apply:after", 3, "hello_sequence", ["Oslo", "Lima"], id="episode-inside-its-transaction"),
    # The episode is committed; the cached timeline is not advanced and the engine has not started the activity.
    pytest.param("_after:before", 2, "hello_sequence", ["Oslo", "Lima"], id="episode-committed-not-acted-on"),
    # The same, for an episode whose commit created a sub-orchestration.
    pytest.param("_after:before", 1, "parent", None, id="children-created-not-acted-on"),
    # Inside the transaction of a ContinueAsNew (history, journal and bookkeeping base reset).
    pytest.param("_apply:after", 2, "countdown", 2, id="continue-as-new-inside-its-transaction"),
    # An activity result: the work item was read, the write transaction (result + removal) has not begun.
    pytest.param("work_exists:after", 2, "hello_sequence", ["Oslo", "Lima"], id="result-between-read-and-write"),
    # A due timer: read, not yet fired.
    pytest.param("timer_exists:after", 1, "approval", {"timeout": 0.1}, id="timer-between-read-and-write"),
]


async def run_child(db: Path, point: str, nth: int, orchestrator: str, instance_id: str, data: Any) -> int:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.host.durable.crash_child",
        str(db),
        point,
        str(nth),
        orchestrator,
        instance_id,
        json.dumps(data),
        cwd=ROOT,
    )
    return await asyncio.wait_for(child.wait(), 60)


async def finish(db: Path, orchestrator: str, instance_id: str, data: Any, *, start: bool) -> dict[str, Any]:
    hubs = HubFactory(db)
    try:
        hub = await hubs.start()
        if start:
            await hub.engine.start_new(orchestrator, instance_id, data)
        return await hub.wait(instance_id)
    finally:
        await hubs.close()


def recorded(db: Path, instance_id: str) -> tuple[list[dict[str, Any]], list[int], int]:
    """History events, their row numbers, and the rows left in the inbox, work and timer tables (children too)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT seq, event FROM history WHERE instance_id=? ORDER BY seq", (instance_id,))
        seqs, events = zip(*[(s, json.loads(e)) for s, e in rows.fetchall()], strict=True)
        left = sum(
            conn.execute(f"SELECT COUNT(*) FROM {table} WHERE instance_id LIKE ?", (f"{instance_id}%",)).fetchone()[0]
            for table in ("inbox", "work", "timers")
        )
    return list(events), list(seqs), left


def assert_intact(db: Path, instance_id: str) -> list[int]:
    events, seqs, left = recorded(db, instance_id)
    assert seqs == list(range(len(seqs)))
    kinds = [e["EventType"] for e in events]
    assert kinds.count(T.EXECUTION_STARTED) == 1
    assert kinds.count(T.ORCHESTRATOR_STARTED) == kinds.count(T.ORCHESTRATOR_COMPLETED)
    opened = [e["EventId"] for e in events if e["EventType"] in ID_EVENTS]
    assert opened == list(range(len(opened)))  # every task id once, in order
    completed = [e["TaskScheduledId"] for e in events if e["EventType"] in COMPLETIONS]
    assert len(completed) == len(set(completed)) and set(completed) <= set(opened)
    assert left == 0
    return kinds


@pytest.mark.parametrize(("point", "nth", "orchestrator", "data"), CASES)
async def test_kill_9_at_a_store_boundary_loses_nothing(
    tmp_path: Path, point: str, nth: int, orchestrator: str, data: Any
) -> None:
    reference_db, crashed_db = tmp_path / "reference" / "durable.db", tmp_path / "crashed" / "durable.db"
    reference_db.parent.mkdir()
    crashed_db.parent.mkdir()
    instance_id = f"crash-{uuid.uuid4().hex[:8]}"
    expected = await finish(reference_db, orchestrator, instance_id, data, start=True)

    assert await run_child(crashed_db, point, nth, orchestrator, instance_id, data) == -signal.SIGKILL
    status = await finish(crashed_db, orchestrator, instance_id, None, start=False)

    assert status["runtimeStatus"] == expected["runtimeStatus"] == "Completed"
    assert status["output"] == expected["output"]
    assert assert_intact(crashed_db, instance_id) == assert_intact(reference_db, instance_id)


async def test_a_retry_after_kill_9_repeats_the_call_from_the_history_on_disk(tmp_path: Path) -> None:
    """A with-retry call's bookkeeping keeps no copy of the call: the retry takes name and input from the first
    attempt's TaskScheduled. Killed before the retry timer fires, a new engine reads that event from SQLite."""
    db = tmp_path / "durable.db"
    instance_id, key = f"crash-{uuid.uuid4().hex[:8]}", f"retry-{uuid.uuid4().hex[:8]}"
    spec = {"key": key, "fail_times": 1, "interval_ms": 100, "max_attempts": 3}
    assert await run_child(db, "timer_exists:after", 1, "retrying", instance_id, spec) == -signal.SIGKILL
    ATTEMPTS[key] = 1  # the attempt that failed in the killed process

    status = await finish(db, "retrying", instance_id, None, start=False)

    assert status["output"] == {"key": key, "attempts": 2}
    kinds = assert_intact(db, instance_id)
    assert [k for k in kinds if k not in (T.ORCHESTRATOR_STARTED, T.ORCHESTRATOR_COMPLETED)] == [
        T.EXECUTION_STARTED,
        T.TASK_SCHEDULED,
        T.TASK_FAILED,
        T.TIMER_CREATED,
        T.TIMER_FIRED,
        T.TASK_SCHEDULED,
        T.TASK_COMPLETED,
        T.EXECUTION_COMPLETED,
    ]
    events, _, _ = recorded(db, instance_id)
    first, retried = (e for e in events if e["EventType"] == T.TASK_SCHEDULED)
    assert (retried["Name"], retried["Input"]) == (first["Name"], first["Input"]) == ("flaky", json.dumps(spec))
