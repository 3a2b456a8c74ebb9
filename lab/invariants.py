"""The invariants every drill checks, from the state store, the simulator's ledger and the queues, never from logs.

Contract: no order lost; none stuck; at most one remote side effect per order step and per compensation; remote calls
per idempotency key within `RemoteCallBudgetPerStep`; no state transition outside `state_machine.TRANSITIONS` (the
transition audit of `install_transition_audit`, in the drill's store file only); every dead-lettered message has a
reason. Each invariant in full: docs/modules-lab.md.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from azure.servicebus import ServiceBusSubQueue

from orderflow.adapters import bus_from_connection_string
from orderflow.records import ProcessState
from orderflow.retry_budget import RetryBudget
from orderflow.state_machine import TRANSITIONS

UNFINISHED = (ProcessState.PENDING.value, ProcessState.PROCESSING.value, ProcessState.COMPENSATING.value)
# A record is created Pending (submission) or already claimed (the submission's fast path, issue 13).
CREATED_AS = frozenset({ProcessState.PENDING.value, ProcessState.PROCESSING.value})
ALLOWED = frozenset((before.value, after.value) for (before, _event), after in TRANSITIONS.items())

_AUDIT_DDL = """
CREATE TABLE IF NOT EXISTS transition_audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, order_id TEXT NOT NULL, before TEXT, after TEXT NOT NULL,
    at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')));
CREATE TRIGGER IF NOT EXISTS transition_audit_insert AFTER INSERT ON order_state
BEGIN
    INSERT INTO transition_audit (order_id, before, after) VALUES (new.id, NULL, new.process_state);
END;
CREATE TRIGGER IF NOT EXISTS transition_audit_update AFTER UPDATE OF process_state ON order_state
WHEN old.process_state IS NOT new.process_state
BEGIN
    INSERT INTO transition_audit (order_id, before, after) VALUES (new.id, old.process_state, new.process_state);
END;
"""


def store_path(env: dict[str, str]) -> Path:
    endpoint = env["CosmosDb__accountEndpoint"]
    assert endpoint.startswith("embedded://"), "the transition audit needs the embedded store"
    return Path(endpoint.removeprefix("embedded://"))


def install_transition_audit(path: Path) -> None:
    """Create the embedded store's tables (as the adapter would) and the audit's triggers; idempotent. Install it
    before the drill's first order: a change made earlier is not audited."""
    from orderflow.embedded.store._file import _SCHEMA  # the adapter's own schema, not a copy

    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path, timeout=30) as conn:
        conn.executescript(_SCHEMA)
        conn.executescript(_AUDIT_DDL)


def read_transitions(path: Path) -> list[tuple[str, str | None, str]]:
    """(orderId, before, after) of every audited change, in order; [] when no audit was installed."""
    with sqlite3.connect(path, timeout=30) as conn:
        try:
            rows = conn.execute("SELECT order_id, before, after FROM transition_audit ORDER BY seq").fetchall()
        except sqlite3.OperationalError:
            return []
    return [(str(o), None if b is None else str(b), str(a)) for o, b, a in rows]


@dataclass
class Evidence:
    """What the invariants are judged on, read from the system at the end of a drill."""

    order_ids: list[str]
    states: dict[str, str]  # orderId -> ProcessState of its record (absent: no record)
    effects: dict[str, Any]  # the simulator's GET /effects
    transitions: list[tuple[str, str | None, str]]
    dead_letters: list[tuple[str, str | None]]  # (queue, reason) of every dead-lettered message
    budget: int  # RemoteCallBudgetPerStep
    audited: bool = True  # whether the transition audit was installed
    expect_record: set[str] = field(default_factory=set)  # the orders that must have a record


@dataclass(frozen=True)
class Findings:
    checks: dict[str, bool]
    figures: dict[str, Any]
    lost: int
    stuck: int
    duplicates: int


