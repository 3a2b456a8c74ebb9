"""Lifecycle drills (issue 12, part 5), `python -m devhost drill NAME` with NAME one of `compensation`,
`cancel-in-flight`, `poison-in-session`, `upgrade-in-flight`: what an order's life can go through besides success —
undoing what was done, a client's cancel at any moment, a poison message in the order's session, and a new version of
the Scheduler deployed while orders run. Each runs on the whole local system in real processes (devhost, the Agent,
the remote-service simulator, a client app on `app-status`, as `lab/drill.py`'s drills do), judges from the state
store, the simulator's ledger (`GET /effects`, `GET /calls`), the queues (reply queue, dead-letter sub-queue, operator
alerts) and devhost's durable history — never from logs — and ends with the same `Verdict` as the resilience drills:
`{drill, passed, orders, lost, duplicate_side_effects, stuck, checks, figures}`.

- `compensation`: orders whose arrange-shipping the simulator refuses permanently (scripted) are compensated:
  refund-payment, then release-inventory (the order read from the simulator's call log), each effect applied once and
  undone once, Compensated with `compensated` and its effects. Some of them also have refund-payment refused (scripted):
  CompensationFailed, a CompensationFailed alert, `compensation-failed`. Control orders complete.
- `cancel-in-flight`: one order per stage. Before the claim (held Pending by MaxOrdersInProcessing while the three
  in-flight orders hold every slot): Cancelled, `cancelled`, no remote call at all. While each step is in flight (a
  scripted hang: the remote applies the effect and holds its answer): the steps sent are undone newest first,
  Compensated, `compensated`, nothing left applied. After Processed: `rejected` with the reason, the record unchanged.
  Then a second cancel for each: nothing changes (records, statuses, remote calls).
- `poison-in-session`: in each of four orders' sessions a poison message (not JSON; a SubmitOrder with a bad field; a
  CancelOrder with a bad field; a CancelOrder with an internal replyTo) next to a good one: the poison is dead-lettered
  with the reason that names the field and a PoisonMessage alert, the good one is processed, in the order sent.
- `upgrade-in-flight`: devhost runs the product's host.json (`defaultVersion` "3.0") as version "1.0" (or, with
  `--from-version 2.0`, "2.0") through the app
  setting `AzureFunctionsJobHost__extensions__durableTask__defaultVersion` (devhost/config.py); orders are submitted
  with a slow remote; while they are in flight devhost is killed (-9; `--restart stop`: SIGTERM) and started again
  without the setting, and more orders are submitted. Every order completes: the first ones on the version-1 path
  (ExecutionStarted.Version "1.0", record.workflowVersion null, attempt 1), the later ones on "3.0"; no orchestration
  Failed (no non-determinism on replay); one effect per step.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from orderflow.messages import (
    COMPENSATION_OF,
    STEPS,
    TERMINAL_STATUSES,
    AlertKind,
    OrderStatus,
    StatusMessage,
    StepName,
    idempotency_key,
)
from orderflow.records import ProcessState, StepStatus
from orderflow.workflow import WORKFLOW_V1, WORKFLOW_V2, WORKFLOW_VERSION

from .demo import client_app, default_work_dir, make_orders
from .drill_common import (
    LIFECYCLE_DRILLS,
    SETTINGS_CHOICES,
    Verdict,
    base_settings,
    parse_overrides,
    run_verdict_drill,
    usage_error,
)
from .invariants import check_system, install_for
from .lifecycle_lab import Lab, durable_instances, elapsed_s, lifecycle_verdict, percentiles, status_matches_ledger
from .poison_strategies import PoisonCase, poison_cases
from .system import LocalSystem, SystemConfig

T = TypeVar("T")

DEFAULT_ORDERS = {"compensation": 8, "upgrade-in-flight": 8}  # upgrade: the orders before the restart
FIXED_ORDERS = {"cancel-in-flight": 5, "poison-in-session": 4}  # one order per stage / per case
DEFAULT_VERSION_SETTING = "AzureFunctionsJobHost__extensions__durableTask__defaultVersion"
_EVERY_SECOND = "*/1 * * * * *"
# Over the chosen base (LOCAL_DEFAULTS or the sample's) and under `--set`. The Starter runs every second so that a
# compensation (claimed by the Starter) or a held order starts at once; the crash budget's settings stay the base's.
LIFECYCLE_SETTINGS: dict[str, dict[str, str]] = {
    "compensation": {"StarterSchedule": _EVERY_SECOND},
    # Three slots, for the three orders cancelled in flight: the order cancelled before its claim waits for one.
    "cancel-in-flight": {"StarterSchedule": _EVERY_SECOND, "MaxOrdersInProcessing": str(len(STEPS))},
    "poison-in-session": {"StarterSchedule": _EVERY_SECOND},
    "upgrade-in-flight": {"StarterSchedule": _EVERY_SECOND},
}


@dataclass(frozen=True)
class LifecycleOptions:
    drill: str
    orders: int | None = None  # compensation: all its orders; upgrade-in-flight: the orders before the restart
    seed: int = 1
    settings: str = "local"
    overrides: tuple[tuple[str, str], ...] = ()
    timeout: float = 300.0  # the longest the drill waits for every final status
    hang_seconds: float = 8.0  # cancel-in-flight, poison-in-session: how long a scripted hang holds the answer
    latency_ms: float = 800.0  # upgrade-in-flight: the simulator's mean latency per call
    restart: str = "kill"  # upgrade-in-flight: kill (SIGKILL) or stop (SIGTERM) devhost
    from_version: str = WORKFLOW_V1  # upgrade-in-flight: the version devhost runs before the restart

    def __post_init__(self) -> None:
        if self.drill not in LIFECYCLE_DRILLS:
            raise ValueError(f"drill must be one of {LIFECYCLE_DRILLS}")
        if self.settings not in SETTINGS_CHOICES:
            raise ValueError(f"settings must be one of {SETTINGS_CHOICES}")
        if self.drill in FIXED_ORDERS and self.orders is not None and self.orders != FIXED_ORDERS[self.drill]:
            raise ValueError(
                f"{self.drill} runs {FIXED_ORDERS[self.drill]} orders (one per stage); --orders does not apply"
            )
        if self.drill == "compensation" and self.order_count < 3:
            raise ValueError("compensation needs at least 3 orders (compensated, compensation-failed, control)")
        if self.from_version not in (WORKFLOW_V1, WORKFLOW_V2):
            raise ValueError(f"from_version must be {WORKFLOW_V1} or {WORKFLOW_V2}")
        if self.order_count < 1 or self.hang_seconds <= 0 or self.latency_ms < 0:
            raise ValueError("need at least one order, hang_seconds > 0 and latency_ms >= 0")
        if self.restart not in ("kill", "stop"):
            raise ValueError("restart must be kill or stop")

    @property
    def order_count(self) -> int:
        if self.orders is not None:
            return self.orders
        return FIXED_ORDERS.get(self.drill) or DEFAULT_ORDERS[self.drill]

    def settings_values(self) -> dict[str, str]:
        return {**base_settings(self.settings), **LIFECYCLE_SETTINGS[self.drill], **dict(self.overrides)}


def lifecycle_config(work_dir: Path, options: LifecycleOptions, servicebus_config: Path | None = None) -> SystemConfig:
    """The drill's system: a simulator that fails only where the drill scripts it; upgrade-in-flight's is slow (so
    orders are in flight at the restart) and its devhost starts as version 1.0 (the app setting over host.json)."""
    settings = options.settings_values()
    if options.drill == "upgrade-in-flight":
        settings.setdefault(DEFAULT_VERSION_SETTING, options.from_version)
    config = SystemConfig(
        work_dir=work_dir.resolve(),
        seed=options.seed,
        transient_failure_rate=0.0,
        permanent_failure_rate=0.0,
        hang_rate=0.0,
        hang_seconds=options.hang_seconds,
        settings=settings,
    )
    if options.drill == "upgrade-in-flight":
        config.latency_ms_mean = options.latency_ms
    if servicebus_config is not None:
        config.servicebus_config = servicebus_config.resolve()
    return config


# --- compensation -----------------------------------------------------------------------------------------------

SHIP, CHARGE, RESERVE = StepName.ARRANGE_SHIPPING, StepName.CHARGE_PAYMENT, StepName.RESERVE_INVENTORY
REFUND, RELEASE, CANCEL_SHIP = (
    COMPENSATION_OF[CHARGE].value,
    COMPENSATION_OF[RESERVE].value,
    COMPENSATION_OF[SHIP].value,
)


def compensation_roles(order_ids: list[str]) -> dict[str, list[str]]:
    """A quarter (at least one) whose compensation fails, a quarter (at least one) that completes, the rest (at least
    one) compensated."""
    n = len(order_ids)
    failing = max(1, n // 4)
    control = max(1, n // 4)
    return {
        "compensation-failed": order_ids[:failing],
        "control": order_ids[n - control :],
        "compensated": order_ids[failing : n - control],
    }


async def drill_compensation(lab: Lab, options: LifecycleOptions) -> Verdict:
    orders = make_orders(options.order_count, options.seed, lab.client.reply_queue, prefix="compensation")
    ids = [o.order_id for o in orders]
    roles = compensation_roles(ids)
    script: dict[str, list[str]] = {}
    for o in roles["compensated"] + roles["compensation-failed"]:
        script[idempotency_key(o, SHIP.value)] = ["permanent"]
    for o in roles["compensation-failed"]:
        script[idempotency_key(o, REFUND)] = ["permanent"]
    await lab.script(script)
    started = time.monotonic()
    await lab.submit(orders)
    await lab.wait(lambda: lab.client.all_terminal.is_set(), "every final status", options.timeout)
    elapsed = max(lab.client.terminal_at.values(), default=time.monotonic()) - started
    records = await lab.records(ids)
    ledger = await lab.ledger()
    await lab.wait(lambda: _alerts_for(lab, roles), "the operator alerts", 10)

    compensated, failed, control = roles["compensated"], roles["compensation-failed"], roles["control"]

    def ends(order_id: str, state: ProcessState, status: OrderStatus) -> bool:
        rec = records.get(order_id)
        return rec is not None and rec.process_state is state and lab.status(order_id, status) is not None

    def undone_in_order(order_id: str) -> bool:
        return ledger.call_order(order_id, [REFUND, RELEASE]) == [REFUND, RELEASE] and (
            ledger.first_call(order_id, REFUND) or 0
        ) > (ledger.first_call(order_id, SHIP.value) or math.inf)

    def logged_in_order(order_id: str) -> bool:
        rec = records.get(order_id)
        return rec is not None and [(c.name.value, c.status, c.undone) for c in rec.compensations] == [
            (REFUND, StepStatus.SUCCEEDED, True),
            (RELEASE, StepStatus.SUCCEEDED, True),
        ]

    two = [RESERVE.value, CHARGE.value]
    checks = {
        "compensated: Compensated with `compensated`": all(
            ends(o, ProcessState.COMPENSATED, OrderStatus.COMPENSATED) for o in compensated
        ),
        "compensated: refund-payment, then release-inventory (call log), after the refused step": all(
            undone_in_order(o) for o in compensated
        ),
        "compensated: the record's compensation log, newest step first, both undone": all(
            logged_in_order(o) for o in compensated
        ),
        "compensated: one effect per step done, one compensation each, both undone": all(
            ledger.effect_counts(o) == {RESERVE.value: 1, CHARGE.value: 1}
            and ledger.compensation_counts(o) == {REFUND: 1, RELEASE: 1}
            and ledger.undone(o) == two
            for o in compensated
        ),
        "compensated: the refused step never applied, never compensated": all(
            SHIP.value not in ledger.applied(o) and CANCEL_SHIP not in ledger.keys_called(o) for o in compensated
        ),
        "compensated: an OrderFailed alert each": all(
            len(lab.alerts_of(o, AlertKind.ORDER_FAILED)) >= 1 for o in compensated
        ),
        "compensation failed: CompensationFailed with `compensation-failed`": all(
            ends(o, ProcessState.COMPENSATION_FAILED, OrderStatus.COMPENSATION_FAILED) for o in failed
        ),
        "compensation failed: a CompensationFailed alert each": all(
            len(lab.alerts_of(o, AlertKind.COMPENSATION_FAILED)) >= 1 for o in failed
        ),
        "compensation failed: nothing undone, the refusal recorded": all(
            ledger.undone(o) == []
            and ledger.compensation_counts(o) == {}
            and "RefundRefused" in (records[o].last_error or "")
            for o in failed
            if o in records
        ),
        "control: Processed with `completed`, one effect per step, nothing undone": all(
            ends(o, ProcessState.PROCESSED, OrderStatus.COMPLETED)
            and ledger.effect_counts(o) == {s.value: 1 for s in STEPS}
            and not ledger.undone(o)
            for o in control
        ),
        "every final status tells the ledger's effects (applied, undone)": all(
            status_matches_ledger(_final(lab, o), ledger, o) for o in ids
        ),
    }
    to_compensated = [
        at
        for o in compensated
        if (at := elapsed_s(_status_at(lab, o, OrderStatus.COMPENSATED), ledger.first_call(o, SHIP.value))) is not None
    ]
    figures = {
        "compensated": len(compensated),
        "compensation_failed": len(failed),
        "control": len(control),
        "states": dict(Counter(r.process_state.value for r in records.values())),
        "effects_applied": sum(len(ledger.applied(o)) for o in ids),
        "compensations_applied": int(ledger.report.get("totalCompensations", -1)),
        "undone": sum(len(ledger.undone(o)) for o in ids),
        "calls": int(ledger.report.get("calls", -1)),
        "refused_step_to_compensated_s": percentiles(to_compensated),
        "alerts": dict(Counter(a.kind.value for a in lab.alerts if a.order_id in ids)),
        "compensation_order": ledger.call_order(compensated[0], [REFUND, RELEASE]) if compensated else [],
    }
    return lifecycle_verdict(options.drill, lab, ids, records, ledger, checks, figures, elapsed)


async def _alerts_for(lab: Lab, roles: dict[str, list[str]]) -> bool:
    await lab.read_alerts()
    return all(lab.alerts_of(o, AlertKind.ORDER_FAILED) for o in roles["compensated"]) and all(
        lab.alerts_of(o, AlertKind.COMPENSATION_FAILED) for o in roles["compensation-failed"]
    )


def _final(lab: Lab, order_id: str) -> StatusMessage | None:
    """The order's first terminal status."""
    return next((s for s in lab.statuses(order_id) if s.state in TERMINAL_STATUSES), None)


