"""The line protocol between `python -m benchmarks compare` and the two load drivers it starts (our client app,
benchmarks/compare_ours.py, and the DBOS peer, benchmarks/compare_peer.py), plus what both drivers share: the orders
and the three workloads.

The benchmark writes one JSON command per line on the driver's stdin; the driver answers each with one line on stdout
that starts with PREFIX (anything else it prints is log). Commands: `burst` (N orders submitted at once), `sequential`
(N orders one after another, each submitted when the previous one is terminal), `rate` (orders submitted at a fixed
rate for a duration), `quit`. Every workload answers `Answer`: per-order latency (submit → terminal, seconds) and the
time from the first submit to the last terminal order.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

PREFIX = "@@compare "
SEED = 7


@dataclass
class Answer:
    submitted: int
    terminal: int = 0
    first_submit_to_last_terminal_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)
    submit_lag_s: float = 0.0  # rate: how far the last submit ran behind its schedule

    @classmethod
    def of(
        cls,
        submitted: int,
        sent_at: dict[str, float],
        terminal_at: dict[str, float],
        outcomes: Counter[str],
        submit_lag_s: float = 0.0,
    ) -> Answer:
        done = [o for o in sent_at if o in terminal_at]
        span = (max(terminal_at[o] for o in done) - min(sent_at.values())) if done else 0.0
        return cls(
            submitted,
            len(done),
            round(span, 6),
            [terminal_at[o] - sent_at[o] for o in done],
            dict(outcomes),
            round(submit_lag_s, 6),
        )


def orders_for(prefix: str, count: int, reply_to: str) -> list[Any]:
    """The orders of one workload: devhost's demo orders (1–3 items), ids `<prefix>-7-00000`…; both drivers send the
    same ones."""
    from lab.demo import make_orders

    return make_orders(count, SEED, reply_to, prefix=prefix)


def serve(handle: Callable[[dict[str, Any]], dict[str, Any]], ready: dict[str, Any] | None = None) -> None:
    """The driver's side: announce readiness, then answer each command line until `quit` or end of input."""
    say({"ready": True, "pid": os.getpid(), **(ready or {})})
    for line in sys.stdin:
        if not line.strip():
            continue
        command = json.loads(line)
        if command.get("cmd") == "quit":
            say({"ok": True})
            return
        try:
            say(handle(command))
        except Exception as exc:  # noqa: BLE001 - the benchmark reports it and stops the round
            say({"error": f"{type(exc).__name__}: {exc}"})


def say(obj: dict[str, Any]) -> None:
    sys.stdout.write(PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()


def answer_dict(answer: Answer) -> dict[str, Any]:
    return asdict(answer)


class Driver:
    """The benchmark's side: a driver process; `call` sends a command and waits for its answer."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path, cwd: Path) -> None:
        self.name = name
        self._log = open(log_path, "ab")  # closed in stop()
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,
        )
        self._answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()

    def _pump(self, stream: IO[bytes] | None) -> None:
        assert stream is not None
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            if line.startswith(PREFIX):
                self._answers.put(json.loads(line[len(PREFIX) :]))
            else:
                self._log.write(raw)
                self._log.flush()
        self._answers.put(None)

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        return self._next(timeout, "start")

    def call(self, command: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(command) + "\n").encode())
        self.proc.stdin.flush()
        return self._next(timeout, command.get("cmd", "?"))

    def _next(self, timeout: float, what: str) -> dict[str, Any]:
        try:
            found = self._answers.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"{self.name}: no answer to {what} within {timeout:.0f} s") from None
        if found is None:
            raise RuntimeError(f"{self.name} exited (code {self.proc.poll()}) during {what}; see {self._log.name}")
        if "error" in found:
            raise RuntimeError(f"{self.name}: {what} failed: {found['error']}")
        return found

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            try:
                self.call({"cmd": "quit"}, timeout)
            except (RuntimeError, OSError):
                pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def rate_schedule(rate: float, duration_s: float) -> list[float]:
    """Submit offsets (seconds from the start) of `rate` orders/s over `duration_s`: evenly spaced, at least one."""
    count = max(1, round(rate * duration_s))
    return [i / rate for i in range(count)]


def sleep_until(moment: float) -> None:
    delay = moment - time.monotonic()
    if delay > 0:
        time.sleep(delay)
