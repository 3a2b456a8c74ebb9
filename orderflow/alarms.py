"""Alarms before anything is stuck (issue 26): four alarms evaluated from the figures and the settings, each naming its
runbook row in the README ("Operating it"). `evaluate` is pure; `run` is the alarm timer's tick (triggers/alarms.py),
which also keeps the Pending-count samples and the firing set in the checkpoint document `alarms` (If-Match), sets
the metrics and raises an alert event when an alarm starts firing; the ops summary evaluates the same way.

- oldest-pending: the oldest due Pending order (retryAt unset or past) against `AlarmConfig.pending_threshold`;
- oldest-processing: the oldest Processing order against `AlarmConfig.processing_threshold`;
- backlog-growth: the Pending count's growth over BacklogGrowthWindowSeconds against BacklogGrowthAlarmOrders;
- dead-letters, per queue: any dead letter on a system queue, more than SenderDeadLetterAlarmDepth on a sender's.
Formulas and their reasons: docs/operations.md, "Alarms"."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from orderflow import settings, telemetry
from orderflow.breaker import BreakerConfig
from orderflow.errors import Conflict, PreconditionFailed
from orderflow.messages import STEPS
from orderflow.ports import StateStore
from orderflow.records import OrderStateRecord, ProcessState, format_utc, parse_utc
from orderflow.runtime import Tunables

log = logging.getLogger("orderflow.alarms")

OLDEST_PENDING = "oldest-pending"
OLDEST_PROCESSING = "oldest-processing"
BACKLOG_GROWTH = "backlog-growth"
DEAD_LETTERS = "dead-letters"
# Each alarm's row in the README's "Operating it" table: what to look at and what to do.
RUNBOOK = {
    OLDEST_PENDING: "Orders wait too long in Pending",
    OLDEST_PROCESSING: "Orders stay too long in Processing",
    BACKLOG_GROWTH: "The backlog grows faster than it drains",
    DEAD_LETTERS: "A dead-letter queue grows",
}
ALERT_KIND = "AlarmFiring"  # the alert event (telemetry.alert_event) of an alarm that starts firing
DOCUMENT = "alarms"  # the checkpoint document: {"samples": [[at, pending], ...], "firing": [key, ...]}
MAX_SAMPLES = 60  # samples within the window at most (spaced window / MAX_SAMPLES apart), plus the baseline
WRITE_ATTEMPTS = 5
# The oldest due Pending order is looked for among the oldest Pending orders: the first, then pages of this size.
PENDING_SCAN_PAGES = (1, 50, 50)

DepthsOf = Callable[[Sequence[str]], Awaitable[Sequence[Mapping[str, Any]]]]
Sample = tuple[datetime, int]


# --- NCRONTAB: the longest wait between two runs of a timer --------------------------------------------------------

_FIELDS = ((0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 7))  # second minute hour day month day-of-week
_MONTHS = {m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())}
_WEEKDAYS = {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}
_NAMES: tuple[Mapping[str, int], ...] = ({}, {}, {}, {}, _MONTHS, _WEEKDAYS)
DAY = 86400
SPAN_DAYS = 4 * 366  # day-restricted schedules are followed over four years (a leap day included)


def _field(text: str, index: int) -> frozenset[int]:
    low, high = _FIELDS[index]
    names = _NAMES[index]

    def number(value: str) -> int:
        return names[value.lower()] if value.lower() in names else int(value)

    values: set[int] = set()
    for part in text.split(","):
        base, slash, step_text = part.partition("/")
        step = int(step_text) if slash else 1
        if base in ("*", "?"):
            start, end = low, high
        elif "-" in base:
            first, last = base.split("-", 1)
            start, end = number(first), number(last)
        else:
            start = number(base)
            end = high if slash else start
        if step < 1 or not low <= start <= end <= high:
            raise ValueError(f"NCRONTAB field {text!r} is out of range {low}-{high}")
        values.update(range(start, end + 1, step))
    return frozenset(v % 7 for v in values) if index == 5 else frozenset(values)  # day-of-week 7 is Sunday too


@functools.lru_cache(maxsize=32)
def schedule_period(expression: str) -> timedelta:
    """The longest time between two consecutive occurrences of a 6-field NCRONTAB schedule (`{second} {minute} {hour}
    {day} {month} {day-of-week}`; a restricted day and day-of-week must both match, as NCrontab has it)."""
    fields = expression.split()
    if len(fields) != 6:
        raise ValueError(f"NCRONTAB needs 6 fields, got {expression!r}")
    seconds, minutes, hours, days, months, weekdays = (_field(f, i) for i, f in enumerate(fields))
    times = sorted(h * 3600 + m * 60 + s for h in hours for m in minutes for s in seconds)
    longest = max((b - a for a, b in zip(times, times[1:], strict=False)), default=0)
    if len(days) == 31 and len(months) == 12 and len(weekdays) == 7:
        return timedelta(seconds=max(longest, DAY - times[-1] + times[0]))
    start = date(2001, 1, 1)
    firing = [
        d
        for d in (start + timedelta(days=n) for n in range(SPAN_DAYS))
        if d.day in days and d.month in months and d.isoweekday() % 7 in weekdays
    ]
    if len(firing) < 2:
        return timedelta(days=SPAN_DAYS)
    across = max((b - a).days * DAY - times[-1] + times[0] for a, b in zip(firing, firing[1:], strict=False))
    return timedelta(seconds=max(longest, across))


# --- the thresholds ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AlarmConfig:
    """What the alarms compare against, from the app settings (orderflow/settings.py) and the tunables."""

    starter_period: timedelta  # the longest wait between two Starter runs (StarterSchedule)
    supervisor_period: timedelta  # the same for the Supervisor (SupervisorSchedule)
    claim_lease: timedelta  # ClaimLeaseSeconds
    step_timeout: timedelta  # StepTimeoutSeconds
    steps: int  # the order's steps (messages.STEPS)
    backoff_max: timedelta  # RetryBackoffMaxSeconds: the longest backoff of a recovered order
    breaker_max_cooldown: timedelta  # CircuitBreakerMaxCooldownSeconds: the longest deferral by an open breaker
    growth_orders: int  # BacklogGrowthAlarmOrders
    growth_window: timedelta  # BacklogGrowthWindowSeconds
    sender_dead_letters: int  # SenderDeadLetterAlarmDepth
    system_queues: frozenset[str] = frozenset()  # any dead letter here fires: agent-requests, agent-replies, alerts
    queues: frozenset[str] = frozenset()  # every queue whose dead letters are watched (as the summary lists them)

    @classmethod
    def from_env(cls, tunables: Tunables, env: Mapping[str, str] | None = None) -> AlarmConfig:
        def seconds(name: str) -> timedelta:
            return timedelta(seconds=settings.get_int(name, env))

        def period(name: str) -> timedelta:
            return schedule_period(settings.get(name, env) or "")

        return cls(
            starter_period=period("StarterSchedule"),
            supervisor_period=period("SupervisorSchedule"),
            claim_lease=tunables.claim_lease,
            step_timeout=tunables.step_timeout,
            steps=len(STEPS),
            backoff_max=tunables.backoff(63),  # past any cap: the cap (state_machine.exponential_backoff)
            breaker_max_cooldown=BreakerConfig.from_env(env).max_cooldown,
            growth_orders=settings.get_int("BacklogGrowthAlarmOrders", env),
            growth_window=seconds("BacklogGrowthWindowSeconds"),
            sender_dead_letters=settings.get_int("SenderDeadLetterAlarmDepth", env),
            system_queues=frozenset(
                {tunables.agent_requests_queue, tunables.agent_replies_queue, tunables.alerts_queue}
            ),
            queues=tunables.internal_queues() | tunables.allowed_reply_queues,
        )

    @property
    def pending_threshold(self) -> timedelta:
        """Starter period + max(RetryBackoffMaxSeconds, CircuitBreakerMaxCooldownSeconds) + ClaimLeaseSeconds: a
        due order is claimed by the next Starter run; a recovered or deferred one became due at most the longest
        backoff or cool-down after its last write; one claim lease of slack for a Starter run that failed."""
        return self.starter_period + max(self.backoff_max, self.breaker_max_cooldown) + self.claim_lease

    @property
    def processing_threshold(self) -> timedelta:
        """ClaimLeaseSeconds + steps x StepTimeoutSeconds + Supervisor period + RetryBackoffMaxSeconds: a whole
        attempt from its claim (the claim lease until the Scheduler sets its own deadline, then one CompleteBy per
        step), the Supervisor's next run to find it expired, and one longest backoff of margin."""
        return self.claim_lease + self.steps * self.step_timeout + self.supervisor_period + self.backoff_max

    def dead_letter_threshold(self, queue: str) -> int:
        return 0 if queue in self.system_queues else self.sender_dead_letters