def _status_at(lab: Lab, order_id: str, state: OrderStatus) -> float | None:
    status = lab.status(order_id, state)
    return None if status is None else status.timestamp.timestamp()


# --- cancel-in-flight -------------------------------------------------------------------------------------------


async def drill_cancel_in_flight(lab: Lab, options: LifecycleOptions) -> Verdict:
    orders = make_orders(
        FIXED_ORDERS["cancel-in-flight"], options.seed, lab.client.reply_queue, prefix="cancel-in-flight"
    )
    by_id = {o.order_id: o for o in orders}
    ids = list(by_id)
    before, done = ids[0], ids[-1]
    in_flight = dict(zip(ids[1:-1], STEPS, strict=True))  # order -> the step it is cancelled in
    role = {before: "before-claim", done: "after-processed", **{o: f"in {step.value}" for o, step in in_flight.items()}}
    started = time.monotonic()
    # 1. The three in-flight orders: each step's remote call applies its effect and holds the answer (a hang).
    await lab.script({idempotency_key(o, step.value): ["hang"] for o, step in in_flight.items()})
    await lab.submit([by_id[o] for o in in_flight])
    for o, step in in_flight.items():
        await lab.wait(lambda o=o, step=step: lab.applied(o, step), f"{o}: {step.value} in flight")
    # 2. Before the claim: every Processing slot is taken, so the order stays Pending; cancel it there.
    await lab.submit([by_id[before]])
    await lab.wait(lambda: lab.status(before, OrderStatus.RECEIVED), f"{before}: received")
    held = await lab.record(before)
    cancel_at: dict[str, float] = {before: await lab.cancel(before, "drill: before the claim")}
    await lab.wait(lambda: before in lab.client.terminal_at, f"{before}: final status")
    # 3. In flight: cancel each while its step's answer is held.
    for o in in_flight:
        cancel_at[o] = await lab.cancel(o, "drill: in flight")
    cancel_sent = {o: time.monotonic() for o in in_flight}
    await lab.wait(
        lambda: all(o in lab.client.terminal_at for o in in_flight),
        "the in-flight orders' final statuses",
        options.timeout,
    )
    # 4. After Processed: too late.
    await lab.submit([by_id[done]])
    await lab.wait(lambda: lab.status(done, OrderStatus.COMPLETED), f"{done}: completed")
    processed = await lab.record(done)
    cancel_at[done] = await lab.cancel(done, "drill: after processed")
    await lab.wait(lambda: lab.status(done, OrderStatus.REJECTED), f"{done}: rejected")
    after_refusal = await lab.record(done)
    # 5. A second cancel of each: nothing may change.
    ledger_before = await lab.ledger()
    snapshot = {o: await lab.record(o) for o in ids}
    seen = {o: len(lab.statuses(o)) for o in ids}
    for o in ids:
        await lab.cancel(o, "drill: again")
    await lab.wait(lambda: len(lab.statuses(done, OrderStatus.REJECTED)) >= 2, f"{done}: rejected again")
    await lab.wait(lab.inbound_settled, "the repeated cancels settled")
    await asyncio.sleep(1.0)  # a status the repeats might (wrongly) cause is on the reply queue by now
    repeat = {o: await lab.record(o) for o in ids}
    elapsed = time.monotonic() - started
    records = await lab.records(ids)
    ledger = await lab.ledger()
    await lab.read_alerts()

    def in_flight_ok(o: str, step: StepName) -> dict[str, bool]:
        k = STEPS.index(step)
        sent = [s.value for s in STEPS[: k + 1]]
        rec = records.get(o)
        compensations = [COMPENSATION_OF[s].value for s in reversed(STEPS[: k + 1])]
        late = [
            c
            for c in ledger.calls
            if c["key"].startswith(f"{o}:")
            and c["at"] >= cancel_at[o]
            and c["status"] == 200
            and c["key"].split(":", 1)[1] in {s.value for s in STEPS}
        ]
        return {
            "compensated": rec is not None
            and rec.process_state is ProcessState.COMPENSATED
            and lab.status(o, OrderStatus.COMPENSATED) is not None,
            "mid-step": rec is not None
            and rec.step(step).status is StepStatus.RUNNING
            and (ledger.first_call(o, step.value) or math.inf) < cancel_at[o],
            "undone newest first": ledger.call_order(o, compensations) == compensations,
            "all undone, once": ledger.applied(o) == sent
            and ledger.undone(o) == sent
            and ledger.effect_counts(o) == {s: 1 for s in sent}
            and ledger.compensation_counts(o) == {c: 1 for c in compensations},
            "nothing after": all(s.value not in ledger.keys_called(o) for s in STEPS[k + 1 :])
            and all(c["key"].split(":", 1)[1] in ledger.undone(o) for c in late),
        }

    flights = {o: in_flight_ok(o, step) for o, step in in_flight.items()}
    before_rec = records.get(before)
    rejected = lab.statuses(done, OrderStatus.REJECTED)
    statuses_after = {o: len(lab.statuses(o)) for o in ids}
    checks = {
        "before the claim: held Pending (no slot), then Cancelled with `cancelled`": held is not None
        and held[0].process_state is ProcessState.PENDING
        and held[0].attempt == 0
        and before_rec is not None
        and before_rec.process_state is ProcessState.CANCELLED
        and before_rec.attempt == 0
        and lab.status(before, OrderStatus.CANCELLED) is not None,
        "before the claim: no remote call for the order at all": ledger.keys_called(before) == {},
        "in flight: Compensated with `compensated`, at each step": all(f["compensated"] for f in flights.values()),
        "in flight: the cancel landed mid-step (its answer never recorded)": all(
            f["mid-step"] for f in flights.values()
        ),
        "in flight: the steps sent undone newest first (call log)": all(
            f["undone newest first"] for f in flights.values()
        ),
        "in flight: every effect applied once and undone once": all(f["all undone, once"] for f in flights.values()),
        "in flight: nothing applied after the cancel that is not undone, no later step called": all(
            f["nothing after"] for f in flights.values()
        ),
        "after Processed: `rejected` with the reason, record unchanged, still Processed": processed is not None
        and after_refusal is not None
        and after_refusal[1] == processed[1]
        and after_refusal[0].process_state is ProcessState.PROCESSED
        and bool(rejected)
        and "already processed" in rejected[0].reason
        and not any(k in ledger.keys_called(done) for k in (c.value for c in COMPENSATION_OF.values())),
        "a repeated cancel changes nothing (records, statuses, remote calls)": all(
            snapshot[o] is not None and repeat[o] is not None and repeat[o][1] == snapshot[o][1] for o in ids
        )
        and all(statuses_after[o] == seen[o] + (o == done) for o in ids)
        and ledger.report.get("callsByKey") == ledger_before.report.get("callsByKey"),
        "every final status tells the ledger's effects (applied, undone)": all(
            status_matches_ledger(_final(lab, o), ledger, o) for o in ids
        ),
        "no operator alert for a cancel": not [a for a in lab.alerts if a.order_id in ids],
    }
    figures = {
        "stages": {
            role[o]: {
                "final": (_final(lab, o) or _last_state(lab, o)),
                "state": records[o].process_state.value if o in records else None,
                "attempt": records[o].attempt if o in records else None,
                "calls": sum(ledger.keys_called(o).values()),
                "applied": ledger.applied(o),
                "undone": ledger.undone(o),
                "compensation_order": ledger.call_order(o, [c.value for c in COMPENSATION_OF.values()]),
            }
            for o in ids
        },
        "cancel_to_compensated_s": {
            role[o]: round(lab.client.terminal_at[o] - cancel_sent[o], 2)
            for o in in_flight
            if o in lab.client.terminal_at
        },
        "rejected_reason": rejected[0].reason if rejected else None,
        "hang_s": options.hang_seconds,
    }
    for stage in figures["stages"].values():
        final = stage["final"]
        stage["final"] = final.state.value if isinstance(final, StatusMessage) else final
        stage["reason"] = final.reason if isinstance(final, StatusMessage) else None
    return lifecycle_verdict(options.drill, lab, ids, records, ledger, checks, figures, elapsed)


