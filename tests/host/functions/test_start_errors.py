"""`python -m devhost start`: expected mistakes end in one line on stderr and exit 1, not a traceback; third-party
loggers that are chatty at INFO (uamqp's C library, decoding every SDK-type Service Bus message) are quiet at the
default level.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusMessage
from support.hosted import SAMPLE, HostedSample, wait_until

from lab.system import ROOT
from orderflow.telemetry import configure_logging


def start(app_dir: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(
        {
            "SAMPLE_OUT": str(tmp / "out.jsonl"),
            "TickSchedule": "0 0 0 1 1 *",
            "ServiceBusConnection": f"Endpoint=embedded://{tmp / 'bus.db'};ConfigFile="
            f"{SAMPLE / 'servicebus.config.json'}",
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "devhost", "start", "--app-dir", str(app_dir), "--state-dir", str(tmp / "state"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture()
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_taken_port_is_one_line(tmp_path: Path, taken_port: int) -> None:
    result = start(SAMPLE, tmp_path, "--port", str(taken_port))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"devhost: port {taken_port} on 127.0.0.1 is in use (another devhost or func start?)"
    )


def test_missing_setting_is_one_line_naming_it(tmp_path: Path) -> None:
    app = tmp_path / "app"
    shutil.copytree(SAMPLE, app)
    settings = json.loads((app / "local.settings.json").read_text())
    del settings["Values"]["WorkQueue"]  # the app's trigger names %WorkQueue%
    (app / "local.settings.json").write_text(json.dumps(settings))
    result = start(app, tmp_path, "--port", "0")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("devhost: binding expression %WorkQueue% names an app setting that is not set"), last
    assert "set WorkQueue in local.settings.json" in last


@pytest.fixture()
def fresh_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = root.level, {n: logging.getLogger(n).level for n in ("uamqp", "uamqp.c_uamqp")}
    yield
    root.setLevel(saved[0])
    for name, level in saved[1].items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.usefixtures("fresh_logging")
def test_uamqp_info_is_quiet_at_the_default_level() -> None:
    logging.getLogger().setLevel(logging.INFO)  # devhost start's default --log-level
    configure_logging("INFO")  # what devhost start and the Agent run at their default level
    c_logger = logging.getLogger("uamqp.c_uamqp")  # the logger uamqp's C library writes through
    assert not c_logger.isEnabledFor(logging.INFO)
    assert c_logger.isEnabledFor(logging.WARNING)
    for name in ("azure.core.pipeline.policies.http_logging_policy", "azure.servicebus._pyamqp"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO)


@pytest.mark.usefixtures("fresh_logging")
def test_uamqp_decode_writes_no_info_through_devhost_logging(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """The real source: decoding one message for an SDK-type binding, as devhost does for the submission trigger."""
    from azure.servicebus import ServiceBusMessage

    from devhost.sdk_servicebus import to_sdk_message
    from orderflow.adapters import bus_from_connection_string

    logging.getLogger().setLevel(logging.INFO)
    configure_logging("INFO")  # what devhost start and the Agent run at their default level
    conn = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={SAMPLE / 'servicebus.config.json'}"
    with bus_from_connection_string(conn) as client:
        with client.get_queue_sender("work") as sender:
            sender.send_messages(ServiceBusMessage(b"{}", message_id="m-1"))
        with client.get_queue_receiver("work") as receiver:
            message = receiver.receive_messages(max_wait_time=2)[0]
            with caplog.at_level(logging.INFO):
                caplog.clear()
                to_sdk_message(message)
            receiver.complete_message(message)
    assert [r for r in caplog.records if r.name.startswith("uamqp")] == []


def test_devhost_log_has_no_uamqp_lines_at_the_default_level(host: HostedSample) -> None:
    """A real `devhost start` (default --log-level INFO) decoding messages for an SDK-type binding: before the fix,
    about eight `uamqp.c_uamqp` INFO lines per message ("Bad arguments: value = (nil)")."""
    with host.bus.get_queue_sender("sdk") as sender:
        sender.send_messages([ServiceBusMessage(b"one", message_id="q-1"), ServiceBusMessage(b"two", message_id="q-2")])
    wait_until(lambda: len(host.records("sdk")) >= 2, what="two sdk records")
    log = host.log()
    assert "devhost listening on" in log
    assert "uamqp" not in log and "Bad arguments" not in log, log[-2000:]