def judge(evidence: Evidence) -> Findings:
    lost = sorted(o for o in evidence.expect_record if o not in evidence.states)
    stuck = sorted(o for o, s in evidence.states.items() if s in UNFINISHED)
    duplicates = int(evidence.effects.get("duplicates", -1))  # -1: the ledger could not be read
    by_key: dict[str, int] = evidence.effects.get("callsByKey", {})
    over_budget = {k: n for k, n in by_key.items() if n > evidence.budget}
    illegal = [
        (o, b, a)
        for o, b, a in evidence.transitions
        if (b is None and a not in CREATED_AS) or (b is not None and (b, a) not in ALLOWED)
    ]
    unexplained = [q for q, reason in evidence.dead_letters if not reason]
    checks = {
        "invariant: no order lost": not lost,
        "invariant: none stuck": not stuck,
        "invariant: at most one side effect per order step": duplicates == 0,
        "invariant: remote calls per order step within the retry budget": not over_budget,
        "invariant: no transition outside the state machine": evidence.audited and not illegal,
        "invariant: every dead letter has a reason": not unexplained,
    }
    figures = {
        "invariants": {
            "lost": lost[:10],
            "stuck": stuck[:10],
            "duplicate_side_effects": duplicates,
            "most_calls_per_key": max(by_key.values(), default=0),
            "retry_budget": evidence.budget,
            "over_budget": dict(list(over_budget.items())[:10]),
            "transitions_audited": len(evidence.transitions),
            "illegal_transitions": [f"{o}: {b} → {a}" for o, b, a in illegal[:10]],
            "dead_letters": len(evidence.dead_letters),
            "dead_letters_without_reason": len(unexplained),
        }
    }
    return Findings(checks, figures, len(lost), len(stuck), duplicates)


@dataclass(frozen=True)
class DeadLettered:
    message_id: str
    session_id: str | None
    sequence_number: int
    enqueued_at: datetime
    reason: str | None
    description: str | None


def dead_letters(connection: str, queue: str) -> list[DeadLettered]:
    """Every message in `queue`'s dead-letter sub-queue (peeked: nothing is removed)."""
    found: list[DeadLettered] = []
    with (
        bus_from_connection_string(connection) as bus,
        bus.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq,
    ):
        next_seq = 0
        while True:
            page = dlq.peek_messages(max_message_count=100, sequence_number=next_seq)
            for m in page:
                next_seq = max(next_seq, int(m.sequence_number) + 1)
                found.append(
                    DeadLettered(
                        str(m.message_id),
                        m.session_id,
                        int(m.sequence_number),
                        m.enqueued_time_utc,
                        m.dead_letter_reason,
                        m.dead_letter_error_description,
                    )
                )
            if len(page) < 100:
                return found


def _dead_letters(connection: str) -> list[tuple[str, str | None]]:
    """(queue, reason) of every dead-lettered message on every queue of the embedded broker."""
    with bus_from_connection_string(connection) as client:
        queues = client.broker.queue_names()
    return [(queue, d.reason) for queue in queues for d in dead_letters(connection, queue)]


async def collect(
    env: dict[str, str],
    connection: str,
    effects: dict[str, Any],
    order_ids: Iterable[str],
    expect_record: Callable[[str], bool] = lambda _: True,
) -> Evidence:
    """The evidence of a drill whose orders are `order_ids`, on the system with these settings."""
    from orderflow.adapters import open_stores

    ids = list(order_ids)
    states: dict[str, str] = {}
    async with open_stores(env) as stores:
        for order_id in ids:
            found = await stores.state.get(order_id)
            if found is not None:
                states[order_id] = found[0].process_state.value
    path = store_path(env)
    transitions = read_transitions(path)
    audited = _audit_installed(path)
    dead = await asyncio.to_thread(_dead_letters, connection)
    return Evidence(
        ids,
        states,
        effects,
        transitions,
        dead,
        RetryBudget.from_env(env).budget,
        audited,
        {o for o in ids if expect_record(o)},
    )


def _audit_installed(path: Path) -> bool:
    with sqlite3.connect(path, timeout=30) as conn:
        return (
            conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = 'transition_audit_update'"
            ).fetchone()
            is not None
        )


def install_for(system: Any) -> None:
    """The transition audit on a started (or about to start) local system's store."""
    install_transition_audit(store_path(system.env()))


async def check_system(
    system: Any, order_ids: Iterable[str], expect_record: Callable[[str], bool] = lambda _: True
) -> Findings:
    """The invariants of a drill's orders on a running local system (lab.system.LocalSystem)."""
    from .demo import read_effects

    effects = await read_effects(system)
    evidence = await collect(system.env(), system.config.bus_connection, effects, order_ids, expect_record)
    return judge(evidence)
