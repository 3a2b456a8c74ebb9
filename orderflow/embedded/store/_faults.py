"""Fault injection of the embedded store: contention, throttling and outages from the endpoint's options
(`StoreFaults`), answered and retried as azure-cosmos does (`FaultInjector`)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from orderflow.errors import TransientStoreError

from .._fault_options import parse_fault_options

T = TypeVar("T")

# What azure-cosmos (4.17.1, the constraints.txt pin) does with the answers the faults stand for, copied so that the
# embedded adapter hands its callers what the Cosmos adapter would:
# - 429 (throttled): `_resource_throttle_retry_policy.ResourceThrottleRetryPolicy` with the default
#   `_retry_options.RetryOptions`: up to 9 retries, each after the x-ms-retry-after-ms the service answered, while the
#   waits add up to less than 30 s; then the 429 reaches the caller (`aio/_retry_utility_async.ExecuteAsync`).
# - 503 (unavailable): `_service_unavailable_retry_policy._ServiceUnavailableRetryPolicy`, reads and writes alike: as
#   many retries as the account has regions (a single-region account: 1 retry), 500 ms apart; then the 503 reaches the
#   caller.
THROTTLE_MAX_RETRIES = 9
THROTTLE_MAX_WAIT_S = 30.0
UNAVAILABLE_MAX_RETRIES = 1
UNAVAILABLE_RETRY_AFTER_S = 0.5
# The outage switch (a file's existence) is looked at no more often than this per open store file.
OUTAGE_CHECK_EVERY_S = 0.1
THROTTLED, UNAVAILABLE, CONFLICT = 429, 503, 412
_RATE_OPTIONS = {"conflictRate": "conflict_rate", "throttleRate": "throttle_rate"}


@dataclass(frozen=True)
class StoreFaults:
    """The faults of one embedded store, from its endpoint's query string (`parse`):

    - `conflictRate`: the share of If-Match writes (state record replace, checkpoint and document puts) that meet a
      concurrent writer: another writer rewrites the item first (a new etag, the same content), so the write fails
      with 412 (PreconditionFailed) and changes nothing, exactly as when two instances race;
    - `throttleRate`: the share of requests, reads and writes, answered 429 before anything is done, with
      `throttleRetryAfterMs` (default 10) as x-ms-retry-after-ms;
    - `outageFile`: while this file exists, every request is answered 503 (ServiceUnavailable), nothing done;
    - `seed`: of the draws; `ledger`: a JSON-lines file that gets one line per injected answer (default
      `<PATH>.faults.jsonl`), for the drills' figures.
    """

    conflict_rate: float = 0.0
    throttle_rate: float = 0.0
    throttle_retry_after_ms: int = 10
    seed: int = 0
    outage_file: Path | None = None
    ledger: Path | None = None

    @classmethod
    def parse(cls, query: str, store: Path) -> StoreFaults | None:
        """The faults a query string asks for (None for an empty one); ValueError on an unknown option or a bad
        value, so that a misspelt option cannot quietly turn a drill's faults off."""
        if not query:
            return None
        counts = {"throttleRetryAfterMs": "throttle_retry_after_ms"}
        values = parse_fault_options(query, "store", store, rates=_RATE_OPTIONS, counts=counts)
        return cls(**values)


def split_endpoint_path(path: str | Path) -> tuple[Path, StoreFaults | None]:
    """The file and the faults of what follows `embedded://`: `PATH` or `PATH?option=value&...`."""
    if isinstance(path, Path):
        return path, None
    file, _, query = path.partition("?")
    return Path(file), StoreFaults.parse(query, Path(file))


_injectors_opened: dict[str, int] = {}


class FaultInjector:
    """Answers each request as the faulty service would (`StoreFaults`) and retries as azure-cosmos would: one per
    open store file. `sleep` and `monotonic` are injectable (tests never wait)."""

    def __init__(
        self,
        faults: StoreFaults,
        store: Path,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.faults = faults
        # A seeded stream per file this process opens (the n-th opening of the same path gets the same stream).
        key = str(store.resolve())
        opened = _injectors_opened[key] = _injectors_opened.get(key, 0) + 1
        self._rng = random.Random(f"{faults.seed}:{opened}")
        self._sleep = sleep
        self._monotonic = monotonic
        self._down = False
        self._down_checked: float | None = None
        self._ledger_fd: int | None = None

    def down(self) -> bool:
        """Whether the outage file exists, looked at no more than every OUTAGE_CHECK_EVERY_S."""
        if self.faults.outage_file is None:
            return False
        now = self._monotonic()
        if self._down_checked is None or now - self._down_checked >= OUTAGE_CHECK_EVERY_S:
            self._down = self.faults.outage_file.exists()
            self._down_checked = now
        return self._down

    def _draw(self, rate: float) -> bool:
        return rate > 0.0 and self._rng.random() < rate

    def record(self, op: str, status: int, retried: bool) -> None:
        """One ledger line: the operation, the status injected, and whether the client retried it (False: the caller
        got it). O_APPEND, one write per line: lines of several processes do not interleave."""
        if self.faults.ledger is None:
            return
        if self._ledger_fd is None:
            self.faults.ledger.parent.mkdir(parents=True, exist_ok=True)
            self._ledger_fd = os.open(self.faults.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        line = json.dumps(
            {"at": round(time.time(), 3), "pid": os.getpid(), "op": op, "status": status, "retried": retried},
            separators=(",", ":"),
        )
        os.write(self._ledger_fd, (line + "\n").encode())

    async def call(self, op: str, run: Callable[[bool], Awaitable[T]], if_match: bool = False) -> T:
        """Run one operation. Before anything is done the service may answer 503 (outage) or 429 (throttled); those
        are retried by the client's policies and reach the caller as TransientStoreError once they give up. An
        If-Match write may then meet a concurrent writer: `run(True)` lets it write first, so the caller's write
        fails with 412 as it would in a real race."""
        throttle_retries, throttle_waited, unavailable_retries = 0, 0.0, 0
        while True:
            if self.down():
                retry = unavailable_retries < UNAVAILABLE_MAX_RETRIES
                self.record(op, UNAVAILABLE, retry)
                if not retry:
                    raise TransientStoreError(f"ServiceUnavailable: {op}: the store is down (injected)", UNAVAILABLE)
                unavailable_retries += 1
                await self._sleep(UNAVAILABLE_RETRY_AFTER_S)
                continue
            if self._draw(self.faults.throttle_rate):
                wait = self.faults.throttle_retry_after_ms / 1000.0
                # ResourceThrottleRetryPolicy.ShouldRetry: under the retry count, and the waits so far under the cap.
                retry = throttle_retries < THROTTLE_MAX_RETRIES and throttle_waited < THROTTLE_MAX_WAIT_S
                self.record(op, THROTTLED, retry)
                if not retry:
                    raise TransientStoreError(f"TooManyRequests: {op}: request rate is large (injected)", THROTTLED)
                throttle_retries += 1
                throttle_waited += wait
                await self._sleep(wait)
                continue
            conflict = if_match and self._draw(self.faults.conflict_rate)
            if conflict:
                self.record(op, CONFLICT, False)
            return await run(conflict)

    def close(self) -> None:
        if self._ledger_fd is not None:
            os.close(self._ledger_fd)
            self._ledger_fd = None