# --- the evaluation -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Alarm:
    """One alarm's figure: `value` (seconds, orders or messages; None when unknown) against `threshold`."""

    name: str
    value: float | None
    threshold: float
    firing: bool
    queue: str | None = None  # dead-letters: the queue
    order_id: str | None = None  # oldest-pending, oldest-processing: the order
    detail: str | None = None  # why there is no value (an unreadable queue)

    @property
    def runbook(self) -> str:
        return RUNBOOK[self.name]

    @property
    def key(self) -> str:
        return self.name if self.queue is None else f"{self.name}:{self.queue}"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "queue": self.queue,
            "value": self.value,
            "threshold": self.threshold,
            "firing": self.firing,
            "runbook": self.runbook,
            "orderId": self.order_id,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Snapshot:
    """The figures the alarms read, taken at `now`."""

    now: datetime
    pending: int  # orders in Pending
    oldest_due_pending: OrderStateRecord | None  # the oldest Pending whose retryAt is unset or past
    oldest_processing: OrderStateRecord | None
    dead_letters: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # {count, capped} or {error}


def _age(now: datetime, rec: OrderStateRecord | None) -> float | None:
    return None if rec is None else round((now - rec.updated_at).total_seconds(), 3)


def _older(name: str, now: datetime, rec: OrderStateRecord | None, threshold: timedelta) -> Alarm:
    age, limit = _age(now, rec), threshold.total_seconds()
    return Alarm(name, age, limit, age is not None and age > limit, order_id=None if rec is None else rec.order_id)


