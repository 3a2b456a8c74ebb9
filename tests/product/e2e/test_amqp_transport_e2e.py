"""The whole local system on the real azure-servicebus SDK over AMQP 1.0 (`SystemConfig(transport="amqp")`): devhost's
Service Bus triggers, the Agent, the client app and the operator CLI all reach the queues through
`python -m devhost servicebus`, with the Service Bus emulator's connection string, as they reach Service Bus on Azure.

A few orders finish, none lost and no side effect twice; a poison message is dead-lettered with its reason and read
back through the SDK; the Agent is killed (-9) with work in flight and restarted, and every order still ends Processed.
Only the endpoint process holds the broker file open, so no process took the embedded client's path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
from support.e2e_support import (
    FAST_SETTINGS,
    Client,
    make_order,
    new_order_id,
    running_client,
    short_lock_config,
)
from support.hosted import wait_until

from lab.system import ROOT, SystemConfig
from orderflow.messages import STEPS
from orderflow.records import ProcessState

ORDERS = 6


@pytest.fixture(scope="module")
def amqp_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    work = tmp_path_factory.mktemp("amqp-e2e")
    config = SystemConfig(
        work_dir=work,
        seed=5,
        latency_ms_mean=40.0,
        servicebus_config=short_lock_config(work),
        transport="amqp",
        # Steps outlast the restart of a killed Agent (its 5 s session locks expire first): the crash costs no attempt.
        settings={**FAST_SETTINGS, "StepTimeoutSeconds": "20", "ClaimLeaseSeconds": "20", "FailureThreshold": "10"},
    )
    with running_client(config) as client:
        yield client


@pytest.mark.slow
def test_orders_a_poison_message_and_an_agent_crash_over_amqp(amqp_client: Client) -> None:
    client = amqp_client
    system = client.system
    assert system.app_bus_connection.startswith("Endpoint=sb://127.0.0.1:")
    assert system.app_bus_connection.endswith("UseDevelopmentEmulator=true;")

    order_ids = [new_order_id("amqp") for _ in range(ORDERS)]
    for order_id in order_ids:
        client.submit(make_order(order_id))
    poison = new_order_id("poison")
    client.send(b"{not json", message_id=f"{poison}:bad", session_id=poison)

    wait_until(lambda: client.applied() >= 2, timeout=60, what="remote work under way")
    assert system.agent is not None
    system.agent.kill()
    assert client.applied() < ORDERS * len(STEPS), "every order finished before the crash: the test proves nothing"
    system.start_agent()

    dead = client.wait_dead_letter(f"{poison}:bad", timeout=30)
    assert dead.reason == "InvalidJson" and dead.body == b"{not json"
    wait_until(lambda: all(client.terminal(o) for o in order_ids), timeout=120, what="every order terminal")
    for order_id in order_ids:
        record = client.state(order_id)
        assert record is not None and record.process_state is ProcessState.PROCESSED, (order_id, record)
        assert client.effects(order_id) == {step.value: 1 for step in STEPS}, order_id  # no side effect twice

    # Only the endpoint holds the broker's SQLite file: every other process went through AMQP.
    broker = system.config.work_dir / "servicebus.db"
    holders = {
        proc.name
        for proc in (system.servicebus, system.agent, *system.devhosts, system.simulator)
        if proc is not None and proc.proc is not None and _holds(proc.proc.pid, broker)
    }
    assert holders == {"servicebus"}
    # The SDK's AMQP layer logs every state change at INFO; the Agent (and devhost) keep it at WARNING (its warnings
    # and errors still show).
    for name in ("agent", "devhost"):
        assert " INFO azure.servicebus._pyamqp" not in (system.config.work_dir / f"{name}.log").read_text(), name


def _holds(pid: int, path: Path) -> bool:
    """Whether process `pid` or one of its children has `path` open."""
    root = psutil.Process(pid)
    for proc in (root, *root.children(recursive=True)):
        try:
            if any(Path(f.path) == path for f in proc.open_files()):
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False


def test_the_cli_submits_an_order_and_follows_it_to_the_end_over_amqp(amqp_client: Client) -> None:
    """`orderflow submit` (the client-app command of the operator CLI) on the system's emulator connection string:
    it sends the order and reads its statuses from the reply queue through the real SDK; exit 0 = Completed."""
    system = amqp_client.system
    assert system.devhost is not None and (devhost_url := system.devhost.url)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    order_id = new_order_id("cli")
    out = subprocess.run(
        [sys.executable, "-m", "orderflow", "submit", "--order-id", order_id, "--wait", "90"]
        + ["--connection", system.bus_connection_for(system.submitter), "--host-port", str(urlsplit(devhost_url).port)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-2000:])
    record = amqp_client.state(order_id)
    assert record is not None and record.process_state is ProcessState.PROCESSED
