"""The tenant drill's evidence and its judge (lab/tenant_drills.py): pure functions of what the drill recorded, no I/O
(tests/lab/test_tenant_drill.py). One named check per promise of issue 25: app's orders end as alone, no status crosses
between the apps, each hostile message is dead-lettered and alerted, the flood is refused on partner-status only, the
bounds hold, and MaxOrdersInProcessing is shared fairly while both apps have orders waiting."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from orderflow import apps as app_keys
from orderflow.admission import BACKLOG_FULL
from orderflow.messages import STEPS, TERMINAL_STATUSES, AlertKind, OperatorAlert, OrderStatus, StatusMessage
from orderflow.records import ProcessState

from .demo import FINAL_STATUSES
from .drill_common import Verdict

DRILL = "tenant-isolation"
APP, PARTNER = "app", "partner"
APP_ORDERS, APP_STATUS = app_keys.inbound_queue(APP), app_keys.status_queue(APP)
PARTNER_ORDERS, PARTNER_STATUS = app_keys.inbound_queue(PARTNER), app_keys.status_queue(PARTNER)
INVALID_REPLY_TO, UNKNOWN_ORDER = "InvalidField:replyTo", "UnknownOrder"
FAIR_SHARE = 0.4  # app's least share of the claims made while both apps waited
# The final ProcessState of a record and the terminal status that tells it.
STATUS_OF = {
    ProcessState.PROCESSED.value: OrderStatus.COMPLETED,
    ProcessState.ERROR.value: OrderStatus.FAILED,
    ProcessState.COMPENSATED.value: OrderStatus.COMPENSATED,
    ProcessState.COMPENSATION_FAILED.value: OrderStatus.COMPENSATION_FAILED,
    ProcessState.CANCELLED.value: OrderStatus.CANCELLED,
}
UNFINISHED = (ProcessState.PENDING.value, ProcessState.PROCESSING.value, ProcessState.COMPENSATING.value)


# --- the evidence and its judge ---------------------------------------------


@dataclass(frozen=True)
class Rec:
    """What the judge needs of a state record."""

    state: str  # ProcessState value
    attempt: int
    order_hash: str


@dataclass
class TenantEvidence:
    """What the drill recorded, by orderId as each app chose it (an app's own ids; the stores' keys are in `app_keys`
    for app's orders only, to match the alerts)."""

    app_ids: list[str]  # app's orders under contention
    baseline_ids: list[str]  # app's orders alone, before partner did anything
    app_hashes: dict[str, str]  # orderId -> the immutable hash of the order app sent
    app_keys: set[str]  # the store keys of app's orders
    claimed: list[str]  # app's ids partner submitted first, with other data
    partner_hashes: dict[str, str]  # orderId -> hash of what partner sent (claims and flood)
    flood: list[str]  # partner's own ids of the flood
    app_records: dict[str, Rec]  # orderId -> app's record (its key)
    partner_records: dict[str, Rec]  # orderId -> partner's record (its key `partner.<orderId>`)
    app_effects: dict[str, dict[str, int]]  # orderId -> effects applied per step (the ledger, app's key)
    app_compensations: dict[str, dict[str, int]]  # orderId -> compensations applied (the ledger)
    app_statuses: dict[str, list[StatusMessage]]  # everything read on app-status, by orderId
    partner_statuses: dict[str, list[StatusMessage]]  # everything read on partner-status, by orderId
    hostile: dict[str, str]  # MessageId of each hostile message -> the dead-letter reason it must get
    dead_letters: dict[str, dict[str, str | None]]  # queue -> MessageId -> reason
    alerts: list[OperatorAlert]
    cancels_by_state: dict[str, int]  # partner's cancels of app's orders, by the state app's order was in
    bounds: dict[str, int]  # "app", "partner": MaxPendingOrders of each; "processing": MaxOrdersInProcessing
    peaks: dict[str, int]  # the largest sampled Pending of each app, and Processing
    duplicates: int  # the ledger's effects beyond one per order step (-1: unread)
    impersonation: dict[str, str] | None = (
        None  # partner on app's queues -> "refused" | what happened; None: rights off
    )
    baseline_latency_ms: list[float] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    # Claims (into Processing) per app while both apps had orders Pending, from the transition audit.
    claims_while_both_waited: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0  # app's orders beside partner: their submission to the last one's final status
    phases_s: dict[str, float] = field(default_factory=dict)  # how long each stage of the drill took
    timeouts: list[str] = field(default_factory=list)

    @property
    def app_orders(self) -> list[str]:
        return [*self.baseline_ids, *self.app_ids]

    @property
    def partner_submitted(self) -> list[str]:
        """The orders partner sent with its own replyTo: what partner-status may speak of."""
        return [*self.claimed, *self.flood]


def _terminal(statuses: Iterable[StatusMessage]) -> set[tuple[OrderStatus, int]]:
    return {(s.state, s.attempt) for s in statuses if s.state in TERMINAL_STATUSES}


def app_order_as_alone(e: TenantEvidence, order_id: str) -> bool:
    """Processed in attempt 1 with app's own data, one effect per step, nothing undone."""
    rec = e.app_records.get(order_id)
    return (
        rec is not None
        and rec.state == ProcessState.PROCESSED.value
        and rec.attempt == 1
        and rec.order_hash == e.app_hashes.get(order_id)
        and e.app_effects.get(order_id) == {s.value: 1 for s in STEPS}
        and not e.app_compensations.get(order_id)
    )


def app_statuses_as_alone(e: TenantEvidence, order_id: str) -> bool:
    """`received` first, then one terminal status message, `completed` in attempt 1; no `rejected`, no cancel."""
    got = e.app_statuses.get(order_id, [])
    terminal = [(s.state, s.attempt) for s in got if s.state in TERMINAL_STATUSES]
    return (
        bool(got)
        and got[0].state is OrderStatus.RECEIVED
        and terminal == [(OrderStatus.COMPLETED, 1)]
        and not any(s.state is OrderStatus.REJECTED for s in got)
    )


def fits_partner_order(e: TenantEvidence, order_id: str, status: StatusMessage) -> bool:
    """A status on partner-status that partner's own order `order_id` explains: it submitted the id with its own
    replyTo, and the status tells what became of partner's record: `received`/`processing` of a stored order, a
    `rejected` `backlog full` of one not stored, the terminal status of its record's final state. Anything else (a
    `cancelled`, a cancel refused, a terminal status its record does not have) tells of another app's order."""
    if order_id not in e.partner_submitted:
        return False
    rec = e.partner_records.get(order_id)
    if status.state in (OrderStatus.RECEIVED, OrderStatus.PROCESSING):
        return rec is not None
    if status.state is OrderStatus.REJECTED:
        return rec is None and status.reason == BACKLOG_FULL
    return rec is not None and STATUS_OF.get(rec.state) is status.state


def leaks_to_partner(e: TenantEvidence) -> list[str]:
    """`<orderId>: <state> (<reason>)` of each status on partner-status that partner's own orders do not explain."""
    return [
        f"{o}: {s.state.value} ({s.reason})"
        for o, got in sorted(e.partner_statuses.items())
        for s in got
        if not fits_partner_order(e, o, s)
    ]


def counted(e: TenantEvidence) -> tuple[int, int]:
    """(lost, stuck) over both apps' orders: an order without its final status, or accepted (not `rejected`) and
    without its record; a record left Pending, Processing or CompensationInProgress."""
    lost = sum(1 for o in e.app_orders if not _terminal(e.app_statuses.get(o, [])) or o not in e.app_records) + sum(
        1
        for o in e.partner_submitted
        if not any(s.state in FINAL_STATUSES for s in e.partner_statuses.get(o, []))
        or (o not in e.partner_records and not was_rejected(e, o))
    )
    stuck = sum(1 for r in (*e.app_records.values(), *e.partner_records.values()) if r.state in UNFINISHED)
    return lost, stuck


def was_rejected(e: TenantEvidence, order_id: str) -> bool:
    return any(s.state is OrderStatus.REJECTED for s in e.partner_statuses.get(order_id, []))


def fair_share(claims: dict[str, int], floor: float = FAIR_SHARE) -> bool:
    """Whether app got at least `floor` of the claims made while both apps had orders waiting (round-robin gives
    each about half; a stream of partner's new orders taking the freed slots gives app far less)."""
    total = sum(claims.values())
    return claims.get(APP, 0) >= int(floor * total)


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {"p50": round(ordered[len(ordered) // 2], 1), "p99": round(ordered[int(0.99 * (len(ordered) - 1))], 1)}


def judge(e: TenantEvidence) -> Verdict:
    """The drill's verdict from what it recorded (no I/O): each promise a named check."""
    app_ids = set(e.app_orders)
    partner_dead = e.dead_letters.get(PARTNER_ORDERS, {})
    others_dead = {q: d for q, d in e.dead_letters.items() if q != PARTNER_ORDERS and d}
    poison = [a for a in e.alerts if a.kind is AlertKind.POISON_MESSAGE]
    rejected = [o for o in e.flood if was_rejected(e, o)]
    admitted = [o for o in e.flood if o in e.partner_records]
    leaks = leaks_to_partner(e)
    about_app = [x for x in leaks if x.split(":", 1)[0] in app_ids]
    foreign_on_app = sorted(set(e.app_statuses) - app_ids)

    def alerted(message_id: str, reason: str) -> bool:
        return any(
            a.details.get("messageId") == message_id
            and a.reason == reason
            and a.details.get("queue") == PARTNER_ORDERS
            and a.details.get("app") == PARTNER
            for a in poison
        )

    checks = {
        "app: every order Processed in attempt 1 with its own data, one effect per step, nothing undone": all(
            app_order_as_alone(e, o) for o in e.app_orders
        ),
        "app: one terminal status per order (`completed`, after `received`), no `rejected`, no cancel": all(
            app_statuses_as_alone(e, o) for o in e.app_orders
        ),
        "app-status: only statuses of app's own orders": not foreign_on_app,
        "app: no OrderConflict, nothing dead-lettered on its queues, no alert about its orders": not others_dead
        and not any(a.order_id in e.app_keys for a in e.alerts),
        "partner's claims of app's ids: stored as partner's own orders, app's records keep app's data": all(
            (rec := e.partner_records.get(o)) is not None
            and rec.order_hash == e.partner_hashes.get(o) != e.app_hashes.get(o)
            and e.app_records.get(o, Rec("", 0, "")).order_hash == e.app_hashes.get(o)
            for o in e.claimed
        ),
        "partner-status: nothing about app's orders": not about_app,
        "partner-status: every status explained by an order partner itself submitted": not leaks,
        "hostile messages dead-lettered with their reasons (InvalidField:replyTo, UnknownOrder)": bool(e.hostile)
        and all(partner_dead.get(m) == r for m, r in e.hostile.items()),
        "only the hostile messages dead-lettered": set(partner_dead) == set(e.hostile),
        "a PoisonMessage alert for each hostile message (its reason, partner's queue and app)": all(
            alerted(m, r) for m, r in e.hostile.items()
        ),
        "partner cancelled app's orders while Pending, Processing and Processed": all(
            e.cancels_by_state.get(s.value, 0) > 0
            for s in (ProcessState.PENDING, ProcessState.PROCESSING, ProcessState.PROCESSED)
        ),
        "partner's flood: partly refused `backlog full` on partner-status, the rest Processed": bool(rejected)
        and bool(admitted)
        and not set(rejected) & set(admitted)
        and all(
            s.reason == BACKLOG_FULL for o in rejected for s in e.partner_statuses[o] if s.state is OrderStatus.REJECTED
        )
        and all(
            e.partner_records[o].state == ProcessState.PROCESSED.value
            and (OrderStatus.COMPLETED, e.partner_records[o].attempt) in _terminal(e.partner_statuses.get(o, []))
            for o in admitted
        ),
        "each app's Pending within its own bound": all(
            e.peaks.get(a, 0) <= e.bounds[a] for a in (APP, PARTNER) if a in e.bounds
        ),
        "Processing within MaxOrdersInProcessing (shared)": e.peaks.get("processing", 0) <= e.bounds["processing"],
        "MaxOrdersInProcessing shared fairly: app got at least 40% of the claims made while both apps waited": (
            fair_share(e.claims_while_both_waited)
        ),
    }
    if e.impersonation is not None:
        checks["partner refused on app's queues (the rights of infra/)"] = bool(e.impersonation) and all(
            v == "refused" for v in e.impersonation.values()
        )
    lost, stuck = counted(e)
    checks = {"none lost": lost == 0, "no duplicate side effect": e.duplicates == 0, "none stuck": stuck == 0, **checks}
    base, contended = _percentiles(e.baseline_latency_ms), _percentiles(e.latency_ms)
    figures: dict[str, Any] = {
        "app_orders": len(e.app_ids),
        "baseline_orders": len(e.baseline_ids),
        "claims": len(e.claimed),
        "flood": len(e.flood),
        "flood_admitted": len(admitted),
        "flood_rejected": len(rejected),
        "hostile": dict(Counter(e.hostile.values())),
        "dead_lettered": {q: len(d) for q, d in e.dead_letters.items()},
        "poison_alerts": len(poison),
        "cancels_by_state": dict(e.cancels_by_state),
        "statuses": {
            APP_STATUS: sum(len(v) for v in e.app_statuses.values()),
            PARTNER_STATUS: sum(len(v) for v in e.partner_statuses.values()),
        },
        "bounds": dict(e.bounds),
        "peaks": dict(e.peaks),
        "app_latency_ms": contended,
        "baseline_latency_ms": base,
        "p50_vs_baseline": round(contended["p50"] / base["p50"], 2) if base.get("p50") and contended else None,
        "claims_while_both_waited": dict(e.claims_while_both_waited),
        "rights": "off" if e.impersonation is None else "on",
        "impersonation": e.impersonation,
        "leaks": leaks[:10],
        "foreign_on_app_status": foreign_on_app[:10],
        "not_as_alone": [o for o in e.app_orders if not app_order_as_alone(e, o)][:10],
        "statuses_not_as_alone": [
            f"{o}: {' '.join(f'{s.state.value}/{s.attempt}' for s in e.app_statuses.get(o, []))}"
            for o in e.app_orders
            if not app_statuses_as_alone(e, o)
        ][:10],
        "waits_timed_out": e.timeouts,
        "phases_s": dict(e.phases_s),
        "elapsed_s": round(e.elapsed_s, 1),
    }
    orders = len(e.app_orders) + len(e.partner_submitted)
    return Verdict(DRILL, orders, lost, e.duplicates, stuck, checks, figures)


def claims_while_both_waited(
    transitions: Iterable[tuple[str, str | None, str]], owner: Callable[[str], str | None]
) -> dict[str, int]:
    """From the transition audit (in order): the records that entered Processing (a claim, or a creation already
    claimed) while both apps had records Pending, counted by the app that owns them. Round-robin sharing gives each
    about half."""
    state: dict[str, str] = {}
    claims: Counter[str] = Counter()
    for key, _before, after in transitions:
        waiting = {owner(k) for k, s in state.items() if s == ProcessState.PENDING.value}
        if after == ProcessState.PROCESSING.value and {APP, PARTNER} <= waiting:
            claims[owner(key) or "?"] += 1
        state[key] = after
    return {a: claims.get(a, 0) for a in (APP, PARTNER)}
