"""`python -m devhost submit` and `queues`: the client app a user runs against the local system."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from lab.system import ROOT
from orderflow.adapters import bus_from_connection_string


def _run(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devhost", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200", **env},
    )


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _system(conn: str, order_id: str, act: Callable[[Any, Any, Any], None]) -> threading.Thread:
    """Plays the system's part for one order: waits for it on app-orders (the app's own queue, where `orderflow
    submit` sends), then `act(client, receiver, msg)`."""

    def run() -> None:
        with (
            bus_from_connection_string(conn) as client,
            client.get_queue_receiver("app-orders", session_id=order_id, max_wait_time=30) as receiver,
        ):
            [message] = receiver.receive_messages(max_message_count=1, max_wait_time=30)
            act(client, receiver, message)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_submit_sends_with_session_and_content_message_id_then_queues_shows_it(tmp_path: Path) -> None:
    conn = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={ROOT / 'servicebus.config.json'}"
    sent = _run("submit", "--connection", conn, "--order-id", "cli-1", "--wait", "0.2", cwd=tmp_path)
    assert sent.returncode == 1 and "sent order cli-1" in sent.stdout  # nobody processed it: no terminal status
    with (
        bus_from_connection_string(conn) as client,
        client.get_queue_receiver("app-orders", session_id="cli-1", max_wait_time=1) as receiver,
    ):
        [message] = receiver.peek_messages(max_message_count=5)
    body = b"".join(message.body)
    assert json.loads(body)["orderId"] == "cli-1" and message.session_id == "cli-1"
    assert message.message_id == f"cli-1:{hashlib.sha256(body).hexdigest()[:12]}"
    shown = _run("queues", "--connection", conn, cwd=tmp_path)
    assert shown.returncode == 0
    row = next(line for line in shown.stdout.splitlines() if "app-orders" in line)
    assert [cell.strip() for cell in row.strip("│┃ ").split("│")][1:] == ["1", "0", "0", "1"]


def test_submit_warns_about_an_order_the_system_will_reject(tmp_path: Path) -> None:
    conn = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={ROOT / 'servicebus.config.json'}"
    sent = _run("submit", "--connection", conn, "--order-id", "bad/id", "--wait", "0.2", cwd=tmp_path)
    assert "InvalidField:orderId" in sent.stdout


def test_submit_exits_at_once_on_a_rejection_it_already_knows(tmp_path: Path) -> None:
    conn = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={ROOT / 'servicebus.config.json'}"
    started = time.monotonic()
    sent = _run("submit", "--connection", conn, "--order-id", "bad/id", "--wait", "30", cwd=tmp_path)
    assert time.monotonic() - started < 20  # not the 30 s wait for a status that cannot come
    assert sent.returncode == 1 and "rejected: InvalidField:orderId" in sent.stdout
    assert "no terminal status" not in sent.stdout


def test_submit_exits_when_the_system_dead_letters_the_order(tmp_path: Path) -> None:
    """A rejection the client cannot foresee (here OrderConflict): seen on the dead-letter queue, exit 1 at once."""
    conn = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={ROOT / 'servicebus.config.json'}"
    system = _system(
        conn,
        "cli-3",
        lambda _c, r, m: r.dead_letter_message(
            m, reason="OrderConflict", error_description="order cli-3 exists with different data"
        ),
    )
    started = time.monotonic()
    sent = _run("submit", "--connection", conn, "--order-id", "cli-3", "--wait", "30", cwd=tmp_path)
    system.join(5)
    assert time.monotonic() - started < 20
    assert sent.returncode == 1 and "rejected: OrderConflict" in sent.stdout
    assert "no terminal status" not in sent.stdout


@pytest.mark.parametrize(("final", "exit_code"), [("completed", 0), ("failed", 1)])
def test_submit_exits_0_only_when_the_order_completed(tmp_path: Path, final: str, exit_code: int) -> None:
    conn = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={ROOT / 'servicebus.config.json'}"

    def answer(client: Any, receiver: Any, message: Any) -> None:
        receiver.complete_message(message)
        with client.get_queue_sender("app-status") as sender:
            sender.send_messages(
                ServiceBusMessage(
                    json.dumps(
                        {
                            "schemaVersion": 1,
                            "type": "OrderStatus",
                            "orderId": "cli-5",
                            "state": final,
                            "attempt": 1,
                            "timestamp": "2026-01-01T00:00:00Z",
                            "reason": "the end",
                        }
                    ),
                    session_id="cli-5",
                    message_id=f"cli-5:{final}:1",
                )
            )

    system = _system(conn, "cli-5", answer)
    sent = _run("submit", "--connection", conn, "--order-id", "cli-5", "--wait", "30", cwd=tmp_path)
    system.join(5)
    assert sent.returncode == exit_code and final in sent.stdout, sent.stdout + sent.stderr


def test_no_terminal_status_says_what_it_found_and_does_not_blame_rejection(tmp_path: Path) -> None:
    conn = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={ROOT / 'servicebus.config.json'}"
    simulator_port, host_port = _closed_port(), _closed_port()

    def accept(client: Any, receiver: Any, message: Any) -> None:  # accepted, a request waits, no Agent takes it
        receiver.complete_message(message)
        with client.get_queue_sender("app-status") as sender:
            sender.send_messages(
                ServiceBusMessage(
                    json.dumps(
                        {
                            "schemaVersion": 1,
                            "type": "OrderStatus",
                            "orderId": "cli-4",
                            "state": "received",
                            "attempt": 0,
                            "timestamp": "2026-01-01T00:00:00Z",
                            "reason": "order accepted",
                        }
                    ),
                    session_id="cli-4",
                    message_id="cli-4:received:0",
                )
            )
        with client.get_queue_sender("agent-requests") as sender:
            sender.send_messages(ServiceBusMessage("{}", session_id="cli-4", message_id="cli-4:1:reserve-inventory"))

    system = _system(conn, "cli-4", accept)
    sent = _run(
        "submit",
        "--connection",
        conn,
        "--order-id",
        "cli-4",
        "--wait",
        "4",
        "--host-port",
        str(host_port),
        "--app-dir",
        str(tmp_path),  # not the repo's: no .devhost/up.json of a running system
        cwd=tmp_path,
        AGENT_REMOTE_URL=f"http://127.0.0.1:{simulator_port}",
    )
    system.join(5)
    out = " ".join(sent.stdout.split())  # rich wraps long lines
    assert sent.returncode == 1 and "no terminal status within 4 s" in out
    assert "accepted (status received), so it was not rejected" in out
    assert "dead-letter" not in out
    assert f"devhost on 127.0.0.1:{host_port}: not reachable" in out
    assert f"simulator) at http://127.0.0.1:{simulator_port}" in out and "AGENT_REMOTE_URL: not reachable" in out
    assert "agent-requests holds 1 request(s) and is not draining" in out


def test_submit_of_a_missing_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    conn = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={ROOT / 'servicebus.config.json'}"
    sent = _run("submit", "--connection", conn, "--file", str(tmp_path / "missing.json"), cwd=tmp_path)
    assert sent.returncode == 2 and "Traceback" not in sent.stderr
    assert sent.stderr.strip().splitlines() == [
        f"devhost submit: cannot read --file {tmp_path / 'missing.json'}: No such file or directory"
    ]
    (tmp_path / "bad.json").write_text("{not json")
    bad = _run("submit", "--connection", conn, "--file", str(tmp_path / "bad.json"), cwd=tmp_path)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "is not JSON" in bad.stderr


def test_no_terminal_status_uses_what_devhost_up_recorded(tmp_path: Path) -> None:
    """After `devhost up` (ports chosen at start), the hint checks the recorded devhost and simulator URLs and the
    Agent's pid, not the defaults."""
    conn = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={ROOT / 'servicebus.config.json'}"
    host_port, simulator_port = _closed_port(), _closed_port()
    (tmp_path / ".devhost").mkdir()
    (tmp_path / ".devhost" / "up.json").write_text(
        json.dumps(
            {
                "processes": [
                    {
                        "name": "simulator",
                        "pid": 2**22 + 1,
                        "url": f"http://127.0.0.1:{simulator_port}",
                        "log": "sim.log",
                    },
                    {"name": "agent", "pid": 2**22 + 2, "url": None, "log": "/x/.devhost/logs/agent.log"},
                    {"name": "devhost", "pid": 2**22 + 3, "url": f"http://127.0.0.1:{host_port}", "log": "devhost.log"},
                ]
            }
        )
    )
    sent = _run(
        "submit", "--connection", conn, "--order-id", "cli-5", "--wait", "0.5", "--app-dir", str(tmp_path), cwd=tmp_path
    )
    out = " ".join(sent.stdout.split())
    assert sent.returncode == 1 and f"devhost on 127.0.0.1:{host_port}: not reachable" in out
    assert f"simulator) at http://127.0.0.1:{simulator_port}" in out
    assert (
        f"the Agent (pid {2**22 + 2}, started by devhost up): not running; its log: /x/.devhost/logs/agent.log" in out
    )
