"""The lifecycle drills that send an order's session more than its SubmitOrder (lab/lifecycle_drills.py, which
re-exports them, describes both): `cancel-in-flight`, a client's cancel at each stage of an order's life, and
`poison-in-session`, a poison message next to a good one in each of four orders' sessions."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from orderflow.messages import COMPENSATION_OF, STEPS, AlertKind, OrderStatus, StatusMessage, StepName, idempotency_key
from orderflow.records import ProcessState, StepStatus

from ._lifecycle_common import FIXED_ORDERS, RESERVE, LifecycleOptions, _final, _status_at
from .demo import make_orders
from .drill_common import Verdict
from .lifecycle_lab import Lab, lifecycle_verdict, status_matches_ledger
from .poison_strategies import PoisonCase, poison_cases

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