def _last_state(lab: Lab, order_id: str) -> str | None:
    statuses = lab.statuses(order_id)
    return statuses[-1].state.value if statuses else None


# --- poison-in-session ------------------------------------------------------------------------------------------


async def drill_poison_in_session(lab: Lab, options: LifecycleOptions) -> Verdict:
    orders = make_orders(
        FIXED_ORDERS["poison-in-session"], options.seed, lab.client.reply_queue, prefix="poison-in-session"
    )
    cases = poison_cases(orders, lab.client.reply_queue)
    ids = [c.order.order_id for c in cases]
    # The cancelled order's first step holds its answer, so the cancel finds it in flight (not yet processed).
    cancelled = [c.order.order_id for c in cases if c.cancels]
    await lab.script({idempotency_key(o, RESERVE.value): ["hang"] for o in cancelled})
    lab.client._expected.update(ids)  # the drill sends these orders itself (raw messages), not client.submit
    lab.client.all_terminal.clear()
    started = time.monotonic()
    for case in cases:  # each session's messages in one batch: the broker keeps their order
        await lab.send(case.messages)
    await lab.wait(lambda: lab.client.all_terminal.is_set(), "every final status", options.timeout)
    await lab.wait(lambda: _poison_seen(lab, cases), "the dead letters and alerts")
    elapsed = time.monotonic() - started
    records = await lab.records(ids)
    ledger = await lab.ledger()
    dead = {d.message_id: d for d in await lab.dead_letters()}

    rows: dict[str, dict[str, Any]] = {}
    for case in cases:
        o = case.order.order_id
        letter = dead.get(case.poison_id)
        alert = next(
            (
                a
                for a in lab.alerts
                if a.kind is AlertKind.POISON_MESSAGE and a.details.get("messageId") == case.poison_id
            ),
            None,
        )
        rec = records.get(o)
        final = _final(lab, o)
        received = _status_at(lab, o, OrderStatus.RECEIVED)
        # When the good message after the poison was handled: the order's `received` (a SubmitOrder), or the
        # record's cancelRequestedAt (a CancelOrder). The poison's handling: its alert's raisedAt.
        good_at = (
            (rec.cancel_requested_at.timestamp() if rec and rec.cancel_requested_at else None)
            if case.cancels
            else received
        )
        poison_at = alert.raised_at.timestamp() if alert else None
        before_poison = rec.created_at.timestamp() if (case.cancels and rec) else None  # the SubmitOrder, first
        rows[case.name] = {
            "order": o,
            "dead_lettered": letter is not None
            and letter.reason == case.reason
            and case.field_name in (letter.description or ""),
            "alert": alert is not None
            and alert.reason == case.reason
            and alert.details.get("sessionId") == o
            and (letter is None or alert.details.get("sequenceNumber") == letter.sequence_number),
            "good processed": final is not None
            and final.state in case.outcome
            and rec is not None
            and (rec.cancel_requested_at is not None if case.cancels else rec.process_state is ProcessState.PROCESSED),
            "in order": poison_at is not None
            and good_at is not None
            and poison_at <= good_at
            and (before_poison is None or before_poison <= poison_at),
            "only the poison dead-lettered": [m for m in dead.values() if m.session_id == o]
            == ([letter] if letter else []),
            "figures": {
                "reason": letter.reason if letter else None,
                "description": letter.description if letter else None,
                "sequence_number": letter.sequence_number if letter else None,
                "poison_to_good_ms": None
                if poison_at is None or good_at is None
                else round((good_at - poison_at) * 1000, 1),
                "final": final.state.value if final else None,
            },
        }
    checks = {
        "each poison dead-lettered with the reason that names its field": all(
            r["dead_lettered"] for r in rows.values()
        ),
        "a PoisonMessage alert for each poison (its reason, session and sequence number)": all(
            r["alert"] for r in rows.values()
        ),
        "the good message after each poison processed": all(r["good processed"] for r in rows.values()),
        "in order: each poison handled before the good message after it (and after the one before it)": all(
            r["in order"] for r in rows.values()
        ),
        "only the poison dead-lettered in each session": all(r["only the poison dead-lettered"] for r in rows.values()),
        "processed orders: one effect per step": all(
            ledger.effect_counts(c.order.order_id) == {s.value: 1 for s in STEPS} for c in cases if not c.cancels
        ),
        "every final status tells the ledger's effects (applied, undone)": all(
            status_matches_ledger(_final(lab, o), ledger, o) for o in ids
        ),
    }
    figures = {
        "cases": {name: r["figures"] for name, r in rows.items()},
        "dead_lettered": len(dead),
        "poison_alerts": sum(1 for a in lab.alerts if a.kind is AlertKind.POISON_MESSAGE),
    }
    return lifecycle_verdict(options.drill, lab, ids, records, ledger, checks, figures, elapsed)


