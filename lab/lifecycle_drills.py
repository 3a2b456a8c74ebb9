"""Lifecycle drills, `python -m devhost drill NAME` with NAME one of `compensation`, `cancel-in-flight`,
`poison-in-session`, `upgrade-in-flight`: what an order's life goes through besides success.

Each runs on the whole local system in real processes (devhost, the Agent, the simulator, a client app), judges from
the state store, the simulator's ledger, the queues and devhost's durable history (never from logs) and ends with the
`Verdict` every drill gives. Options, settings and system (`LifecycleOptions`, `LIFECYCLE_SETTINGS`,
`lifecycle_config`) live in lab/_lifecycle_common.py, `cancel-in-flight` and `poison-in-session` in
lab/_session_drills.py; this module re-exports them and runs the four. What each proves: docs/modules-lab.md.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from orderflow.messages import (
    COMPENSATION_OF,
    STEPS,
    AlertKind,
    OrderStatus,
    idempotency_key,
)
from orderflow.records import ProcessState, StepStatus
from orderflow.workflow import WORKFLOW_V1, WORKFLOW_VERSION

from ._lifecycle_common import (
    CHARGE,
    DEFAULT_ORDERS,
    DEFAULT_VERSION_SETTING,
    FIXED_ORDERS,
    LIFECYCLE_SETTINGS,
    RESERVE,
    SHIP,
    LifecycleOptions,
    _final,
    _status_at,
    lifecycle_config,
)
from ._session_drills import drill_cancel_in_flight, drill_poison_in_session
from .demo import client_app, default_work_dir, make_orders
from .drill_common import (
    Verdict,
    drill_arguments,
    run_verdict_drill,
    usage_error,
)
from .invariants import check_system, install_for
from .lifecycle_lab import Lab, elapsed_s, lifecycle_verdict, percentiles, status_matches_ledger
from .system import LocalSystem

T = TypeVar("T")


# --- compensation -----------------------------------------------------------------------------------------------

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
    instances = await lab.ended_instances(records)

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
            **drill_arguments(args),
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


__all__ = [
    "DEFAULT_ORDERS",
    "DEFAULT_VERSION_SETTING",
    "DRILL_FUNCTIONS",
    "FIXED_ORDERS",
    "LIFECYCLE_SETTINGS",
    "LifecycleOptions",
    "compensation_roles",
    "drill_cancel_in_flight",
    "drill_compensation",
    "drill_poison_in_session",
    "drill_upgrade_in_flight",
    "lifecycle_config",
    "run_lifecycle_command",
    "run_lifecycle_drill",
]
