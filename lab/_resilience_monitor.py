"""What the resilience drills (lab/resilience_drills.py, which re-exports it) watch while the orders run: `Monitor`
samples the state store's Processing and Pending counts, the circuit breaker's document and the RSS of devhost and
the Agent; `BreakerHistory` rebuilds the breaker's open rounds and closings from the documents it saw, and
`CallsWhileOpen` counts the remote's calls against them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from orderflow import settings as app_settings
from orderflow.breaker import CACHE_TTL, BreakerDoc, BreakerState
from orderflow.records import ProcessState

from .system import LocalSystem, Process

SAMPLE_EVERY_S = 0.2  # store counts and memory
BREAKER_EVERY_S = 0.05  # the breaker's document: one point read


def _tree_rss(pid: int) -> int:
    """Resident bytes of a process and its descendants now (0 if it is gone)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def _high_water_rss(pid: int) -> int:
    """The kernel's peak resident set of one process (`VmHWM`, Linux), 0 where unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class Monitor:
    """Samples the running system while a drill runs: every `every` seconds the Processing and Pending counts of the
    state store and the resident memory of devhost and the Agent (process trees); every `breaker_every` seconds the
    circuit breaker's document (each change, with the time it was first seen). Peaks: the sampled maxima; for memory
    also the kernel's high-water mark of each main process, read at the end (it catches a peak between samples)."""

    def __init__(
        self, system: LocalSystem, every: float = SAMPLE_EVERY_S, breaker_every: float = BREAKER_EVERY_S
    ) -> None:
        self.system = system
        self.every = every
        self.breaker_every = breaker_every
        self.env = system.env()
        self.service = app_settings.get("RemoteServiceName", self.env) or "fulfilment"
        self.max_processing = 0
        self.max_pending = 0
        self.breaker: list[tuple[float, BreakerDoc]] = []  # (first seen, Unix s; the document) at each change
        self.rss_peak: dict[str, int] = {}  # bytes, by process name
        self.counts: list[tuple[int, int]] = []  # (Processing, Pending) of each sample
        self._last_doc: dict[str, Any] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Monitor:
        from orderflow.adapters import open_breaker_documents, open_stores

        self._stores = open_stores(self.env)
        self._documents = open_breaker_documents(self.env)
        await self.sample()
        await self.sample_breaker()
        self._tasks = [
            asyncio.create_task(self._every(self.every, self.sample)),
            asyncio.create_task(self._every(self.breaker_every, self.sample_breaker)),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await self.sample()
            await self.sample_breaker()
            for name, process in self._processes():
                self.rss_peak[name] = max(self.rss_peak.get(name, 0), _high_water_rss(_pid(process)))
        finally:
            await self._stores.aclose()
            await self._documents.aclose()

    @staticmethod
    async def _every(seconds: float, sample: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(seconds)
            await sample()

    def _processes(self) -> list[tuple[str, Process]]:
        return [
            (name, p)
            for name, p in (("devhost", self.system.devhost), ("agent", self.system.agent))
            if p is not None and p.running
        ]

    async def sample(self) -> None:
        state = self._stores.state
        processing = await state.count_in_state(ProcessState.PROCESSING)
        pending = await state.count_in_state(ProcessState.PENDING)
        self.counts.append((processing, pending))
        self.max_processing = max(self.max_processing, processing)
        self.max_pending = max(self.max_pending, pending)
        for name, process in self._processes():
            self.rss_peak[name] = max(self.rss_peak.get(name, 0), _tree_rss(_pid(process)))

    @property
    def samples(self) -> int:
        return len(self.counts)

    def samples_over(self, max_processing: int, max_pending: int) -> tuple[int, int]:
        """How many samples had more than `max_processing` Processing, and more than `max_pending` Pending."""
        return (sum(1 for p, _ in self.counts if p > max_processing), sum(1 for _, q in self.counts if q > max_pending))

    async def sample_breaker(self) -> None:
        found = await self._documents.get(self.service)
        if found is not None and found[0] != self._last_doc:
            self._last_doc = found[0]
            self.breaker.append((time.time(), BreakerDoc.model_validate(found[0])))

    def peak_rss_mb(self) -> dict[str, float]:
        return {name: round(rss / 2**20, 1) for name, rss in sorted(self.rss_peak.items())}


def _pid(process: Process) -> int:
    assert process.proc is not None
    return process.proc.pid


@dataclass(frozen=True)
class OpenRound:
    """One open period of the breaker: from `opened_at` to `open_until` (None: forced open), Unix seconds; `seen_at`:
    when the drill first read it (the open document was stored by then: from here on no call is let through)."""

    opened_at: float
    open_until: float | None
    seen_at: float
    reason: str


@dataclass(frozen=True)
class Episode:
    """The breaker away from closed: from its first round's opening to its closing (or the end of the drill)."""

    opened_at: float
    seen_at: float  # the first round's `seen_at`
    closed_at: float
    half_open_rounds: int  # every open round whose cool-down ended before the closing is followed by one


@dataclass(frozen=True)
class BreakerHistory:
    """The breaker's open rounds and closings, rebuilt from the documents a `Monitor` saw. Every round shows (it lasts
    at least the cool-down, many samples); the document's own times (openedAt, openUntil, changedAt) date it."""

    rounds: tuple[OpenRound, ...]
    closings: tuple[float, ...]

    @classmethod
    def from_docs(cls, docs: list[tuple[float, BreakerDoc]]) -> BreakerHistory:
        rounds: dict[float, OpenRound] = {}
        closings: set[float] = set()
        for seen, doc in docs:
            if doc.state is BreakerState.CLOSED:
                if doc.changed_at is not None:
                    closings.add(doc.changed_at.timestamp())
            elif doc.opened_at is not None:  # open, or half-open (which keeps its round's openedAt/openUntil)
                opened = doc.opened_at.timestamp()
                until = None if doc.open_until is None else doc.open_until.timestamp()
                reason = (doc.reason or "") if doc.state is BreakerState.OPEN else ""
                first = rounds.get(opened)
                rounds[opened] = OpenRound(
                    opened, until, first.seen_at if first else seen, (first.reason if first else "") or reason
                )
        return cls(tuple(sorted(rounds.values(), key=lambda r: r.opened_at)), tuple(sorted(closings)))

    def episodes(self, end: float) -> list[Episode]:
        out: list[Episode] = []
        for r in self.rounds:
            if out and r.opened_at < out[-1].closed_at:
                continue
            closed = next((c for c in self.closings if c > r.opened_at), end)
            inside = [x for x in self.rounds if r.opened_at <= x.opened_at < closed]
            half_open = sum(1 for x in inside if x.open_until is not None and x.open_until < closed)
            out.append(Episode(r.opened_at, r.seen_at, closed, half_open))
        return out


@dataclass(frozen=True)
class CallsWhileOpen:
    """The remote's calls against the breaker's episodes: `at_opening` arrived after an episode's openedAt but before
    its document was seen stored or within the grace (let through while it was still closed: in flight, or from a
    cached read), `while_open` from then to the closing (each must be a half-open probe), `strictly_open` those of
    `while_open` outside a half-open round."""

    at_opening: int
    while_open: int
    strictly_open: int
    half_open_rounds: int

    @classmethod
    def count(
        cls, history: BreakerHistory, calls: list[dict[str, Any]], end: float, grace: float = CACHE_TTL.total_seconds()
    ) -> CallsWhileOpen:
        """`grace`: calls granted before the opening may still arrive after it (in flight, or granted from an Agent's
        read of the breaker up to orderflow.breaker.CACHE_TTL old): those arriving within it of the opening count as
        `at_opening`, not as calls while open."""
        episodes = history.episodes(end)

        def excused_until(e: Episode) -> float:
            return max(e.seen_at, e.opened_at + grace)

        at_opening = [c for c in calls if any(e.opened_at <= c["at"] < excused_until(e) for e in episodes)]
        while_open = [c for c in calls if any(excused_until(e) <= c["at"] < e.closed_at for e in episodes)]
        strictly = [
            c
            for c in while_open
            if any(r.opened_at <= c["at"] < (end if r.open_until is None else r.open_until) for r in history.rounds)
        ]
        return cls(len(at_opening), len(while_open), len(strictly), sum(e.half_open_rounds for e in episodes))
