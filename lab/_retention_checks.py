"""The judge of the `retention` drill (lab/retention_drills.py): pure functions of what the drill read, so that
tests/lab/test_retention_drill.py can feed it every failure. `judge_retention` checks the retention phase (documents
expired, instances purged, the unfinished and the kept untouched, the index live, the alarms quiet), `judge_alarms`
the alarm phase (quiet when healthy, each alarm fired when forced, quiet again), `judge` both as one `Verdict`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orderflow.records import TTL_NEVER
from orderflow.retention import FINISHED_STATUSES

from .drill_common import Verdict
from .invariants import Findings

DRILL = "retention"
OLDEST_PENDING = "oldest-pending"
OLDEST_PROCESSING = "oldest-processing"
BACKLOG_GROWTH = "backlog-growth"
DEAD_LETTERS = "dead-letters"
ALARMS = (OLDEST_PENDING, OLDEST_PROCESSING, BACKLOG_GROWTH, DEAD_LETTERS)
UNFINISHED = ("Pending", "Processing", "CompensationInProgress")
MIN_TICKS = 3  # the alarm timer ran at least this often in a phase judged quiet: quiet means evaluated


@dataclass(frozen=True)
class Doc:
    """One order's two documents as the drill read them: readable or not (an expired document is not), and what
    they say about retention. `record_expiry`/`stored_expiry`: the embedded store holds an expiry time for it."""

    record: bool
    stored: bool
    state: str | None = None
    attempt: int = 0
    ttl: int | None = None
    notified: bool = False
    kept: bool = False
    record_expiry: bool = False
    stored_expiry: bool = False
    deadline_in_s: float | None = None  # from the read to the record's CompleteBy (None: it has none)


@dataclass(frozen=True)
class IndexRow:
    """One entry of the recovery index and whether it is live (orderflow.ports.IndexEntry.matches its record)."""

    order_id: str
    live: bool


def index_figures(rows: Iterable[IndexRow], supervised: Iterable[str]) -> tuple[bool, bool, dict[str, Any]]:
    """Whether every entry is live, whether every supervised order has a live entry, and the figures."""
    rows = list(rows)
    live = {r.order_id for r in rows if r.live}
    stale = sorted(r.order_id for r in rows if not r.live)
    missing = sorted(o for o in supervised if o not in live)
    figures = {"index_live": len(rows) - len(stale), "index_stale": len(stale), "index_stale_orders": stale[:10]}
    return not stale, not missing, {**figures, "index_missing": missing[:10]}


@dataclass
class RetentionEvidence:
    """The retention phase as read: the orders by role, their documents when every finished one was notified (and
    the kept one kept), the kept one just before `keep`, everything again after the retention, the Durable
    instances of their attempts at both times, the recovery index, the alarm timer's document while it all ran."""

    finished: list[str]
    kept: str
    held: list[str]
    retention_s: int  # FinishedOrderRetentionSeconds
    statuses: dict[str, str]  # orderId -> its final status on the client's queue (none yet: absent)
    kept_before: Doc
    at_finish: dict[str, Doc]
    after: dict[str, Doc]
    instance_of: dict[str, str]  # orderId -> the instance of its last attempt
    instances_at_finish: dict[str, str | None]  # instance -> runtime status (absent: none)
    instances_after: dict[str, str | None]
    index: list[IndexRow]
    supervised: list[str]  # the drill's orders supervised at the end (Processing with a CompleteBy)
    firing_seen: list[str]  # alarm keys the timer's document named at any time in the phase
    ticks: int  # the timer's writes of its document seen in the phase
    summary_firing: list[str]  # the ops summary's firing alarms at the end
    purge: dict[str, Any] | None  # the purge timer's checkpoint document
    timeouts: list[str] = field(default_factory=list)
    waits_s: dict[str, float] = field(default_factory=dict)  # how long the expiry and the purge took
    invariants_margin_s: float | None = None  # once the invariants were read: until a finished order's first expiry
    elapsed_s: float = 0.0


