"""The AMQP endpoint for tests: `python -m devhost servicebus` as a subprocess, or an `Endpoint` on a thread over a
broker whose clock the test moves (`OffsetClock`); the unmodified azure-servicebus SDK on it, sync or aio (`SdkBus`),
connected with the emulator's connection string; fresh queues declared in the broker file it serves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from azure.servicebus import ServiceBusClient
from azure.servicebus.aio import ServiceBusClient as AioServiceBusClient

from orderflow.embedded.amqp import Endpoint
from orderflow.embedded.broker import BusFaults, EmbeddedBroker
from support.aio_bridge import LoopThread
from support.bus_scenarios import FlavoredBus, OffsetClock, Queues, declare

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0
# Microsoft's emulator connection string, unchanged but for the port (azure/servicebus/_base_handler.py: with
# UseDevelopmentEmulator=true the SDK speaks plain AMQP and keeps the port).
EMULATOR = (
    "Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
    "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
)
BASE_CONFIG = {"UserConfig": {"Namespaces": [{"Name": "t", "Queues": [{"Name": "ping", "Properties": {}}]}]}}


@dataclass
class Served:
    """An endpoint that serves the broker file `db_path` on `port`."""

    port: int
    db_path: Path

    @property
    def connection_string(self) -> str:
        return EMULATOR.format(port=self.port)

    def declare(self, queues: Queues) -> Queues:
        return declare(self.db_path, queues)


def start_subprocess(state_dir: Path, config: Path) -> tuple[subprocess.Popen[str], int]:
    """`python -m devhost servicebus --port 0`, ready once it printed `listening on amqp://HOST:PORT`."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    command = [sys.executable, "-m", "devhost", "servicebus", "--port", "0", "--state-dir", str(state_dir)]
    process = subprocess.Popen(
        [*command, "--config", str(config)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(START_TIMEOUT)
    if not line or not line[0].startswith("listening on amqp://127.0.0.1:"):
        process.kill()
        raise AssertionError(f"the endpoint did not start: {line!r}")
    return process, int(line[0].strip().rsplit(":", 1)[1])


def stop_subprocess(process: subprocess.Popen[str]) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(10)
    finally:
        if process.poll() is None:
            process.kill()


@contextmanager
def served_subprocess(state_dir: Path, config: Path) -> Iterator[Served]:
    """`python -m devhost servicebus` on `state_dir` and `config` for the block; stopped after it."""
    process, port = start_subprocess(state_dir, config)
    try:
        yield Served(port, state_dir / "servicebus.db")
    finally:
        stop_subprocess(process)


@dataclass
class InProcess(Served):
    clock: OffsetClock
    endpoint: Any


@contextmanager
def in_process_endpoint(state_dir: Path, faults: BusFaults | None = None) -> Iterator[InProcess]:
    """The endpoint on a thread of this process, over a broker on an `OffsetClock` (with `faults`, if given)."""
    clock = OffsetClock()
    broker = EmbeddedBroker(state_dir / "servicebus.db", clock=clock, faults=faults)
    endpoint = Endpoint(broker, "127.0.0.1", 0)
    thread = threading.Thread(target=endpoint.run, name="amqp-endpoint", daemon=True)
    thread.start()
    try:
        yield InProcess(endpoint.port, state_dir / "servicebus.db", clock, endpoint)
    finally:
        endpoint.stop()
        thread.join(10)
        broker.close()
    assert not thread.is_alive()


class SdkBus(FlavoredBus):
    """The unmodified azure-servicebus SDK (sync, or aio through the bridge) on an endpoint; the broker's clock is
    the test's when the endpoint runs in this process."""

    def __init__(self, served: Served, flavor: str, loop: LoopThread) -> None:
        self.served, self.flavor, self.loop = served, flavor, loop
        self.clock = served.clock if isinstance(served, InProcess) else None

    def sync_client(self) -> Any:
        return ServiceBusClient.from_connection_string(self.served.connection_string, retry_total=0)

    def aio_client(self) -> Any:
        return AioServiceBusClient.from_connection_string(self.served.connection_string, retry_total=0)
