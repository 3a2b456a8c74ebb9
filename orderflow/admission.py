"""Admission control (seed 001, "admission control"): a bound on the orders in Processing and on the Pending backlog.

One document, `admission`, in the checkpoint container holds {processing, pending, pendingByApp, refreshedAt,
reserved}; every write is If-Match (etag). `MaxOrdersInProcessing` is global and strict across instances: a claim
`reserve`s a slot first, a record that leaves Processing frees it (`exited`), each Starter run `refresh`es the
figures; writes are coalesced per process. It is shared fairly: the Starter claims round-robin over the apps with due
work, and the fast path takes no slot while another app's orders wait (`others_waiting`). `MaxPendingOrders` holds
per app (`MaxPendingOrdersPerApp`), O(1) per submission: an app's new order past its own bound is `rejected`
(`backlog full`), nothing written; another app's flood never counts. Reasoning: docs/modules-product.md."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from orderflow import telemetry
from orderflow.errors import Conflict, PreconditionFailed
from orderflow.records import ProcessState, format_utc, parse_utc
from orderflow.runtime import Services

log = logging.getLogger("orderflow.admission")

DOCUMENT = "admission"
WRITE_ATTEMPTS = 32
BACKLOG_CACHE_SECONDS = 1.0
BACKLOG_FULL = "backlog full"
# A reserved slot's record claim lands within this (the Starter claims its whole batch before it starts any Scheduler:
# one If-Match write each): a refresh counts every slot reserved this long before its count query as in flight,
# whether or not the count already saw its claim.
RESERVATION_GRACE = timedelta(seconds=2)
# How long an exit may wait in its process for a write to ride on (`exited`).
EXIT_COALESCE = timedelta(seconds=1)


@dataclass(frozen=True)
class Figures:
    processing: int = 0
    pending: int = 0
    refreshed_at: str | None = None  # when the count queries of the last refresh started
    reserved: tuple[str, ...] = ()  # when the slots of the last RESERVATION_GRACE were reserved
    # Each app's Pending backlog (empty: a document written before per-app bounds; `pending_of` then answers the
    # total, an over-count, until the next refresh).
    pending_by_app: Mapping[str, int] = field(default_factory=dict)
    # Starter runs so far (each refresh adds one): whose turn it is to be claimed first (orderflow/starter.py).
    turn: int = 0

    def to_data(self) -> dict[str, Any]:
        return {
            "processing": self.processing,
            "pending": self.pending,
            "refreshedAt": self.refreshed_at,
            "reserved": list(self.reserved),
            "pendingByApp": dict(self.pending_by_app),
            "turn": self.turn,
        }

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Figures:
        return cls(
            int(data.get("processing", 0)),
            int(data.get("pending", 0)),
            data.get("refreshedAt"),
            tuple(data.get("reserved", ())),
            {str(k): int(v) for k, v in dict(data.get("pendingByApp") or {}).items()},
            int(data.get("turn", 0)),
        )

    def pending_of(self, app: str) -> int:
        """The Pending backlog of `app`."""
        return self.pending_by_app.get(app, 0) if self.pending_by_app else self.pending

    def leaving_pending(self, granted: Sequence[str]) -> dict[str, int]:
        """`pending_by_app` after the orders of `granted` (one app name per slot) were claimed."""
        by_app = dict(self.pending_by_app)
        for app in granted:
            if app in by_app:
                by_app[app] = max(0, by_app[app] - 1)
        return by_app

    def reserved_since(self, since: datetime) -> int:
        return sum(1 for at in self.reserved if parse_utc(at) >= since)


async def read_figures(services: Services) -> tuple[Figures, str | None]:
    found = await services.state.get_checkpoint(DOCUMENT)
    return (Figures(), None) if found is None else (Figures.from_data(found[0]), found[1])


async def _write(services: Services, figures: Figures, etag: str | None) -> bool:
    """If-Match (or create) the document; False when another writer got there first."""
    try:
        await services.state.put_checkpoint(DOCUMENT, figures.to_data(), etag)
    except (PreconditionFailed, Conflict):
        return False
    return True


async def refresh(services: Services) -> Figures:
    """The figures from two count queries, plus the slots reserved so recently that their claims may not have
    landed when the count ran (the Starter, once per run). If-Match: a reservation or an exit meanwhile makes it start
    over. `refreshedAt` is when the counts had finished: an exit after it is not in them (`exited`)."""
    for _ in range(WRITE_ATTEMPTS):
        current, etag = await read_figures(services)
        started = services.clock.now()
        processing = await services.state.count_in_state(ProcessState.PROCESSING)
        pending = await services.state.count_in_state(ProcessState.PENDING)
        by_app = await _pending_by_app(services, pending)
        telemetry.set_orders_in_state(ProcessState.PROCESSING.value, processing)  # gauge orderflow.orders.in_state
        telemetry.set_orders_in_state(ProcessState.PENDING.value, pending)
        recent = tuple(at for at in current.reserved if parse_utc(at) >= started - RESERVATION_GRACE)
        figures = Figures(
            processing + len(recent), pending, format_utc(services.clock.now()), recent, by_app, current.turn + 1
        )
        if await _write(services, figures, etag):
            return figures
    raise PreconditionFailed(f"admission refresh lost {WRITE_ATTEMPTS} races in a row")


async def _pending_by_app(services: Services, total: int) -> dict[str, int]:
    """Each app's Pending count: one single-app count query each (one app: the total, no query)."""
    apps = services.tunables.apps
    if len(apps.names) == 1:
        return {apps.names[0]: total}
    by_app = {}
    for app in apps.names:
        by_app[app] = await services.state.count_in_state(ProcessState.PENDING, keys=apps.keys_of(app))
    return by_app