def _untouched(doc: Doc | None) -> bool:
    """An unfinished order's documents: both readable, unfinished, no TTL, not notified, no expiry stored."""
    return (
        doc is not None
        and doc.record
        and doc.stored
        and doc.state in UNFINISHED
        and doc.ttl is None
        and not doc.notified
        and not (doc.record_expiry or doc.stored_expiry)
    )


def _held_by_operator(doc: Doc | None) -> bool:
    return (
        doc is not None
        and doc.record
        and doc.stored
        and doc.kept
        and doc.ttl == TTL_NEVER
        and not (doc.record_expiry or doc.stored_expiry)
    )


def judge_retention(ev: RetentionEvidence) -> tuple[dict[str, bool], dict[str, Any]]:
    ended = [*ev.finished, ev.kept]
    at, after = ev.at_finish, ev.after
    expired = [o for o in ev.finished if o in after and not after[o].record and not after[o].stored]
    purged = [
        o
        for o in ended
        if ev.instance_of.get(o) in ev.instances_at_finish and ev.instance_of.get(o) not in ev.instances_after
    ]
    held_instances = {o: ev.instances_after.get(ev.instance_of.get(o, ""), "absent") for o in ev.held}
    index_live, index_whole, index = index_figures(ev.index, ev.supervised)
    kb = ev.kept_before
    checks = {
        "every finished order completed (and the kept one)": all(ev.statuses.get(o) == "completed" for o in ended),
        "every unfinished order has no final status": not any(o in ev.statuses for o in ev.held),
        "each finished order's record and stored order carried FinishedOrderRetentionSeconds once notified": all(
            at.get(o) is not None
            and at[o].notified
            and at[o].ttl == ev.retention_s
            and at[o].record_expiry
            and at[o].stored_expiry
            for o in ev.finished
        ),
        "the invariants were read before any finished order expired": (ev.invariants_margin_s or 0.0) > 0,
        "finished orders' records and stored orders are gone after the retention": len(expired) == len(ev.finished),
        "finished orders' Durable instances were purged (the kept one's too)": len(purged) == len(ended),
        "the kept order had its retention, and keep removed it from both documents": kb.notified
        and kb.ttl == ev.retention_s
        and _held_by_operator(at.get(ev.kept)),
        "the kept order's documents outlived the retention": _held_by_operator(after.get(ev.kept)),
        "unfinished orders untouched: documents kept without TTL, instances running": all(
            _untouched(at.get(o)) and _untouched(after.get(o)) for o in ev.held
        )
        and all(s is not None and s not in ("absent", *FINISHED_STATUSES) for s in held_instances.values()),
        "the recovery index holds only live entries": index_live,
        "every unfinished supervised order has its live index entry": index_whole and bool(ev.supervised),
        "the purge timer ran": ev.purge is not None,
        "every alarm quiet while the orders ran and after (the alarm timer's document)": not ev.firing_seen
        and ev.ticks >= MIN_TICKS,
        "every alarm quiet in the ops summary after the retention": not ev.summary_firing,
        "no wait of the retention phase timed out": not ev.timeouts,
    }
    figures = {
        "finished": len(ev.finished),
        "kept": 1,
        "unfinished": len(ev.held),
        "expired": len(expired),
        "purged": len(purged),
        "instances_left": sorted(i for i in ev.instances_after if i in {ev.instance_of.get(o) for o in ended})[:10],
        "held_instances": held_instances,
        **index,
        "retention_s": ev.retention_s,
        "invariants_margin_s": ev.invariants_margin_s,
        **{f"{k}_s": v for k, v in ev.waits_s.items()},
        "purge_checkpoint": ev.purge,
        "alarm_ticks_retention": ev.ticks,
        "alarms_seen_retention": sorted(ev.firing_seen),
        "timeouts_retention": ev.timeouts,
        "retention_phase_s": round(ev.elapsed_s, 1),
    }
    return checks, figures


