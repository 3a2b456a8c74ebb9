"""examples/client.py, run as the README says (`.venv/bin/python examples/client.py` from the repo root), against
the module's running local system (devhost + Agent + simulator) through the embedded connection string in the
environment, as the submitting application (`Identity=app`, its rights of infra/): the same file that runs against
Azure with DefaultAzureCredential.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from support.e2e_support import Client

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "examples" / "client.py"


def run_client(
    client: Client, *args: str, timeout: float = 30.0, owner: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ServiceBusConnection", "SERVICEBUS_"))}
    system = client.system
    env["ServiceBusConnection"] = system.config.bus_connection if owner else system.bus_connection_for(system.submitter)
    env.pop("PYTHONPATH", None)  # the script must find orderflow on its own, as when a user runs it
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--timeout", str(timeout), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout + 60,
    )


def status_lines(stdout: str) -> list[str]:
    return [line.split()[0] for line in stdout.splitlines() if line.startswith("  ")]


def test_sample_order_prints_received_then_completed(client: Client) -> None:
    order_id = f"example-{uuid.uuid4().hex[:8]}"
    result = run_client(client, "--order-id", order_id)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"sent {order_id} to app-orders (MessageId {order_id}:" in result.stdout  # its own queue (issue 25)
    assert status_lines(result.stdout) == ["received", "completed"], result.stdout


def test_my_order_json_runs(client: Client, tmp_path: Path) -> None:
    order = json.loads((ROOT / "examples" / "my-order.json").read_text())
    order["orderId"] = f"mine-{uuid.uuid4().hex[:8]}"  # a fresh id: the shipped one may already be used here
    path = tmp_path / "my-order.json"
    path.write_text(json.dumps(order))
    result = run_client(client, "--file", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert status_lines(result.stdout) == ["received", "completed"], result.stdout


def test_invalid_order_exits_nonzero_with_the_reason(client: Client) -> None:
    result = run_client(client, "--order-id", "bad/id")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "rejected" in result.stdout and "InvalidField:orderId" in result.stdout
    assert "Traceback" not in result.stderr


def test_conflicting_resubmission_is_reported_from_the_dead_letter_queue(client: Client, tmp_path: Path) -> None:
    """Valid locally, rejected by the system (other data under a used orderId): the client says why."""
    order_id = f"conflict-{uuid.uuid4().hex[:8]}"
    assert run_client(client, "--order-id", order_id).returncode == 0
    order = json.loads((ROOT / "examples" / "my-order.json").read_text())
    order["orderId"] = order_id
    path = tmp_path / "changed.json"
    path.write_text(json.dumps(order))
    # As the submitting application, as on Azure: it may not read app-orders' dead letters (Data Sender only).
    result = run_client(client, "--file", str(path), timeout=8.0)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "dead-letter queue is not readable here" in result.stdout
    # With every right (the owner's connection) the same script finds the reason there.
    result = run_client(client, "--file", str(path), timeout=8.0, owner=True)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "rejected by the system" in result.stdout and "OrderConflict" in result.stdout