async def exited(services: Services, left_at: datetime) -> None:
    """An order left Processing at `left_at` (Processed, Error, deferred, recovered to Pending): one slot free, unless
    the last refresh's counts already left it out (it left before they finished). Called once, by whoever wrote that
    transition; a crash before the write leaves an over-count, which the next refresh corrects. Best effort.

    Deferred, not written at once: the exit rides on this process's next admission write (a reservation's, or
    another exit's once the oldest waiting exit is `EXIT_COALESCE` old). Until then it is an over-count, the safe
    direction for the bound; a reservation at the bound writes the waiting exits first, so no slot stays blocked."""
    _waiting(services).append(_Request(exit_at=left_at))
    if services.clock.now() - _oldest_exit(services) >= EXIT_COALESCE:
        await flush(services)


def _oldest_exit(services: Services) -> datetime:
    return min(r.exit_at for r in _waiting(services) if r.exit_at is not None)


async def flush(services: Services) -> None:
    """Write whatever this process has waiting (deferred exits); nothing when nothing waits."""
    if _waiting(services):
        await _queue(services, None)


def _lock(services: Services) -> asyncio.Lock:
    """One admission write at a time per process: its concurrent claims queue here instead of racing each other on
    the etag, so only other instances' writes make one re-read."""
    if services.admission_lock is None:
        services.admission_lock = asyncio.Lock()
    return services.admission_lock


async def reserve(services: Services, wanted: int = 1, apps: Sequence[str | None] = ()) -> int:
    """Reserve up to `wanted` Processing slots before claiming; the number granted (0 at the bound). `apps`: the app
    of each order the slots are for, in claim order (the first `granted` of them leave their app's Pending backlog).
    Coalesced with the other reservations and exits waiting in this process (`_flush`)."""
    if wanted <= 0:
        return 0
    return await _queue(services, _Request(wanted=wanted, apps=tuple(apps)))


@dataclass
class _Request:
    """A reservation (`wanted` slots) or an exit (`exit_at`) waiting for the process's next admission write."""

    wanted: int = 0
    exit_at: datetime | None = None
    apps: tuple[str | None, ...] = ()  # the app of each wanted slot's order, when known
    granted: int = 0
    done: bool = False


async def _queue(services: Services, request: _Request | None) -> int:
    """Group commit: requests queue while a write is in flight, and whoever takes the lock next writes every request
    queued by then in one If-Match write — under load, many submissions' reservations and many activities' exits
    cost one write between them instead of one each. A request someone else wrote returns at once. None: write
    what waits."""
    waiting = _waiting(services)
    if request is not None:
        waiting.append(request)
    async with _lock(services):
        if (request is None and waiting) or (request is not None and not request.done):
            batch = list(waiting)
            waiting.clear()
            try:
                await _flush(services, batch)
            finally:
                for queued in batch:
                    queued.done = True
    return 0 if request is None else request.granted


def _waiting(services: Services) -> list[_Request]:
    if services.admission_waiting is None:
        services.admission_waiting = []
    queue: list[_Request] = services.admission_waiting
    return queue


