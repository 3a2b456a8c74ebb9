"""`python -m devhost submit` and `queues`: the client app a user runs against the local system."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from devhost.system import ROOT
from orderflow.bus import from_connection_string


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "devhost", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200"})


def test_submit_sends_with_session_and_content_message_id_then_queues_shows_it(tmp_path: Path) -> None:
    conn = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={ROOT / 'servicebus.config.json'}"
    sent = _run("submit", "--connection", conn, "--order-id", "cli-1", "--wait", "0.2", cwd=tmp_path)
    assert sent.returncode == 1 and "sent order cli-1" in sent.stdout  # nobody processed it: no terminal status
    with from_connection_string(conn) as client, client.get_queue_receiver(
            "orders-inbound", session_id="cli-1", max_wait_time=1) as receiver:
        [message] = receiver.peek_messages(max_message_count=5)
    body = b"".join(message.body)
    assert json.loads(body)["orderId"] == "cli-1" and message.session_id == "cli-1"
    assert message.message_id == f"cli-1:{hashlib.sha256(body).hexdigest()[:12]}"
    shown = _run("queues", "--connection", conn, cwd=tmp_path)
    assert shown.returncode == 0
    row = next(line for line in shown.stdout.splitlines() if "orders-inbound" in line)
    assert [cell.strip() for cell in row.strip("│┃ ").split("│")][1:] == ["1", "0", "0", "1"]


def test_submit_warns_about_an_order_the_system_will_reject(tmp_path: Path) -> None:
    conn = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={ROOT / 'servicebus.config.json'}"
    sent = _run("submit", "--connection", conn, "--order-id", "bad/id", "--wait", "0.2", cwd=tmp_path)
    assert "InvalidField:orderId" in sent.stdout
