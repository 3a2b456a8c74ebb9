"""The whole system survives `kill -9` of devhost and of the Agent in the middle of a burst of orders.

Seed 000/001, "Issues and considerations": the Scheduler's state is durable (Durable history, the state store),
messages are peek-locked, side effects are idempotent by key; after a restart every order reaches a terminal state,
none is lost and no remote side effect is applied twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import FAST_SETTINGS, Client, make_order, new_order_id
from support.hosted import wait_until

from devhost.system import ROOT, LocalSystem, SystemConfig
from orderflow.messages import STEPS, TERMINAL_STATUSES, OrderStatus
from orderflow.records import ProcessState

ORDERS = 30


def _short_locks(work: Path) -> Path:
    """The product's queues with 5 s locks: after a kill -9 the dead Agent's session lock on an order's requests
    expires after LockDuration (1 min in production), and the test should not wait that long."""
    config = json.loads((ROOT / "servicebus.config.json").read_text())
    for namespace in config["UserConfig"]["Namespaces"]:
        for queue in namespace["Queues"]:
            queue["Properties"]["LockDuration"] = "PT5S"
    path = work / "servicebus.config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture()
def crash_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    work = tmp_path_factory.mktemp("crash")
    config = SystemConfig(work_dir=work, seed=11, latency_ms_mean=40.0, servicebus_config=_short_locks(work),
                          settings={**FAST_SETTINGS, "FailureThreshold": "10"})
    system = LocalSystem(config).start()
    client = Client(system)
    try:
        yield client
    finally:
        client.close()
        system.stop()


def _applied(client: Client) -> int:
    return int(client._http("GET", f"{client._simulator_url}/effects")["totalApplied"])


def _terminal(client: Client, order_id: str) -> bool:
    return any(s.state in TERMINAL_STATUSES for s in client.statuses(order_id))


def test_kill_9_of_devhost_and_agent_mid_burst_loses_and_duplicates_nothing(crash_client: Client) -> None:
    client = crash_client
    system = client.system
    order_ids = [new_order_id("crash") for _ in range(ORDERS)]
    for order_id in order_ids:
        client.submit(make_order(order_id))
    # Kill once some remote side effects happened (one cheap read of the simulator's ledger), far from all 90.
    wait_until(lambda: _applied(client) >= 10, timeout=60, what="work under way")
    assert system.devhost and system.agent
    system.devhost.kill()
    system.agent.kill()
    assert _applied(client) < ORDERS * len(STEPS), "every order finished before the crash: the test proves nothing"

    system.start_devhost()
    system.start_agent()
    wait_until(lambda: all(_terminal(client, o) for o in order_ids), timeout=120, what="every order terminal")

    for order_id in order_ids:
        record = client.state(order_id)
        assert record is not None and record.process_state is ProcessState.PROCESSED, (order_id, record)
        assert [s.state for s in client.statuses(order_id)].count(OrderStatus.COMPLETED) >= 1
        effects = client.effects(order_id)
        assert effects == {step.value: 1 for step in STEPS}, (order_id, effects)
