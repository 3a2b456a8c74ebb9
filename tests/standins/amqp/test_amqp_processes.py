"""`python -m devhost servicebus` as a process: what it prints, how it stops, what it refuses, and that processes on
the embedded client and processes on the endpoint share one broker file: a message sent on one path is received on
the other, a waiting AMQP receiver woken by another process's send."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus._pyamqp import constants as pyamqp_constants
from azure.servicebus.exceptions import SessionCannotBeLockedError
from support.amqp_endpoint import BASE_CONFIG, ROOT, Served, start_subprocess, stop_subprocess
from support.bus_scenarios import Queues, props

from orderflow.embedded.amqp._cli import DB_NAME
from orderflow.embedded.client import ServiceBusClient as EmbeddedClient


def _embedded(served: Served) -> EmbeddedClient:
    return EmbeddedClient.from_connection_string(f"Endpoint=embedded://{served.db_path}")


def test_a_message_sent_by_the_embedded_client_is_received_over_amqp_and_back(amqp_server: Served) -> None:
    q = amqp_server.declare(Queues.fresh())
    with _embedded(amqp_server) as embedded, embedded.get_queue_sender(q.plain) as sender:
        sender.send_messages(ServiceBusMessage("from embedded", application_properties={"via": "sqlite"}))
    with ServiceBusClient.from_connection_string(amqp_server.connection_string, retry_total=0) as client:
        with client.get_queue_receiver(q.plain) as receiver:
            [message] = receiver.receive_messages(max_wait_time=5)
            assert str(message) == "from embedded" and props(message) == {"via": "sqlite"}
            receiver.complete_message(message)
        with client.get_queue_sender(q.sessions) as sender:
            sender.send_messages(ServiceBusMessage("from amqp", session_id="S", subject="x"))
    with _embedded(amqp_server) as embedded, embedded.get_queue_receiver(q.sessions, session_id="S") as receiver:
        [message] = receiver.receive_messages(max_wait_time=5)
        assert (str(message), message.session_id, message.subject) == ("from amqp", "S", "x")
        receiver.complete_message(message)


def test_a_waiting_amqp_receiver_is_woken_by_a_send_from_another_process(amqp_server: Served) -> None:
    q = amqp_server.declare(Queues.fresh())
    script = (
        "import sys, time\n"
        "from azure.servicebus import ServiceBusMessage\n"
        "from orderflow.embedded.client import ServiceBusClient\n"
        "time.sleep(1.5)\n"  # the other process sends while the receiver below waits
        f"with ServiceBusClient.from_connection_string('Endpoint=embedded://{amqp_server.db_path}') as c:\n"
        f"    with c.get_queue_sender('{q.plain}') as s:\n"
        "        s.send_messages(ServiceBusMessage(str(time.time())))\n"
    )
    with ServiceBusClient.from_connection_string(amqp_server.connection_string, retry_total=0) as client:
        with client.get_queue_receiver(q.plain) as receiver:
            sender = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
            try:
                [message] = receiver.receive_messages(max_wait_time=15)
            finally:
                sender.wait(30)
            received = time.time()
            receiver.complete_message(message)
    assert received - float(str(message)) < 1.0  # woken by the send, not by a timer


def test_it_prints_the_address_when_ready_and_stops_cleanly_on_sigint(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(BASE_CONFIG), encoding="utf-8")
    process, port = start_subprocess(tmp_path / "state", config)
    try:
        with ServiceBusClient.from_connection_string(Served(port, tmp_path).connection_string, retry_total=0) as c:
            with c.get_queue_sender("ping") as sender:
                sender.send_messages(ServiceBusMessage("before the signal"))
        assert (tmp_path / "state" / DB_NAME).is_file()  # the broker file the embedded client names
        process.send_signal(signal.SIGINT)
        assert process.wait(10) == 0
    finally:
        stop_subprocess(process) if process.poll() is None else None


def test_a_missing_config_file_is_an_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "devhost", "servicebus", "--port", "0", "--state-dir", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 1 and "config file not found: servicebus.config.json" in done.stderr


def test_the_default_port_is_the_one_the_sdk_uses_when_the_emulator_string_has_none() -> None:
    # azure/servicebus/_pyamqp/_connection.py Connection.__init__: without a port (and without TLS) it dials PORT.
    import argparse

    from orderflow.embedded.amqp import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).port == pyamqp_constants.PORT == 5672


def test_a_receiver_that_crashes_keeps_its_session_locked_until_the_lock_expires(amqp_server: Served) -> None:
    # message-sessions: the lock is released on close, or when it expires if the receiver cannot close.
    q = amqp_server.declare(Queues.fresh())
    with ServiceBusClient.from_connection_string(amqp_server.connection_string, retry_total=0) as client:
        with client.get_queue_sender(q.sessions) as sender:
            sender.send_messages(ServiceBusMessage("in flight", session_id="K"))
        script = (
            "import os\n"
            "from azure.servicebus import ServiceBusClient\n"
            f"c = ServiceBusClient.from_connection_string({amqp_server.connection_string!r}, retry_total=0)\n"
            f"r = c.get_queue_receiver({q.sessions!r}, session_id='K')\n"
            "r.__enter__()\n"
            "assert len(r.receive_messages(max_wait_time=5)) == 1\n"
            "os._exit(0)\n"  # no detach, no close: the socket just goes
        )
        assert subprocess.run([sys.executable, "-c", script], cwd=ROOT, timeout=60).returncode == 0
        with pytest.raises(SessionCannotBeLockedError):
            with client.get_queue_receiver(q.sessions, session_id="K") as receiver:
                receiver.receive_messages(max_wait_time=1)
