"""A real `python -m devhost start` subprocess hosting tests/host/sample_host_app with fresh state, and a bounded
wait."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab.system import ROOT, Process
from orderflow.adapters import bus_from_connection_string

SAMPLE = ROOT / "tests" / "host" / "sample_host_app"


class HostedSample:
    def __init__(self, tmp: Path, overrides: dict[str, str]) -> None:
        import os
        import sys

        self.tmp = tmp
        self.out = tmp / "out.jsonl"
        self.out.touch()
        self.connection = f"Endpoint=embedded://{tmp / 'bus.db'};ConfigFile={SAMPLE / 'servicebus.config.json'}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        env.update(
            {
                "SAMPLE_OUT": str(self.out),
                "ServiceBusConnection": self.connection,
                "PYTHONUNBUFFERED": "1",
                "TickSchedule": "0 0 0 1 1 *",
                **overrides,
            }
        )
        self.process = Process(
            "devhost",
            [
                sys.executable,
                "-m",
                "devhost",
                "start",
                "--app-dir",
                str(SAMPLE),
                "--port",
                "0",
                "--state-dir",
                str(tmp / "state"),
            ],
            env,
            tmp / "devhost.log",
        )
        self.bus = bus_from_connection_string(self.connection)

    @property
    def url(self) -> str:
        assert self.process.url
        return self.process.url

    def start(self) -> HostedSample:
        self.process.start()
        return self

    def records(self, kind: str | None = None) -> list[dict[str, Any]]:
        lines = [json.loads(x) for x in self.out.read_text().splitlines() if x.strip()]
        return [r for r in lines if kind is None or r["kind"] == kind]

    def function_key(self) -> str:
        return str(json.loads((self.tmp / "state" / "keys.json").read_text())["default"])

    def log(self) -> str:
        return self.process.log_path.read_text(errors="replace")


def wait_until(condition: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Bounded wait on an observable condition (the host runs in another process)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