@dataclass(frozen=True)
class Fired:
    """An alarm seen firing: by `source` (`timer`: the alarm timer's document; `summary`: the ops summary), so many
    seconds after its condition was forced, with the alarm's own figures."""

    key: str
    source: str
    after_s: float
    value: float | None = None
    threshold: float | None = None
    order_id: str | None = None
    queue: str | None = None


def alarm_key(alarm: Mapping[str, Any]) -> str:
    """An alarm of the ops summary (`Alarm.to_json`) by its key: the name, and the queue of a dead-letters alarm."""
    return str(alarm["name"]) if not alarm.get("queue") else f"{alarm['name']}:{alarm['queue']}"


def firing_keys(found: Iterable[Mapping[str, Any]]) -> list[str]:
    return sorted(alarm_key(a) for a in found if a["firing"])


def fired_from(alarm: Mapping[str, Any], source: str, after_s: float) -> Fired:
    get = alarm.get
    return Fired(alarm_key(alarm), source, after_s, get("value"), get("threshold"), get("orderId"), get("queue"))


@dataclass
class AlarmEvidence:
    """The alarm phase as read: the healthy warm-up, each forced alarm's first firing, the end."""

    warmup_firing: list[str]  # the timer's document during the warm-up
    warmup_ticks: int
    warmup_summary_firing: list[str]
    poison_reason: str | None  # the poison's dead-letter reason (None: not dead-lettered)
    poison_queue: str
    fired: dict[str, Fired]  # alarm name -> its first firing seen
    dead_letters_quiet: bool  # the timer's document dropped it once the dead letter was removed
    warmup: list[str]
    held: list[str]  # the orders whose hung calls held every Processing slot
    burst: list[str]
    held_at_stop: dict[str, Doc]  # the held orders once devhost had stopped
    final_firing: list[str]  # the timer's document once devhost was back and the backlog drained
    final_ticks: int
    final_summary_firing: list[str]
    statuses: dict[str, str]  # orderId -> final status
    attempts: dict[str, int]
    index: list[IndexRow]
    thresholds: dict[str, float] = field(default_factory=dict)
    phases_s: dict[str, float] = field(default_factory=dict)
    timeouts: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def orders(self) -> list[str]:
        return [*self.warmup, *self.held, *self.burst]


def judge_alarms(ev: AlarmEvidence) -> tuple[dict[str, bool], dict[str, Any]]:
    fired = ev.fired
    dead = fired.get(DEAD_LETTERS)
    pending, processing = fired.get(OLDEST_PENDING), fired.get(OLDEST_PROCESSING)
    orders, stop = ev.orders, [ev.held_at_stop.get(h) for h in ev.held]
    margins = [d.deadline_in_s for d in stop if d is not None and d.deadline_in_s is not None]
    index_live, _, index = index_figures(ev.index, [])
    checks = {
        "alarms quiet on a healthy run (timer and summary)": not ev.warmup_firing
        and ev.warmup_ticks >= MIN_TICKS
        and not ev.warmup_summary_firing,
        "dead-letters fired for the app's queue once a poison message was dead-lettered there": ev.poison_reason
        is not None
        and dead is not None
        and dead.queue == ev.poison_queue,
        "dead-letters quiet again once the dead letter was removed": ev.dead_letters_quiet,
        "devhost stopped while the hung orders held every slot (Processing, first attempt, before the deadline)": (
            bool(stop)
            and all(d is not None and d.state == "Processing" and d.attempt == 1 for d in stop)
            and len(margins) == len(stop)
            and min(margins) > 0
        ),
        "backlog-growth fired when a burst outgrew BacklogGrowthAlarmOrders": fired.get(BACKLOG_GROWTH) is not None,
        "oldest-pending fired on an order of the burst": pending is not None and pending.order_id in ev.burst,
        "oldest-processing fired on a hung order while the Supervisor was down": processing is not None
        and processing.order_id in ev.held,
        "every alarm quiet again once devhost was back and the backlog drained (timer and summary)": not ev.final_firing
        and ev.final_ticks >= 1
        and not ev.final_summary_firing,
        "every order of the alarm phase completed": all(ev.statuses.get(o) == "completed" for o in orders),
        "the hung orders were recovered by the Supervisor (a later attempt)": all(
            ev.attempts.get(h, 0) >= 2 for h in ev.held
        ),
        "the recovery index holds only live entries after the alarm phase": index_live,
        "no wait of the alarm phase timed out": not ev.timeouts,
    }
    figures = {
        "alarms_fired": sorted(fired),
        "fired": {name: _fired_figure(f) for name, f in sorted(fired.items())},
        "thresholds": ev.thresholds,
        "alarms_seen_warmup": sorted(ev.warmup_firing),
        "alarms_left": sorted({*ev.final_firing, *ev.final_summary_firing}),
        "poison_reason": ev.poison_reason,
        "deadline_margin_s": round(min(margins), 1) if margins else None,
        "alarm_phases_s": ev.phases_s,
        "hung_order_attempts": [ev.attempts.get(h) for h in ev.held],
        "index_after_alarms": index,
        "timeouts_alarms": ev.timeouts,
        "alarm_phase_s": round(ev.elapsed_s, 1),
    }
    return checks, figures


