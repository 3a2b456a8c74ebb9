"""`BusFaults`, the broker's second fault switch (endpoint options `embedded://PATH?serverBusyRate=..`, off by default;
for the `bus-outage` drill): server busy, timeouts and dropped connections for a share of operations, or for every
operation while an outage file exists. `BusFaultInjector.draw` answers one operation (nothing is done), `record` writes
a ledger line per injected answer. The embedded clients present a fault as the SDK does after its retries
(orderflow/embedded/_faulted.py), the AMQP endpoint on the wire. Sources and scope: docs/modules-product.md."""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .._fault_options import parse_fault_options

SERVER_BUSY, TIMEOUT, DROP = "server-busy", "timeout", "drop"
FAULT_KINDS = (SERVER_BUSY, TIMEOUT, DROP)
OPEN = "open"  # the operation of opening a link (a sender's or receiver's attach)
# The conditions Service Bus answers with (azure/servicebus/_common/constants.py ERROR_CODE_SERVER_BUSY,
# ERROR_CODE_TIMEOUT); a dropped connection has none: the socket ends.
CONDITIONS = {SERVER_BUSY: "com.microsoft:server-busy", TIMEOUT: "com.microsoft:timeout"}
DESCRIPTIONS = {
    SERVER_BUSY: "The server is busy. Please retry the operation (injected).",
    TIMEOUT: "The operation did not complete within the allotted timeout (injected).",
    DROP: "The connection was dropped (injected).",
}
# The outage switch (a file's existence) is looked at no more often than this per broker object.
OUTAGE_CHECK_EVERY_S = 0.1
_RATE_OPTIONS = {"serverBusyRate": SERVER_BUSY, "timeoutRate": TIMEOUT, "dropRate": DROP}
_LOG = logging.getLogger("orderflow.embedded.broker")


class InjectedFault(Exception):
    """One operation's injected answer: `kind` (FAULT_KINDS), after `delay_s` (a timeout's wait)."""

    def __init__(self, kind: str, op: str, queue: str, delay_s: float = 0.0) -> None:
        super().__init__(f"{DESCRIPTIONS[kind]} {op} on {queue}")
        self.kind, self.op, self.queue, self.delay_s = kind, op, queue, delay_s

    @property
    def condition(self) -> str | None:
        return CONDITIONS.get(self.kind)

    @property
    def description(self) -> str:
        return DESCRIPTIONS[self.kind]


@dataclass(frozen=True)
class BusFaults:
    """The faults of one broker object, from its endpoint's query string (`parse`):

    - `serverBusyRate`, `timeoutRate`, `dropRate`: the share of operations answered server busy, timed out (after
      `timeoutMs`, default 1000) or with the connection dropped, drawn in that order from one seeded stream (`seed`);
    - `outageFile`: while it exists, every operation gets the fault the file names (`server-busy` when it is empty,
      `timeout` or `drop`);
    - `ledger`: a JSON-lines file with one line per injected answer (default `<db>.faults.jsonl`).
    """

    server_busy_rate: float = 0.0
    timeout_rate: float = 0.0
    drop_rate: float = 0.0
    timeout_ms: int = 1000
    seed: int = 0
    outage_file: Path | None = None
    ledger: Path | None = None

    @classmethod
    def parse(cls, query: str, db: Path) -> BusFaults | None:
        """The faults a query string asks for (None for an empty one); ValueError on an unknown option or a bad
        value, so that a misspelt option cannot quietly turn a drill's faults off."""
        if not query:
            return None
        rates = {name: kind.replace("-", "_") + "_rate" for name, kind in _RATE_OPTIONS.items()}
        values = parse_fault_options(query, "broker", db, rates=rates, counts={"timeoutMs": "timeout_ms"})
        if sum(values.get(k, 0.0) for k in ("server_busy_rate", "timeout_rate", "drop_rate")) > 1.0:
            raise ValueError("embedded broker fault rates must add up to at most 1")
        return cls(**values)


def split_endpoint(path: str) -> tuple[str, BusFaults | None]:
    """The database path and the faults of what follows `embedded://`: `PATH` or `PATH?option=value&...`."""
    db, _, query = path.partition("?")
    return db, BusFaults.parse(query, Path(os.path.abspath(db)))


_opened: dict[str, int] = {}


class BusFaultInjector:
    """Draws each operation's fault (`BusFaults`) and writes the ledger: one per broker object. `monotonic` is
    injectable (tests never wait)."""

    def __init__(self, faults: BusFaults, db: str, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.faults = faults
        # A seeded stream per broker object this process opens on a file (the n-th gets the same stream every run).
        opened = _opened[db] = _opened.get(db, 0) + 1
        self._rng = random.Random(f"{faults.seed}:{opened}")
        self._monotonic = monotonic
        self._down: str | None = None
        self._down_checked: float | None = None
        self._ledger_fd: int | None = None

    def outage(self) -> str | None:
        """The fault the outage file names while it exists (looked at no more than every OUTAGE_CHECK_EVERY_S)."""
        path = self.faults.outage_file
        if path is None:
            return None
        now = self._monotonic()
        if self._down_checked is None or now - self._down_checked >= OUTAGE_CHECK_EVERY_S:
            self._down_checked = now
            try:
                named = path.read_text().strip()
            except OSError:  # absent (or gone between the look and the read): up
                self._down = None
            else:
                if named and named not in FAULT_KINDS:
                    _LOG.warning("outage file %s names %r, not one of %s: server-busy", path, named, FAULT_KINDS)
                self._down = named if named in FAULT_KINDS else SERVER_BUSY
        return self._down

    def draw(self, op: str, queue: str) -> InjectedFault | None:
        """The fault that answers this operation, if any: the outage's, else one drawn at the rates. Opening a link
        (`open`) meets only a dropped connection: a busy or slow Service Bus still attaches links, and refuses or
        times out the operations on them."""
        kind = self.outage()
        if kind is None:
            faults, roll = self.faults, self._rng.random()
            for rate, candidate in (
                (faults.server_busy_rate, SERVER_BUSY),
                (faults.timeout_rate, TIMEOUT),
                (faults.drop_rate, DROP),
            ):
                if roll < rate:
                    kind = candidate
                    break
                roll -= rate
        if kind is None or (op == OPEN and kind != DROP):
            return None
        return InjectedFault(kind, op, queue, self.faults.timeout_ms / 1000.0 if kind == TIMEOUT else 0.0)

    def record(self, fault: InjectedFault, retried: bool | None) -> None:
        """One ledger line: the operation, its queue, the fault, and whether the client retried it (False: the
        caller got it; None: not known here, the AMQP endpoint's answers). O_APPEND, one write per line: lines of
        several processes do not interleave."""
        if self.faults.ledger is None:
            return
        if self._ledger_fd is None:
            self.faults.ledger.parent.mkdir(parents=True, exist_ok=True)
            self._ledger_fd = os.open(self.faults.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        line = json.dumps(
            {
                "at": round(time.time(), 3),
                "pid": os.getpid(),
                "op": fault.op,
                "queue": fault.queue,
                "fault": fault.kind,
                "retried": retried,
            },
            separators=(",", ":"),
        )
        os.write(self._ledger_fd, (line + "\n").encode())

    def close(self) -> None:
        if self._ledger_fd is not None:
            os.close(self._ledger_fd)
            self._ledger_fd = None
