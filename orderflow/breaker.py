"""The shared circuit breaker (seed 003, "circuit breaker"): one per remote service, shared by every Agent instance
and read by the Starter.

State is one JSON document per remote service (id = `RemoteServiceName`, `orderflow.adapters.open_breaker_documents`);
every write is create-if-absent or If-Match, and a writer that loses re-reads and re-applies, so no count is lost.
closed → (failures in the rolling window ≥ threshold) → open → (cool-down over, lazily on read) → half-open →
closed on a probe's success, open again (cool-down × 2) on its failure; `force_open` / `force_close` for operators.
The pure functions (`decide`, `on_failure`, `on_success`, `forced`) hold the rules; `SharedBreaker` reads and writes
the document around them, caches reads for `cache_ttl`, and lets calls through when the store is unreachable.
The states in detail: docs/modules-product.md."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orderflow import settings, telemetry
from orderflow.clock import Clock, ensure_utc
from orderflow.errors import Conflict, PreconditionFailed
from orderflow.ports import DocumentStore
from orderflow.records import UtcDatetime, format_utc
from orderflow.text import one_line

log = logging.getLogger("orderflow.breaker")

CIRCUIT_OPEN = "CircuitOpen"  # AgentReply.errorCode of a request the open breaker answered without calling
WRITE_ATTEMPTS = 32


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


STATE_VALUES = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}  # the gauge's values


@dataclass(frozen=True)
class BreakerConfig:
    failure_threshold: int  # 0: the breaker is off
    window: timedelta
    cooldown: timedelta
    max_cooldown: timedelta
    probes: int

    def __post_init__(self) -> None:
        if self.failure_threshold < 0 or self.probes < 1:
            raise ValueError("CircuitBreakerFailureThreshold must be >= 0 and CircuitBreakerProbes >= 1")
        if min(self.window, self.cooldown, self.max_cooldown) <= timedelta(0) or self.max_cooldown < self.cooldown:
            raise ValueError("the breaker's window and cool-downs must be positive, the cap at least the cool-down")

    @property
    def enabled(self) -> bool:
        return self.failure_threshold > 0

    @property
    def probe_lease(self) -> timedelta:
        """A probe not reported within this is given back (its Agent died or hung)."""
        return self.window

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BreakerConfig:
        def seconds(name: str) -> timedelta:
            return timedelta(seconds=settings.get_int(name, env))

        return cls(
            failure_threshold=settings.get_int("CircuitBreakerFailureThreshold", env),
            window=seconds("CircuitBreakerWindowSeconds"),
            cooldown=seconds("CircuitBreakerCooldownSeconds"),
            max_cooldown=seconds("CircuitBreakerMaxCooldownSeconds"),
            probes=settings.get_int("CircuitBreakerProbes", env),
        )


class BreakerDoc(BaseModel):
    """The stored document of one remote service's breaker (camelCase JSON)."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    service: str
    state: BreakerState = BreakerState.CLOSED
    failures: tuple[UtcDatetime, ...] = ()  # failed requests inside the rolling window (closed only)
    opened_at: UtcDatetime | None = Field(default=None, alias="openedAt")
    open_until: UtcDatetime | None = Field(default=None, alias="openUntil")  # None while forced open
    cooldown_seconds: float = Field(default=0.0, alias="cooldownSeconds")
    probes_started: int = Field(default=0, alias="probesStarted")
    half_open_since: UtcDatetime | None = Field(default=None, alias="halfOpenSince")
    forced: bool = False  # held open by an operator
    changed_at: UtcDatetime | None = Field(default=None, alias="changedAt")
    reason: str | None = None

    def to_data(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def effective_state(doc: BreakerDoc, now: datetime) -> BreakerState:
    """Open turns half-open once its cool-down is over (no timer: whoever reads it next sees it)."""
    if (
        doc.state is BreakerState.OPEN
        and not doc.forced
        and doc.open_until is not None
        and doc.open_until <= ensure_utc(now)
    ):
        return BreakerState.HALF_OPEN
    return doc.state


def _probes_reset(doc: BreakerDoc, config: BreakerConfig, now: datetime) -> bool:
    """Whether the half-open round starts afresh: just turned half-open, or its probes were never reported."""
    if doc.state is not BreakerState.HALF_OPEN:
        return True
    return doc.half_open_since is None or doc.half_open_since + config.probe_lease <= ensure_utc(now)


def probes_left(doc: BreakerDoc, config: BreakerConfig, now: datetime) -> int:
    if effective_state(doc, now) is not BreakerState.HALF_OPEN:
        return 0
    return config.probes if _probes_reset(doc, config, now) else max(0, config.probes - doc.probes_started)


def retry_after(doc: BreakerDoc, config: BreakerConfig, now: datetime) -> timedelta:
    """When a refused call is worth trying again: the end of the cool-down, else one cool-down (forced open, or the
    probes of a half-open round are all taken)."""
    at = ensure_utc(now)
    if doc.state is BreakerState.OPEN and doc.open_until is not None and doc.open_until > at:
        return doc.open_until - at
    return config.cooldown


class Decision(StrEnum):
    CALL = "call"  # closed: call
    PROBE = "probe"  # half-open: call as one of the probes
    REFUSE = "refuse"  # open, or no probe left: do not call


def decide(doc: BreakerDoc, config: BreakerConfig, now: datetime) -> tuple[Decision, BreakerDoc | None]:
    """Whether a call may go through; the document to write when it takes a probe (else None)."""
    state = effective_state(doc, now)
    if state is BreakerState.CLOSED:
        return Decision.CALL, None
    if state is BreakerState.OPEN or probes_left(doc, config, now) == 0:
        return Decision.REFUSE, None
    at = ensure_utc(now)
    fresh = _probes_reset(doc, config, now)
    return Decision.PROBE, doc.model_copy(
        update={
            "state": BreakerState.HALF_OPEN,
            "probes_started": 1 if fresh else doc.probes_started + 1,
            "half_open_since": at if fresh else doc.half_open_since,
            "changed_at": at if fresh else doc.changed_at,
            "reason": "cool-down over" if fresh else doc.reason,
        }
    )


def _open(doc: BreakerDoc, cooldown: timedelta, now: datetime, reason: str) -> BreakerDoc:
    at = ensure_utc(now)
    return doc.model_copy(
        update={
            "state": BreakerState.OPEN,
            "failures": (),
            "opened_at": at,
            "open_until": at + cooldown,
            "cooldown_seconds": cooldown.total_seconds(),
            "probes_started": 0,
            "half_open_since": None,
            "forced": False,
            "changed_at": at,
            "reason": reason,
        }
    )


def on_failure(doc: BreakerDoc, config: BreakerConfig, now: datetime, probe: bool) -> BreakerDoc | None:
    """A request failed transiently after its retries, or a probe call failed: the remote is unwell. The new
    document, or None when nothing changes."""
    at = ensure_utc(now)
    if probe and doc.state is BreakerState.HALF_OPEN:
        cooldown = min(config.max_cooldown, timedelta(seconds=doc.cooldown_seconds or 0) * 2 or config.cooldown)
        return _open(doc, max(cooldown, config.cooldown), now, "a probe failed")
    if doc.state is not BreakerState.CLOSED:
        return None  # a call that started before the breaker opened: already counted as an outage
    window = tuple(f for f in doc.failures if f > at - config.window) + (at,)
    if len(window) >= config.failure_threshold:
        return _open(
            doc, config.cooldown, now, f"{len(window)} failed requests within {int(config.window.total_seconds())} s"
        )
    return doc.model_copy(update={"failures": window[-config.failure_threshold :]})


def on_success(doc: BreakerDoc, now: datetime, probe: bool) -> BreakerDoc | None:
    """A call succeeded: a probe's success closes a half-open breaker; otherwise nothing to write."""
    if probe and doc.state is BreakerState.HALF_OPEN:
        return closed_doc(doc.service, now, "a probe succeeded")
    return None


def closed_doc(service: str, now: datetime, reason: str) -> BreakerDoc:
    return BreakerDoc(service=service, state=BreakerState.CLOSED, changed_at=ensure_utc(now), reason=reason)


def forced(doc: BreakerDoc, state: BreakerState, now: datetime, by: str) -> BreakerDoc:
    """An operator's command: open (held until closed by an operator) or closed (counts reset, automatic again)."""
    if state is BreakerState.OPEN:
        return _open(doc, timedelta(0), now, f"forced open by {by}").model_copy(
            update={"open_until": None, "forced": True}
        )
    if state is BreakerState.CLOSED:
        return closed_doc(doc.service, now, f"forced closed by {by}")
    raise ValueError("an operator can force a breaker open or closed, not half-open")


@dataclass(frozen=True)
class Transition:
    """The breaker of `service` changed from `before` to `after` (what operators are alerted about)."""

    service: str
    before: BreakerState
    after: BreakerState
    reason: str
    changed_at: datetime

    @property
    def opened(self) -> bool:
        return self.before is BreakerState.CLOSED and self.after is BreakerState.OPEN

    @property
    def closed(self) -> bool:
        return self.before is not BreakerState.CLOSED and self.after is BreakerState.CLOSED


@dataclass(frozen=True)
class Permit:
    """A call may go through; `probe` when it is one of the half-open breaker's probes."""

    probe: bool = False


@dataclass(frozen=True)
class Refusal:
    """The breaker is open (or its probes are taken): do not call; try again after `retry_after`."""

    state: BreakerState
    retry_after: timedelta


@dataclass(frozen=True)
class BreakerView:
    service: str
    state: BreakerState
    probes_left: int
    doc: BreakerDoc

    def claims_allowed(self) -> int | None:
        """How many orders the Starter may claim for this service: None = no limit (closed)."""
        if self.state is BreakerState.CLOSED:
            return None
        return self.probes_left if self.state is BreakerState.HALF_OPEN else 0


OnTransition = Callable[[Transition], Awaitable[None]]
Change = Callable[[BreakerDoc, datetime], BreakerDoc | None]  # a pure edit of the document (None: leave it)


# How long an Agent trusts its last read of the breaker: it may make calls for up to this long after another instance
# opened it (and a call granted just before the opening still reaches the remote after it).
CACHE_TTL = timedelta(seconds=1)


class SharedBreaker:
    """The breaker of one remote service over its stored document (see the module docstring)."""

    def __init__(
        self,
        documents: DocumentStore,
        service: str,
        config: BreakerConfig,
        clock: Clock,
        on_transition: OnTransition | None = None,
        cache_ttl: timedelta = CACHE_TTL,
    ) -> None:
        self.documents = documents
        self.service = service
        self.config = config
        self._clock = clock
        self._on_transition = on_transition
        self._cache_ttl = cache_ttl
        self._cached: tuple[BreakerDoc, str | None, datetime] | None = None
        self._tickets = itertools.count()  # orders reads and writes as they start (reads) or land (writes)
        self._cached_ticket = -1
        # One write at a time from this instance, and the changes its concurrent requests ask for meanwhile ride
        # together in its next write (group commit): its own requests never race each other on the etag, and it makes
        # one write per batch, not one per request, so it cannot starve another instance's writer.
        self._writing = asyncio.Lock()
        self._queued: list[tuple[Change, asyncio.Future[BreakerDoc | None]]] = []

    async def _read(self, fresh: bool = False) -> tuple[BreakerDoc, str | None]:
        started, ticket = self._clock.now(), next(self._tickets)
        if not fresh and self._cached is not None and started - self._cached[2] < self._cache_ttl:
            return self._cached[0], self._cached[1]
        found = await self.documents.get(self.service)
        doc, etag = (
            (BreakerDoc(service=self.service), None)
            if found is None
            else (BreakerDoc.model_validate(found[0]), found[1])
        )
        # A read is as fresh as its start. One that started before the cached entry was made (a concurrent write's
        # result, or a later read) must not replace it: it could put a closed document back after this instance
        # opened it.
        if self._cached is None or self._cached_ticket < ticket:
            self._cached, self._cached_ticket = (doc, etag, started), ticket
        return doc, etag

    async def view(self) -> BreakerView:
        """The breaker as the Starter and operators see it (cached read)."""
        doc, _ = await self._read()
        now = self._clock.now()
        view = BreakerView(self.service, self._observe(doc, now), probes_left(doc, self.config, now), doc)
        return view

    def _observe(self, doc: BreakerDoc, now: datetime) -> BreakerState:
        """The effective state, also reported as the gauge `orderflow.circuit.state` (what infra alerts on)."""
        state = effective_state(doc, now)
        telemetry.set_circuit_state(self.service, STATE_VALUES[state])
        return state

    async def update(self, change: Change) -> BreakerDoc | None:
        """Read fresh, apply `change`, write If-Match; re-read and re-apply on a lost race. The document as `change`
        left it, or None when it left it alone. Changes asked for while this instance's write is in flight are applied
        in order, in one read-modify-write, by whichever of their callers gets the lock first. Reports each transition
        to `on_transition`."""
        done: asyncio.Future[BreakerDoc | None] = asyncio.get_running_loop().create_future()
        self._queued.append((change, done))
        async with self._writing:
            if not done.done():
                batch, self._queued = self._queued, []
                try:
                    await self._update(batch)
                except asyncio.CancelledError:
                    self._queued[:0] = [item for item in batch if not item[1].done()]  # the others still want theirs
                    raise
                except Exception as exc:  # noqa: BLE001 - every caller of the batch gets the error
                    for _, waiting in batch:
                        if not waiting.done():
                            waiting.set_exception(exc)
        return done.result()

    async def _update(self, batch: list[tuple[Change, asyncio.Future[BreakerDoc | None]]]) -> None:
        for _ in range(WRITE_ATTEMPTS):
            doc, etag = await self._read(fresh=True)
            now = self._clock.now()
            current, steps, results = doc, list[tuple[BreakerDoc, BreakerDoc]](), list[BreakerDoc | None]()
            for change, _ in batch:
                new = change(current, now)
                results.append(new)
                if new is not None:
                    steps.append((current, new))
                    current = new
            if steps:
                try:
                    new_etag = await self.documents.put(self.service, current.to_data(), etag)
                except (PreconditionFailed, Conflict):
                    continue
                self._cached, self._cached_ticket = (current, new_etag, self._clock.now()), next(self._tickets)
                for before, after in steps:
                    await self._report(before, after, now)
            for (_, waiting), result in zip(batch, results, strict=True):
                waiting.set_result(result)
            return
        raise PreconditionFailed(f"breaker {self.service!r}: {WRITE_ATTEMPTS} writes lost their race")

    async def _report(self, old: BreakerDoc, new: BreakerDoc, now: datetime) -> None:
        before, after = effective_state(old, now), self._observe(new, now)
        if before is after:
            return
        log.warning("circuit breaker %s: %s → %s (%s)", self.service, before.value, after.value, new.reason)
        if self._on_transition is not None:
            await self._on_transition(Transition(self.service, before, after, new.reason or "", new.changed_at or now))

    async def acquire(self) -> Permit | Refusal:
        """Before a remote call: a Permit, or a Refusal while open. Fails open when the store is unreachable."""
        if not self.config.enabled:
            return Permit()
        try:
            doc, _ = await self._read()
            now = self._clock.now()
            self._observe(doc, now)
            decision, _ = decide(doc, self.config, now)
            if decision is Decision.CALL:
                return Permit()
            if decision is Decision.REFUSE:
                return Refusal(effective_state(doc, now), retry_after(doc, self.config, now))
            taken: list[Decision] = []

            def take(current: BreakerDoc, at: datetime) -> BreakerDoc | None:
                decision, new = decide(current, self.config, at)
                taken[:] = [decision]
                return new

            await self.update(take)
            if taken == [Decision.PROBE]:
                return Permit(probe=True)
            if taken == [Decision.CALL]:
                return Permit()
            doc, _ = await self._read()
            now = self._clock.now()
            return Refusal(effective_state(doc, now), retry_after(doc, self.config, now))
        except Exception:  # the breaker must never be why a call is not made
            log.exception("circuit breaker %s unreadable; letting the call through", self.service)
            return Permit()

    async def record(self, permit: Permit, ok: bool) -> None:
        """After a call: its outcome (ok = succeeded or failed permanently: the remote answered; not ok = transient)."""
        if not self.config.enabled:
            return
        try:
            if ok:
                if permit.probe:
                    await self.update(lambda doc, now: on_success(doc, now, probe=True))
                return
            await self.update(lambda doc, now: on_failure(doc, self.config, now, permit.probe))
        except Exception:
            log.exception("circuit breaker %s: could not record a call's outcome", self.service)

    async def force(self, state: BreakerState, by: str) -> BreakerDoc:
        """An operator's command (see `forced`)."""
        written = await self.update(lambda doc, now: forced(doc, state, now, by))
        assert written is not None
        return written


def shared_breaker(
    documents: DocumentStore,
    clock: Clock,
    env: Mapping[str, str] | None = None,
    on_transition: OnTransition | None = None,
) -> SharedBreaker:
    """The breaker of the configured remote service (`RemoteServiceName`), with the configured rules."""
    service = settings.get("RemoteServiceName", env) or "fulfilment"
    return SharedBreaker(documents, service, BreakerConfig.from_env(env), clock, on_transition)


# -- what operators see: the CLI's `breaker show` and the ops summary ----------------------------------------------


class BreakerUnreadable(Exception):
    """A breaker document could not be read; the message names the breaker and the cause, on one line."""


def breaker_row(service: str, doc: BreakerDoc, config: BreakerConfig, now: datetime) -> dict[str, Any]:
    """What `show` prints of one breaker (JSON field names)."""
    in_window = sum(1 for failure in doc.failures if failure > now - config.window)
    return {
        "service": service,
        "state": doc.state.value,
        "effectiveState": effective_state(doc, now).value,
        "failuresInWindow": in_window,
        "failureThreshold": config.failure_threshold,
        "windowSeconds": config.window.total_seconds(),
        "openUntil": None if doc.open_until is None else format_utc(doc.open_until),
        "probesLeft": probes_left(doc, config, now),
        "forced": doc.forced,
        "cooldownSeconds": doc.cooldown_seconds,
        "changedAt": None if doc.changed_at is None else format_utc(doc.changed_at),
        "reason": doc.reason,
        "enabled": config.enabled,
    }


async def _read(breaker: SharedBreaker) -> BreakerDoc:
    try:
        return (await breaker.view()).doc
    except Exception as exc:
        raise BreakerUnreadable(f"cannot read breaker {breaker.service!r}: {one_line(exc)}") from exc


async def show_breakers(
    services: Sequence[str], documents: Any, config: BreakerConfig, clock: Clock
) -> list[dict[str, Any]]:
    """One `breaker_row` per service: what `orderflow breaker show` prints and the ops summary lists."""
    rows = []
    for service in services:
        doc = await _read(SharedBreaker(documents, service, config, clock))
        rows.append(breaker_row(service, doc, config, clock.now()))
    return rows