def _fired_figure(f: Fired) -> dict[str, Any]:
    return {
        "by": f.source,
        "after_s": round(f.after_s, 1),
        "value": f.value,
        "threshold": f.threshold,
        **({"order": f.order_id} if f.order_id else {}),
        **({"queue": f.queue} if f.queue else {}),
    }


def merge_findings(a: Findings, b: Findings) -> Findings:
    """The invariants of both phases as one: a check holds when it held in both; the counts add up (the ledger's
    -1, unread, stays -1); the figures of the second phase go beside the first's."""
    checks = {name: ok and b.checks.get(name, True) for name, ok in a.checks.items()}
    checks.update({name: ok for name, ok in b.checks.items() if name not in checks})
    duplicates = -1 if -1 in (a.duplicates, b.duplicates) else a.duplicates + b.duplicates
    first: Mapping[str, Any] = a.figures.get("invariants", {})
    second: Mapping[str, Any] = b.figures.get("invariants", {})
    merged = {
        **first,
        "transitions_audited": first.get("transitions_audited", 0) + second.get("transitions_audited", 0),
        "most_calls_per_key": max(first.get("most_calls_per_key", 0), second.get("most_calls_per_key", 0)),
    }
    figures = {"invariants": merged, "invariants_alarm_phase": dict(second)}
    return Findings(checks, figures, a.lost + b.lost, a.stuck + b.stuck, duplicates)


def judge(retention: RetentionEvidence, alarms: AlarmEvidence, findings: Findings) -> Verdict:
    """Both phases and the invariants (of both systems, over every order that must have ended) as one verdict.
    Unfinished-on-purpose orders are the drill's, not stuck: the invariants are not asked about them."""
    kept_checks, kept_figures = judge_retention(retention)
    alarm_checks, alarm_figures = judge_alarms(alarms)
    ended = [*retention.finished, retention.kept, *alarms.orders]
    orders = len(ended) + len(retention.held)
    lost = sum(1 for o in [*retention.finished, retention.kept] if o not in retention.statuses) + sum(
        1 for o in alarms.orders if o not in alarms.statuses
    )
    figures = {
        "orders_ended": len(ended),
        **kept_figures,
        **alarm_figures,
        "elapsed_s": round(retention.elapsed_s + alarms.elapsed_s, 1),
    }
    verdict = Verdict(DRILL, orders, lost, 0, 0, {**kept_checks, **alarm_checks}, figures)
    return verdict.with_invariants(findings)