async def _poison_seen(lab: Lab, cases: list[PoisonCase]) -> bool:
    await lab.read_alerts()
    alerted = {a.details.get("messageId") for a in lab.alerts if a.kind is AlertKind.POISON_MESSAGE}
    dead = {d.message_id for d in await lab.dead_letters()}
    return all(c.poison_id in alerted and c.poison_id in dead for c in cases)


# --- upgrade-in-flight ------------------------------------------------------------------------------------------


async def drill_upgrade_in_flight(lab: Lab, options: LifecycleOptions) -> Verdict:
    system = lab.system
    first = make_orders(options.order_count, options.seed, lab.client.reply_queue, prefix="upgrade-v1")
    later = make_orders(max(1, options.order_count // 2), options.seed, lab.client.reply_queue, prefix="upgrade-v2")
    first_ids, later_ids = [o.order_id for o in first], [o.order_id for o in later]
    ids = first_ids + later_ids
    version_before = system.config.settings.get(DEFAULT_VERSION_SETTING)
    started = time.monotonic()
    await lab.submit(first)
    # In flight: every order claimed, half of them (at least one) with a step done, not all of them finished.
    half = max(1, math.ceil(len(first_ids) / 2))

    async def mid_flight() -> bool:
        ledger = await lab.ledger()
        return sum(1 for o in first_ids if ledger.applied(o)) >= half

    await lab.wait(mid_flight, "half of the first orders with a step done")
    claimed = [o for o, r in (await lab.records(first_ids)).items() if r.attempt >= 1]
    at_restart = await lab.ledger()
    # The upgrade: devhost goes (kill -9, or SIGTERM), comes back with host.json's defaultVersion.
    assert system.devhost is not None
    down_at, down_wall = time.monotonic(), time.time()
    if options.restart == "kill":
        system.devhost.kill()
    else:
        system.devhost.stop()
    # In flight: Processing once devhost is gone (only devhost writes records, so this is what it left).
    left = await lab.records(first_ids)
    in_flight = [o for o in first_ids if o in left and left[o].process_state is ProcessState.PROCESSING]
    mid_step = [o for o in in_flight if 0 < len(at_restart.applied(o)) < len(STEPS)]
    system.config.settings.pop(DEFAULT_VERSION_SETTING, None)
    await asyncio.to_thread(system.start_devhost)
    restart_s = time.monotonic() - down_at
    await lab.submit(later)
    await lab.wait(lambda: lab.client.all_terminal.is_set(), "every final status", options.timeout)
    elapsed = max(lab.client.terminal_at.values(), default=time.monotonic()) - started
    records = await lab.records(ids)
    ledger = await lab.ledger()
    instances = durable_instances(system.config.work_dir / "devhost" / "durable.db")

    def instance(o: str) -> dict[str, Any]:
        rec = records.get(o)
        return instances.get(f"{o}:{rec.attempt}", {}) if rec else {}

    def completed_instance(o: str) -> bool:
        found = instance(o)
        return found.get("status") == "Completed" and (found.get("output") or {}).get("outcome") == "completed"

    failed = sorted(i for i, v in instances.items() if v.get("status") == "Failed")
    versions = {o: instance(o).get("version", "?") for o in ids}
    # What the first orders' records say: version 1 recorded none, version 2 recorded its own.
    first_recorded = None if options.from_version == WORKFLOW_V1 else options.from_version
    # Finished by the new devhost: its `completed` stamped after the old one was gone.
    after_restart = [o for o in in_flight if (_status_at(lab, o, OrderStatus.COMPLETED) or 0) > down_wall]
    checks = {
        f"devhost ran version {options.from_version} from the app setting, "
        f"then host.json's {WORKFLOW_VERSION}": version_before == options.from_version
        and all(versions[o] == options.from_version for o in first_ids)
        and all(versions[o] == WORKFLOW_VERSION for o in later_ids),
        "several orders in flight at the restart, some between steps": len(in_flight) >= 2
        and len(mid_step) >= 1
        and len(claimed) == len(first_ids),
        "every order Processed with `completed`": all(
            o in records
            and records[o].process_state is ProcessState.PROCESSED
            and lab.status(o, OrderStatus.COMPLETED) is not None
            for o in ids
        ),
        "the orders in flight completed after the restart": sorted(after_restart) == sorted(in_flight),
        f"first orders on the version-{options.from_version} path: workflowVersion {first_recorded}, attempt 1, its "
        "instance completed": all(
            o in records
            and records[o].workflow_version == first_recorded
            and records[o].attempt == 1
            and completed_instance(o)
            for o in first_ids
        ),
        f"later orders on {WORKFLOW_VERSION}: workflowVersion {WORKFLOW_VERSION}, its instance completed": all(
            o in records and records[o].workflow_version == WORKFLOW_VERSION and completed_instance(o)
            for o in later_ids
        ),
        "no orchestration Failed": not failed,
        "one effect per step, nothing undone": all(
            ledger.effect_counts(o) == {s.value: 1 for s in STEPS} and not ledger.undone(o) for o in ids
        ),
    }
    figures = {
        "before_restart": len(first_ids),
        "after_restart": len(later_ids),
        "in_flight_at_restart": len(in_flight),
        "between_steps_at_restart": len(mid_step),
        "steps_done_at_restart": sum(len(at_restart.applied(o)) for o in first_ids),
        "completed_after_restart": len(after_restart),
        "restart": options.restart,
        "restart_s": round(restart_s, 2),
        "versions": dict(Counter(str(v) for v in versions.values())),
        "workflow_versions": dict(Counter(str(r.workflow_version) for r in records.values())),
        "attempts": dict(Counter(str(r.attempt) for r in records.values())),
        "instances": len(instances),
        "failed_instances": failed,
        "latency_ms_mean": options.latency_ms,
        "from_version": options.from_version,
    }
    return lifecycle_verdict(options.drill, lab, ids, records, ledger, checks, figures, elapsed)


# --- running ----------------------------------------------------------------------------------------------------

DRILL_FUNCTIONS: dict[str, Callable[[Lab, LifecycleOptions], Awaitable[Verdict]]] = {
    "compensation": drill_compensation,
    "cancel-in-flight": drill_cancel_in_flight,
    "poison-in-session": drill_poison_in_session,
    "upgrade-in-flight": drill_upgrade_in_flight,
}


async def run_lifecycle_drill(system: LocalSystem, options: LifecycleOptions) -> Verdict:
    """The drill on a started `system` (built from `lifecycle_config`), then the invariants every drill checks
    (lab/invariants.py) over the orders that got a final status; the caller stops the system."""
    install_for(system)
    async with client_app(system) as client:
        lab = Lab(system, client)
        try:
            verdict = await DRILL_FUNCTIONS[options.drill](lab, options)
            findings = await check_system(system, sorted(client.statuses), lambda o: o in client.terminal_at)
        finally:
            await lab.aclose()
    return verdict.with_invariants(findings)


def run_lifecycle_command(args: argparse.Namespace) -> int:
    try:
        options = LifecycleOptions(
            drill=args.scenario,
            orders=args.orders,
            seed=args.seed,
            settings=args.settings,
            overrides=parse_overrides(args.overrides),
            timeout=args.timeout,
            hang_seconds=args.hang_seconds,
            latency_ms=args.latency_ms,
            restart=args.restart,
            from_version=args.from_version,
        )
    except ValueError as exc:
        return usage_error(exc)
    work = Path(args.work_dir or default_work_dir("drill-"))
    system = LocalSystem(lifecycle_config(work, options, args.servicebus_config))
    return run_verdict_drill(args, system, lambda _: run_lifecycle_drill(system, options))
