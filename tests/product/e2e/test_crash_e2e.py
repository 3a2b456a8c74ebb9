"""The whole system survives `kill -9` of devhost and of the Agent in the middle of a burst of orders.

Seed 000/001, "Issues and considerations": the Scheduler's state is durable (Durable history, the state store),
messages are peek-locked, side effects are idempotent by key; after a restart every order reaches a terminal state,
none is lost and no remote side effect is applied twice. And the orders in flight at the kill finish through Durable
resumption (devhost runs the work it had persisted), not through the Supervisor's second attempt.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterator

import pytest
from support.e2e_support import FAST_SETTINGS, Client, make_order, new_order_id, running_client, short_lock_config
from support.hosted import wait_until

from lab.system import SystemConfig
from orderflow.messages import STEPS, OrderStatus
from orderflow.records import ProcessState

ORDERS = 30
# Longer than the restart gap (devhost and the Agent start again, the dead Agent's 5 s session locks expire): an order
# in flight at the kill can then finish in attempt 1 through Durable resumption (devhost runs the activity work items
# left unfinished, its timers and inbox: DurableEngine.start), and needs a second attempt only when resumption fails.
# With the 3 s of FAST_SETTINGS the restart gap alone expires most in-flight steps, and the Supervisor's second
# attempts mask a devhost that resumes nothing.
CRASH_TIMEOUT_SECONDS = "20"
# Orders that may need a second attempt although devhost resumes its work: a restart on a loaded machine can outlast a
# step. (The kill can also fall between a claim and its start_new, for a whole Starter batch; the Supervisor finds
# those attempts' orchestrations missing and starts them again in the same attempt, FailureCount unchanged:
# orderflow/supervisor.py. Before that, 13 of 30 orders needed a second attempt in one CI run and 3 of 30 in one of 3
# local runs under load.) Measured on the 2-core machine, shared with other runs, with these settings: 0 of 30 in
# each of 4 runs with resumption (and 3 more passing runs). With devhost's resumption of unfinished activity work items
# removed (DurableEngine.start), exactly the orders whose instance had work in flight at the kill needed a second
# attempt: 15, 13 and 14 of 30 in 3 runs; the kill waits for at least 3 such instances (above this bound), and the
# exact check on those instances fails from the first one. (With the 3 s timeouts of FAST_SETTINGS, issue 7 reports 12
# of 30 with resumption and 24 without: the Supervisor masked the difference.)
MAX_SECOND_ATTEMPTS = 2


@pytest.fixture()
def crash_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    work = tmp_path_factory.mktemp("crash")
    config = SystemConfig(
        work_dir=work,
        seed=11,
        latency_ms_mean=40.0,
        servicebus_config=short_lock_config(work),
        settings={
            **FAST_SETTINGS,
            "FailureThreshold": "10",
            "StepTimeoutSeconds": CRASH_TIMEOUT_SECONDS,
            "ClaimLeaseSeconds": CRASH_TIMEOUT_SECONDS,
        },
    )
    with running_client(config) as client:
        yield client


def _unfinished_activities(client: Client) -> set[str]:
    """Instances whose activity work items devhost had persisted and not finished when it was killed
    (devhost/durable/store.py, table `work`: a work item is removed with the commit of its result)."""
    path = client.system.config.work_dir / "devhost" / "durable.db"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return {row[0] for row in db.execute("SELECT DISTINCT instance_id FROM work")}


@pytest.mark.slow
def test_kill_9_of_devhost_and_agent_mid_burst_loses_and_duplicates_nothing(crash_client: Client) -> None:
    client = crash_client
    system = client.system
    order_ids = [new_order_id("crash") for _ in range(ORDERS)]
    for order_id in order_ids:
        client.submit(make_order(order_id))
    # Kill once some remote side effects happened (one cheap read of the simulator's ledger), far from all 90, and
    # while devhost holds unfinished activity work items: those instances can only go on through resumption.
    wait_until(
        lambda: client.applied() >= 10 and len(_unfinished_activities(client)) >= 3,
        timeout=60,
        what="work under way, with activities in flight",
    )
    assert system.devhost and system.agent
    system.devhost.kill()
    system.agent.kill()
    assert client.applied() < ORDERS * len(STEPS), "every order finished before the crash: the test proves nothing"
    unfinished = _unfinished_activities(client)
    assert unfinished, "no activity was in flight at the kill: the test proves nothing about resumption"

    system.start_devhost()
    system.start_agent()
    wait_until(lambda: all(client.terminal(o) for o in order_ids), timeout=120, what="every order terminal")

    for order_id in order_ids:
        record = client.state(order_id)
        assert record is not None and record.process_state is ProcessState.PROCESSED, (order_id, record)
        assert [s.state for s in client.statuses(order_id)].count(OrderStatus.COMPLETED) >= 1
        effects = client.effects(order_id)
        assert effects == {step.value: 1 for step in STEPS}, (order_id, effects)

    # In-flight orders finish through Durable resumption, not through the Supervisor's second attempt.
    attempts = {o: r.attempt for o in order_ids if (r := client.state(o)) is not None}
    retried_after_resume = sorted(i for i in unfinished if attempts[i.rsplit(":", 1)[0]] > 1)
    assert retried_after_resume == [], (retried_after_resume, Counter(attempts.values()))
    assert sum(1 for a in attempts.values() if a > 1) <= MAX_SECOND_ATTEMPTS, Counter(attempts.values())
    # A claim the kill left unstarted was started again in its own attempt: it spent no failure budget.
    restarted = {o: (r.attempt, r.failure_count) for o in order_ids if (r := client.state(o)) and r.restarts}
    assert all(attempt == 1 and failures == 0 for attempt, failures in restarted.values()), restarted