async def _flush(services: Services, batch: list[_Request]) -> None:
    """One write for `batch`: exits first (each frees a slot unless the last refresh's counts already left it out),
    then reservations in arrival order, each granted what is left under the bound. No write when nothing changes."""
    bound = services.tunables.max_in_processing
    for _ in range(WRITE_ATTEMPTS):
        figures, etag = await read_figures(services)
        refreshed = None if figures.refreshed_at is None else parse_utc(figures.refreshed_at)
        processing = figures.processing
        for request in batch:
            if request.exit_at is not None and processing > 0 and (refreshed is None or request.exit_at >= refreshed):
                processing -= 1
        granted_total = 0
        granted_apps: list[str] = []
        for request in batch:
            request.granted = max(0, min(request.wanted, bound - processing - granted_total))
            granted_total += request.granted
            granted_apps += [a for a in request.apps[: request.granted] if a is not None]
        if processing == figures.processing and granted_total == 0:
            return
        now = services.clock.now()
        recent = tuple(at for at in figures.reserved if parse_utc(at) >= now - RESERVATION_GRACE)
        updated = replace(
            figures,
            processing=processing + granted_total,
            pending=max(0, figures.pending - granted_total),
            reserved=recent + (format_utc(now),) * granted_total,
            pending_by_app=figures.leaving_pending(granted_apps),
        )
        if await _write(services, updated, etag):
            return
    for request in batch:
        request.granted = 0  # lost every race: nothing reserved, exits left counted until the next refresh
    log.info("admission: a write lost %d races in a row; the next refresh corrects the figures", WRITE_ATTEMPTS)


async def release(services: Services, count: int) -> None:
    """Give back reserved slots whose claims were not made (another Starter won the record). Best effort: a slot not
    given back is an over-count, which the next refresh corrects."""
    if count <= 0:
        return
    async with _lock(services):
        for _ in range(WRITE_ATTEMPTS):
            figures, etag = await read_figures(services)
            updated = replace(figures, processing=max(0, figures.processing - count))
            if await _write(services, updated, etag):
                return
    log.info("admission: %d unused slot(s) left counted until the next refresh", count)


@dataclass
class BacklogGate:
    """One process's view of one app's Pending backlog: the stored figure (cached for a second) plus the orders this
    process accepted for the app since that figure's count started. `admit` checks and counts in one step (no await
    in between), so concurrent submissions in one process cannot all pass at the bound."""

    app: str
    figures: Figures = field(default_factory=Figures)
    read_at: datetime | None = None
    accepted_at: deque[datetime] = field(default_factory=deque)

    async def _figures(self, services: Services) -> Figures:
        now = services.clock.now()
        if self.read_at is None or now - self.read_at >= timedelta(seconds=BACKLOG_CACHE_SECONDS):
            self.figures, self.read_at = (await read_figures(services))[0], now
        return self.figures

    def _counted_since(self) -> datetime | None:
        return None if self.figures.refreshed_at is None else parse_utc(self.figures.refreshed_at)

    def backlog(self) -> int:
        since = self._counted_since()
        while since is not None and self.accepted_at and self.accepted_at[0] < since - RESERVATION_GRACE:
            self.accepted_at.popleft()  # its record was written before the figure's count started: counted there
        return self.figures.pending_of(self.app) + len(self.accepted_at)

    async def admit(self, services: Services) -> bool:
        """Whether a new order fits under the app's MaxPendingOrders; if so it is counted at once (`release` if not
        stored as Pending)."""
        await self._figures(services)
        if self.backlog() >= services.tunables.apps.pending_bound(self.app):
            return False
        self.accepted_at.append(services.clock.now())
        return True

    def release(self) -> None:
        """An admitted order that was not stored after all (a duplicate, a conflict, a failure)."""
        if self.accepted_at:
            self.accepted_at.pop()


def backlog_gate(services: Services, app: str) -> BacklogGate:
    """This process's gate of `app`, one per app and services."""
    if services.backlog is None:
        services.backlog = {}
    gates: dict[str, BacklogGate] = services.backlog
    if app not in gates:
        gates[app] = BacklogGate(app)
    return gates[app]


def others_waiting(services: Services, app: str) -> bool:
    """Whether an app other than `app` has orders waiting in Pending, as this process last saw the figures (its own
    acceptances since included). While one does, `app`'s new orders take no Processing slot at submission: they wait
    for the Starter, which shares the slots round-robin among the apps with due work."""
    mine = backlog_gate(services, app)  # its figures were read (at most a second ago) by this submission's `admit`
    since = mine._counted_since()
    for other in services.tunables.apps.names:
        if other == app:
            continue
        gate = services.backlog.get(other)
        accepted = 0 if gate is None else sum(1 for at in gate.accepted_at if since is None or at > since)
        if mine.figures.pending_by_app.get(other, 0) + accepted > 0:
            return True
    return False