def evaluate(config: AlarmConfig, snap: Snapshot, samples: Sequence[Sample]) -> list[Alarm]:
    """Every alarm, from the figures, the thresholds and the stored samples of the Pending count."""
    grew = growth(samples, snap.pending, snap.now, config.growth_window)
    found = [
        _older(OLDEST_PENDING, snap.now, snap.oldest_due_pending, config.pending_threshold),
        _older(OLDEST_PROCESSING, snap.now, snap.oldest_processing, config.processing_threshold),
        Alarm(BACKLOG_GROWTH, grew, config.growth_orders, grew is not None and grew > config.growth_orders),
    ]
    for queue, depth in sorted(snap.dead_letters.items()):
        count, limit = depth.get("count"), config.dead_letter_threshold(queue)
        firing = count is not None and count > limit
        found.append(Alarm(DEAD_LETTERS, count, limit, firing, queue=queue, detail=depth.get("error")))
    return found


# --- the Pending count's samples ------------------------------------------------------------------------------------


def samples_of(data: Mapping[str, Any]) -> list[Sample]:
    """The stored samples, oldest first (a malformed one is skipped)."""
    found = []
    for item in data.get("samples") or ():
        try:
            found.append((parse_utc(item[0]), int(item[1])))
        except (TypeError, ValueError, IndexError):
            continue
    return sorted(found)


def _current(samples: Sequence[Sample], now: datetime, window: timedelta) -> list[Sample]:
    """Samples from the last two windows (older ones are stale: the timer had stopped), none from the future."""
    return [s for s in samples if now - 2 * window <= s[0] <= now]


def growth(samples: Sequence[Sample], pending: int, now: datetime, window: timedelta) -> int | None:
    """How much the Pending count grew over the window: `pending` minus the newest sample at least a window old
    (the oldest sample while the samples span less than the window); None without samples."""
    current = _current(samples, now, window)
    if not current:
        return None
    before = [s for s in current if s[0] <= now - window]
    return pending - (before[-1] if before else current[0])[1]


def with_sample(samples: Sequence[Sample], now: datetime, pending: int, window: timedelta) -> list[Sample]:
    """The samples to keep after this one: at least window / MAX_SAMPLES apart, those within the window and the
    newest one before it (the baseline); never more than MAX_SAMPLES + 1."""
    kept = _current(samples, now, window)
    if not kept or now - kept[-1][0] >= window / MAX_SAMPLES:
        kept.append((now, pending))
    baseline = [s for s in kept if s[0] <= now - window][-1:]
    return (baseline + [s for s in kept if s[0] > now - window])[-(MAX_SAMPLES + 1) :]


async def read_document(state: StateStore) -> tuple[dict[str, Any], str | None]:
    found = await state.get_checkpoint(DOCUMENT)
    return ({}, None) if found is None else (dict(found[0]), found[1])


