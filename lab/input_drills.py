"""Input drills, `python -m devhost drill duplicate-delivery|poison-input`: what arrives on the queues, rather than
what fails behind them, on the whole local system in real processes.

Contract: judged from the state store, the simulator's ledger, the queues and devhost's durable history, never from
logs; each ends with the `Verdict` of the other drills plus the invariants of lab/invariants.py.
`duplicate-delivery` (every message delivered twice: orderflow/embedded/broker/_faults.py): every order Processed
exactly once, each compensation and dead-lettering once. `poison-input` (poisons drawn with hypothesis from
orderflow/messages.py, seeded by `--seed`): every poison dead-lettered with the submission trigger's reason, the valid
orders all Processed. What each sends and checks: docs/modules-lab.md.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from azure.servicebus import ServiceBusMessage

from orderflow.messages import (
    COMPENSATION_OF,
    STEPS,
    TERMINAL_STATUSES,
    AlertKind,
    OperatorAlert,
    OrderStatus,
    StatusMessage,
    StepName,
    idempotency_key,
)
from orderflow.records import ProcessState

from .demo import client_app, default_work_dir, make_orders
from .drill_common import SETTINGS_CHOICES, Verdict, base_settings, drill_arguments, run_verdict_drill, usage_error
from .invariants import check_system, install_for, read_transitions, store_path
from .lifecycle_lab import Lab, lifecycle_verdict, status_matches_ledger
from .poison_strategies import Poison, draw_poison, poison_digest
from .system import LocalSystem, SystemConfig, with_bus_config

INPUT_DRILLS = ("duplicate-delivery", "poison-input")
DEFAULT_ORDERS = {"duplicate-delivery": 12, "poison-input": 10}
POISON_PER_ORDER = 3  # poison-input: poison messages per valid order
REFUSED_ORDERS = 2  # duplicate-delivery: orders whose arrange-shipping is refused (compensated), beside --orders
REFUSED_CALLS = 50  # the remote refuses every one of a refused key's calls (more than any retry budget)
_EVERY_SECOND = "*/1 * * * * *"
# Over the chosen base (LOCAL_DEFAULTS or the sample's) and under `--set`: the Starter every second, as the other
# drills; nothing of the crash budget changes.
INPUT_SETTINGS: dict[str, dict[str, str]] = {
    "duplicate-delivery": {"StarterSchedule": _EVERY_SECOND},
    "poison-input": {"StarterSchedule": _EVERY_SECOND},
}
SHIP, CHARGE, RESERVE = StepName.ARRANGE_SHIPPING, StepName.CHARGE_PAYMENT, StepName.RESERVE_INVENTORY
REFUND, RELEASE = COMPENSATION_OF[CHARGE].value, COMPENSATION_OF[RESERVE].value


@dataclass(frozen=True)
class InputOptions:
    drill: str
    orders: int | None = None  # duplicate-delivery: the orders that must be Processed; poison-input: valid orders
    seed: int = 1
    settings: str = "local"
    overrides: tuple[tuple[str, str], ...] = ()
    timeout: float = 300.0  # the longest the drill waits for every final status

    def __post_init__(self) -> None:
        if self.drill not in INPUT_DRILLS:
            raise ValueError(f"drill must be one of {INPUT_DRILLS}")
        if self.settings not in SETTINGS_CHOICES:
            raise ValueError(f"settings must be one of {SETTINGS_CHOICES}")
        if self.order_count < 1 or self.timeout <= 0:
            raise ValueError("need at least one order and a positive timeout")

    @property
    def order_count(self) -> int:
        return DEFAULT_ORDERS[self.drill] if self.orders is None else self.orders

    @property
    def poison_count(self) -> int:
        return POISON_PER_ORDER * self.order_count if self.drill == "poison-input" else 0

    def settings_values(self) -> dict[str, str]:
        return {**base_settings(self.settings), **INPUT_SETTINGS[self.drill], **dict(self.overrides)}


class DuplicatingConfig(SystemConfig):
    """A system whose every process (devhost, the Agent, the client app, the drill's readers) opens the embedded
    broker with the `DuplicateDelivery` switch on: each loses its first complete of every message."""

    @property
    def bus_connection(self) -> str:
        return f"{super().bus_connection};DuplicateDelivery=true"


def input_config(work_dir: Path, options: InputOptions, servicebus_config: Path | None = None) -> SystemConfig:
    """The drill's system: a remote that fails only where the drill scripts it; duplicate-delivery's broker switch."""
    kind = DuplicatingConfig if options.drill == "duplicate-delivery" else SystemConfig
    config = kind(
        work_dir=work_dir.resolve(),
        seed=options.seed,
        transient_failure_rate=0.0,
        permanent_failure_rate=0.0,
        hang_rate=0.0,
        settings=options.settings_values(),
    )
    return with_bus_config(config, servicebus_config)


# --- what both drills read beyond the Lab: the broker's counts, the store's ids, alerts in peek-lock mode ----------


def _queue_figures(connection: str) -> tuple[dict[str, int], dict[str, int]]:
    """(messages not settled for good, per queue; messages the DuplicateDelivery switch delivered twice, per queue)."""
    from orderflow.adapters import bus_from_connection_string

    with bus_from_connection_string(connection) as bus:
        broker = bus.broker
        left = {}
        for queue in broker.queue_names():
            counts = broker.counts(queue)
            left[queue] = counts.active + counts.scheduled + counts.deferred
        return left, broker.redelivered_counts()


def _read_alerts_peek_lock(connection: str, queue: str) -> list[tuple[str, int, OperatorAlert]]:
    """Every alert queued so far, read as an operator reads them (peek-lock, then complete): (MessageId, delivery count,
    alert) of each delivery. Under DuplicateDelivery a completed alert comes back once more."""
    from orderflow.adapters import bus_from_connection_string

    read: list[tuple[str, int, OperatorAlert]] = []
    with bus_from_connection_string(connection) as bus, bus.get_queue_receiver(queue) as receiver:
        while batch := receiver.receive_messages(max_message_count=100, max_wait_time=0.2):
            for m in batch:
                read.append(
                    (str(m.message_id), int(m.delivery_count or 0), OperatorAlert.model_validate_json(b"".join(m.body)))
                )
                receiver.complete_message(m)
    return read


def stored_order_ids(env: dict[str, str]) -> set[str]:
    """Every orderId with a document in the orders DB or the state store, or a change in the transition audit."""
    path = store_path(env)
    with sqlite3.connect(path, timeout=30) as conn:
        found = {str(r[0]) for r in conn.execute("SELECT id FROM orders UNION SELECT id FROM order_state")}
    return found | {o for o, _b, _a in read_transitions(path)}


def _final(lab: Lab, order_id: str) -> StatusMessage | None:
    return next((s for s in lab.statuses(order_id) if s.state in TERMINAL_STATUSES), None)


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {"p50": round(ordered[len(ordered) // 2], 3), "max": round(ordered[-1], 3)}


# --- duplicate-delivery -------------------------------------------------------------------------------------------


async def drill_duplicate_delivery(lab: Lab, options: InputOptions) -> tuple[Verdict, list[str], set[str]]:
    system, reply = lab.system, lab.client.reply_queue
    orders = make_orders(options.order_count, options.seed, reply, prefix="duplicate-delivery")
    refused = make_orders(REFUSED_ORDERS, options.seed, reply, prefix="duplicate-delivery-refused")
    ids, refused_ids = [o.order_id for o in orders], [o.order_id for o in refused]
    everyone = ids + refused_ids
    # Refused on every call, as a real service answers a repeated idempotency key: a redelivered request must not
    # find the step suddenly accepted (the simulator falls back to its seeded "ok" past a script's end).
    await lab.script({idempotency_key(o, SHIP.value): ["permanent"] * REFUSED_CALLS for o in refused_ids})
    poison_id = f"duplicate-delivery:{options.seed}:poison"
    poison = ServiceBusMessage(
        b"a poison message: not JSON",
        session_id=f"duplicate-delivery-{options.seed}-poison",
        message_id=poison_id,
        content_type="application/json",
    )
    connection = system.config.bus_connection
    alerts: list[tuple[str, int, OperatorAlert]] = []
    started = time.monotonic()
    await lab.submit(orders + refused)
    await lab.send([poison])
    await lab.wait(lambda: lab.client.all_terminal.is_set(), "every final status", options.timeout)
    elapsed = max(lab.client.terminal_at.values(), default=time.monotonic()) - started

    def expected_alerts_twice() -> bool:
        """An OrderFailed alert of each refused order and the poison's PoisonMessage alert, each read twice."""
        seen = Counter(mid for mid, _n, _a in alerts)
        twice = [a for mid, _n, a in alerts if seen[mid] >= 2]
        return all(
            any(a.kind is AlertKind.ORDER_FAILED and a.order_id == o for a in twice) for o in refused_ids
        ) and any(a.kind is AlertKind.POISON_MESSAGE and a.details.get("messageId") == poison_id for a in twice)

    async def settled() -> bool:
        """The expected alerts read twice, and nothing left on any queue: every second delivery consumed."""
        alerts.extend(await asyncio.to_thread(_read_alerts_peek_lock, connection, lab.alerts_queue))
        left, _ = await asyncio.to_thread(_queue_figures, connection)
        return expected_alerts_twice() and not any(left.values())

    await lab.wait(settled, "the alerts read twice and every queue drained")
    left, redelivered = await asyncio.to_thread(_queue_figures, connection)
    records = await lab.records(everyone)
    ledger = await lab.ledger()
    dead = await lab.dead_letters()
    transitions = read_transitions(store_path(lab.env))
    instances = await lab.ended_instances(records)

    def into(o: str, state: ProcessState) -> int:
        return sum(1 for oid, _b, after in transitions if oid == o and after == state.value)

    def instances_of(o: str) -> list[dict[str, Any]]:
        return [v for i, v in instances.items() if i.rsplit(":", 1)[0] == o]

    def consistent(o: str, outcome: OrderStatus) -> bool:
        """Statuses may repeat; every terminal one says the same (state, attempt, reason, effects), the expected one,
        and `received` came first."""
        got = lab.statuses(o)
        finals = {
            (s.state, s.attempt, s.reason, s.effects and s.effects.to_json())
            for s in got
            if s.state in TERMINAL_STATUSES
        }
        return (
            bool(got) and got[0].state is OrderStatus.RECEIVED and len(finals) == 1 and next(iter(finals))[0] is outcome
        )

    def once(o: str, state: ProcessState, outcome: OrderStatus) -> bool:
        rec = records.get(o)
        runs = instances_of(o)
        return (
            rec is not None
            and rec.process_state is state
            and rec.attempt == 1
            and into(o, state) == 1
            and len(runs) == 1
            and runs[0].get("status") == "Completed"
            and consistent(o, outcome)
        )

    status_deliveries = Counter((s.order_id, s.state, s.attempt) for o in everyone for s in lab.statuses(o))
    alert_deliveries = Counter(mid for mid, _n, _a in alerts)
    inbound = lab.orders_queue
    by_key: dict[str, int] = ledger.report.get("callsByKey", {})
    checks = {
        "Processed exactly once: one transition into Processed, one orchestration (Completed), attempt 1": all(
            once(o, ProcessState.PROCESSED, OrderStatus.COMPLETED) for o in ids
        ),
        "processed orders: one effect per step, nothing compensated": all(
            ledger.effect_counts(o) == {s.value: 1 for s in STEPS} and not ledger.compensation_counts(o) for o in ids
        ),
        "statuses may repeat, the final one is consistent (one terminal status, after `received`)": all(
            consistent(o, OrderStatus.COMPLETED) for o in ids
        ),
        "refused orders compensated exactly once: one transition into Compensated, one orchestration": all(
            once(o, ProcessState.COMPENSATED, OrderStatus.COMPENSATED) for o in refused_ids
        ),
        "refused orders: reserve and charge applied once and undone once, shipping never applied": all(
            ledger.effect_counts(o) == {RESERVE.value: 1, CHARGE.value: 1}
            and ledger.compensation_counts(o) == {REFUND: 1, RELEASE: 1}
            and ledger.undone(o) == [RESERVE.value, CHARGE.value]
            for o in refused_ids
        ),
        "every final status tells the ledger's effects": all(
            status_matches_ledger(_final(lab, o), ledger, o) for o in everyone
        ),
        "the poison dead-lettered once (InvalidJson), nothing else": [(d.message_id, d.reason) for d in dead]
        == [(poison_id, "InvalidJson")],
        "one OrderFailed alert per refused order, one PoisonMessage alert, each read twice (same MessageId)": all(
            sum(1 for mid in {m for m, _n, a in alerts if a.kind is AlertKind.ORDER_FAILED and a.order_id == o}) == 1
            for o in refused_ids
        )
        and expected_alerts_twice()
        and all(n >= 2 for n in alert_deliveries.values()),
        "every queue delivered messages twice (orders, requests, replies, statuses, alerts)": all(
            redelivered.get(q, 0) > 0
            for q in (
                inbound,
                lab.env.get("AgentRequestsQueueName", "agent-requests"),
                lab.env.get("AgentRepliesQueueName", "agent-replies"),
                lab.client.reply_queue,
                lab.alerts_queue,
            )
        ),
        "the app's inbound queue: each order's message delivered twice": redelivered.get(inbound, 0) == len(everyone),
        "the app got every status at least twice": all(n >= 2 for n in status_deliveries.values()),
        "every queue drained (each second delivery consumed)": not any(left.values()),
    }
    figures = {
        "delivered_twice": redelivered,
        "status_deliveries": {str(n): k for n, k in sorted(Counter(status_deliveries.values()).items())},
        "statuses": len(status_deliveries),
        "alert_deliveries": {str(n): k for n, k in sorted(Counter(alert_deliveries.values()).items())},
        "alerts": dict(Counter(a.kind.value for a in {mid: a for mid, _n, a in alerts}.values())),
        "calls_per_step": {str(c): k for c, k in sorted(Counter(by_key.values()).items())},
        "calls": sum(by_key.values()),
        "attempts": dict(Counter(str(r.attempt) for r in records.values())),
        "states": dict(Counter(r.process_state.value for r in records.values())),
        "instances": sum(len(instances_of(o)) for o in everyone),
        "processed": len(ids),
        "refused": len(refused_ids),
        "left_on_queues": {q: n for q, n in left.items() if n},
    }
    return (
        lifecycle_verdict(options.drill, lab, everyone, records, ledger, checks, figures, elapsed),
        everyone,
        set(everyone),
    )


# --- poison-input: the drill --------------------------------------------------------------------------------------


async def drill_poison_input(
    lab: Lab, options: InputOptions, poison: list[Poison]
) -> tuple[Verdict, list[str], set[str]]:
    orders = make_orders(options.order_count, options.seed, lab.client.reply_queue, prefix="poison-input")
    ids = [o.order_id for o in orders]
    valid = [
        ServiceBusMessage(
            o.to_json(), message_id=f"submit:{o.order_id}", session_id=o.order_id, content_type="application/json"
        )
        for o in orders
    ]
    plan: list[ServiceBusMessage | Poison] = [*valid, *poison]
    random.Random(f"poison-input:{options.seed}").shuffle(plan)  # interleaved, the same for the same seed
    lab.client._expected.update(ids)  # the drill sends the valid orders itself (interleaved), not client.submit
    lab.client.all_terminal.clear()
    sent_at: dict[str, float] = {}
    started = time.monotonic()
    async with lab.client.bus.get_queue_sender(lab.orders_queue) as sender:
        for item in plan:  # one send each: a poison is one message, in its own session
            if isinstance(item, Poison):
                sent_at[item.message_id] = time.time()
                await sender.send_messages(item.message())
            else:
                lab.client.sent_at[str(item.session_id)] = time.monotonic()
                await sender.send_messages(item)
    await lab.wait(lambda: lab.client.all_terminal.is_set(), "every valid order's final status", options.timeout)
    elapsed = max(lab.client.terminal_at.values(), default=time.monotonic()) - started

    async def handled() -> bool:
        await lab.read_alerts()
        alerted = {a.details.get("messageId") for a in lab.alerts if a.kind is AlertKind.POISON_MESSAGE}
        dead = {d.message_id for d in await lab.dead_letters()}
        return all(p.message_id in alerted and p.message_id in dead for p in poison)

    await lab.wait(handled, "every poison dead-lettered and alerted")
    records = await lab.records(ids)
    ledger = await lab.ledger()
    dead = {d.message_id: d for d in await lab.dead_letters()}
    alerts = {a.details.get("messageId"): a for a in lab.alerts if a.kind is AlertKind.POISON_MESSAGE}
    stored = stored_order_ids(lab.env)

    def letter_ok(p: Poison) -> bool:
        d = dead.get(p.message_id)
        return d is not None and d.reason == p.reason and (p.field is None or f"'{p.field}'" in (d.description or ""))

    def alert_ok(p: Poison) -> bool:
        a, d = alerts.get(p.message_id), dead.get(p.message_id)
        return (
            a is not None
            and a.reason == p.reason
            and a.details.get("sessionId") == p.session_id
            and d is not None
            and a.details.get("sequenceNumber") == d.sequence_number
        )

    wrong_letters = [p for p in poison if not letter_ok(p)]
    wrong_alerts = [p for p in poison if not alert_ok(p)]
    called = {k.rsplit(":", 1)[0] for k in ledger.report.get("callsByKey", {})}
    to_alert = [a.raised_at.timestamp() - sent_at[m] for m, a in alerts.items() if m in sent_at]
    checks = {
        "every poison dead-lettered with its reason, the description naming the field": not wrong_letters,
        "a PoisonMessage alert for each poison (its reason, session and sequence number)": not wrong_alerts,
        "only the poison dead-lettered": set(dead) == {p.message_id for p in poison},
        "no state record, orders-DB record or state transition but the valid orders'": stored <= set(ids),
        "no remote call but for the valid orders": called <= set(ids),
        "the valid orders all Processed with `completed`, one effect per step": all(
            o in records
            and records[o].process_state is ProcessState.PROCESSED
            and lab.status(o, OrderStatus.COMPLETED) is not None
            and ledger.effect_counts(o) == {s.value: 1 for s in STEPS}
            for o in ids
        ),
    }
    figures = {
        "poison": len(poison),
        "valid_orders": len(ids),
        "seed": options.seed,
        "poison_digest": poison_digest(poison),
        "families": dict(Counter(p.family for p in poison)),
        "reasons": dict(Counter(p.reason for p in poison).most_common()),
        "largest_body_bytes": max((len(p.body) for p in poison), default=0),
        "dead_lettered": len(dead),
        "poison_alerts": len(alerts),
        "poison_to_alert_s": _percentiles(to_alert),
        "mismatched": [
            {
                "messageId": p.message_id,
                "family": p.family,
                "expected": p.reason,
                "got": dead[p.message_id].reason if p.message_id in dead else None,
                "description": (dead[p.message_id].description or "")[:160] if p.message_id in dead else None,
            }
            for p in wrong_letters[:10]
        ],
        "records_not_valid": sorted(stored - set(ids))[:10],
    }
    verdict = lifecycle_verdict(options.drill, lab, ids, records, ledger, checks, figures, elapsed)
    return verdict, [*ids, *sorted({p.order_id for p in poison})], set(ids)


# --- running ------------------------------------------------------------------------------------------------------


async def run_input_drill(system: LocalSystem, options: InputOptions, poison: list[Poison]) -> Verdict:
    """The drill on a started `system` (built from `input_config`), then the invariants every drill checks over its
    orders (a poison's orderId must have no record); the caller stops the system."""
    install_for(system)
    async with client_app(system) as client:
        lab = Lab(system, client)
        try:
            run: Awaitable[tuple[Verdict, list[str], set[str]]] = (
                drill_duplicate_delivery(lab, options)
                if options.drill == "duplicate-delivery"
                else drill_poison_input(lab, options, poison)
            )
            verdict, order_ids, must_exist = await run
            findings = await check_system(system, order_ids, lambda o: o in must_exist)
        finally:
            await lab.aclose()
    return verdict.with_invariants(findings)


def run_command(args: argparse.Namespace) -> int:
    try:
        options = InputOptions(
            drill=args.scenario,
            **drill_arguments(args),
        )
    except ValueError as exc:
        return usage_error(exc)
    work = Path(args.work_dir or default_work_dir("drill-"))
    system = LocalSystem(input_config(work, options, args.servicebus_config))
    poison = (
        draw_poison(options.seed, options.poison_count, system.config.reply_queue)
        if options.drill == "poison-input"
        else []
    )
    return run_verdict_drill(args, system, lambda _: run_input_drill(system, options, poison))