# --- gathering, the timer's tick, the metrics -----------------------------------------------------------------------


async def oldest_due_pending(state: StateStore, now: datetime) -> OrderStateRecord | None:
    """The oldest Pending order (by updatedAt) that is due: its retryAt unset or past (one whose retryAt is ahead
    waits by design). Looked for among the oldest 101; past them, every due order is younger than the youngest of
    those, which waits for its retryAt, within the longest backoff or cool-down of its last write: under the
    threshold."""
    continuation: str | None = None
    for size in PENDING_SCAN_PAGES:
        page = await state.query_in_state(ProcessState.PENDING, size, continuation)
        for rec, _ in page.items:
            if rec.retry_at is None or rec.retry_at <= now:
                return rec
        continuation = page.continuation
        if continuation is None:
            break
    return None


async def snapshot(state: StateStore, now: datetime, config: AlarmConfig, depths: DepthsOf) -> Snapshot:
    """The figures, read: one count, two short queries and the dead-letter depth of each watched queue."""
    queues = sorted(config.queues)
    pending, due, processing, found = await asyncio.gather(
        state.count_in_state(ProcessState.PENDING),
        oldest_due_pending(state, now),
        state.oldest_in_state(ProcessState.PROCESSING),
        depths(queues),
    )
    return Snapshot(now, pending, due, processing, dict(zip(queues, found, strict=True)))


async def stored(state: StateStore, config: AlarmConfig, snap: Snapshot) -> list[Alarm]:
    """The alarms against the stored samples, read only (the ops summary); the metrics are set."""
    data, _ = await read_document(state)
    found = evaluate(config, snap, samples_of(data))
    publish(found)
    return found


async def run(state: StateStore, config: AlarmConfig, snap: Snapshot) -> list[Alarm]:
    """The timer's tick: add this Pending count to the samples (the first is its own baseline), evaluate, store the
    samples and the firing set (If-Match: over every instance, one writer per change), raise the alert event of
    each alarm that was quiet and now fires (once, by the writer that recorded the change), set the metrics. A queue
    that could not be read keeps its last state."""
    found: list[Alarm] = []
    for _ in range(WRITE_ATTEMPTS):
        data, etag = await read_document(state)
        kept = with_sample(samples_of(data), snap.now, snap.pending, config.growth_window)
        found = evaluate(config, snap, kept)
        was = {str(k) for k in data.get("firing") or ()}
        firing = {a.key for a in found if a.firing or (a.value is None and a.detail and a.key in was)}
        document = {"samples": [[format_utc(at), n] for at, n in kept], "firing": sorted(firing)}
        try:
            await state.put_checkpoint(DOCUMENT, document, etag)
        except (PreconditionFailed, Conflict):
            continue
        for alarm in found:
            if alarm.firing and alarm.key not in was:
                announce(alarm)
        break
    else:
        log.info("alarms: the document moved %d times in a row; this tick's sample is not kept", WRITE_ATTEMPTS)
    publish(found)
    return found


def announce(alarm: Alarm) -> None:
    """The alert event of an alarm that starts firing (customEvents OrderflowAlert, kind AlarmFiring)."""
    where = "" if alarm.queue is None else f" on {alarm.queue}"
    telemetry.alert_event(
        ALERT_KIND,
        alarm.order_id,
        f"{alarm.name}{where}: {alarm.value} over {alarm.threshold}; runbook: README, Operating it, {alarm.runbook!r}",
        {"alarm": alarm.name, "queue": alarm.queue or "", "runbook": alarm.runbook},
    )


def publish(found: Sequence[Alarm]) -> None:
    """The metrics: orderflow.alarm.firing per alarm (and queue; none for a queue not read), orderflow.orders.
    oldest_age per state (0: no such order), orderflow.backlog.growth (none before the first sample)."""
    for alarm in found:
        if alarm.value is not None or alarm.detail is None:
            telemetry.set_alarm_firing(alarm.name, alarm.firing, alarm.queue)
        if alarm.name in (OLDEST_PENDING, OLDEST_PROCESSING):
            state = ProcessState.PENDING if alarm.name == OLDEST_PENDING else ProcessState.PROCESSING
            telemetry.set_oldest_age(state.value, alarm.value or 0.0)
        if alarm.name == BACKLOG_GROWTH and alarm.value is not None:
            telemetry.set_backlog_growth(int(alarm.value))
