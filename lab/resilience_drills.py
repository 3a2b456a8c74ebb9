"""Resilience drills, `retry-budget`, `remote-outage` and `backlog-flood`: when a dependency fails.

Each runs with its own settings (`DRILL_SETTINGS`, over `--settings`, under `--set NAME=VALUE`), samples the system
every 200 ms while the orders run (`Monitor`, in lab/_resilience_monitor.py with the breaker's history) and ends with a
`Verdict`, `{drill, passed, orders, lost, duplicate_side_effects, stuck, checks, figures}`, the last line of `--json`;
`passed` iff every check holds. What each proves: docs/modules-lab.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from agent.config import AGENT_SETTINGS
from orderflow import settings as app_settings
from orderflow.messages import COMPENSATION_OF, STEPS, OrderStatus, idempotency_key
from orderflow.records import ProcessState
from orderflow.retry_budget import RetryBudget

from ._resilience_monitor import BreakerHistory, CallsWhileOpen, Monitor, OpenRound
from .demo import (
    FAILED_STATES,
    ClientApp,
    StateSummary,
    client_app,
    make_orders,
    read_effects,
    read_states,
    simulator_json,
    wait_terminal,
)
from .drill_common import DEFAULT_ORDERS, RESILIENCE_DRILLS, SETTINGS_CHOICES, Verdict, base_settings
from .invariants import check_system, install_for
from .system import LocalSystem, SystemConfig, with_bus_config

# Each resilience drill's settings, over the chosen base (LOCAL_DEFAULTS or the sample's) and under `--set`. The
# Starter runs every second so that a retried or deferred order is claimed again at once, and admission figures are
# refreshed each second. Step timeout, lease, backoffs and FailureThreshold stay those of the base: the crash budget
# (orderflow/session_locks.py) holds for them.
_EVERY_SECOND = "*/1 * * * * *"
DRILL_SETTINGS: dict[str, dict[str, str]] = {
    # The breaker off: the retry budget alone must bound the calls. Steps of 8 s (no crash here, so the crash budget
    # of orderflow/session_locks.py does not apply): the Agent's 5 calls per request (backoffs of about 3 s) still fit
    # in a step, so the product is the same as with 20 s steps, and FailureThreshold attempts take 24 s, not 60 s.
    "retry-budget": {
        "CircuitBreakerFailureThreshold": "0",
        "StarterSchedule": _EVERY_SECOND,
        "StepTimeoutSeconds": "8",
        "ClaimLeaseSeconds": "8",
    },
    # A breaker that opens and recovers within seconds: 5 failed requests in 10 s open it, 3 s cool-down (doubled per
    # failed probe, at most 6 s), one probe per half-open round. Steps of 8 s, as for retry-budget (no crash here):
    # the orders caught at the Agent by the outage wait for their step's CompleteBy before the first probe.
    "remote-outage": {
        "CircuitBreakerFailureThreshold": "5",
        "CircuitBreakerWindowSeconds": "10",
        "CircuitBreakerCooldownSeconds": "3",
        "CircuitBreakerMaxCooldownSeconds": "6",
        "CircuitBreakerProbes": "1",
        "StarterSchedule": _EVERY_SECOND,
        "StepTimeoutSeconds": "8",
        "ClaimLeaseSeconds": "8",
    },
    # Bounds far below the flood: 300 orders at once against 60 Pending and 20 Processing.
    "backlog-flood": {"MaxPendingOrders": "60", "MaxOrdersInProcessing": "20", "StarterSchedule": _EVERY_SECOND},
}

# --- the resilience drills (issue 11) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ResilienceOptions:
    drill: str  # retry-budget | remote-outage | backlog-flood
    orders: int | None = None  # None: DEFAULT_ORDERS[drill]
    seed: int = 1
    settings: str = "local"  # the base under DRILL_SETTINGS: local (LOCAL_DEFAULTS) or sample
    overrides: tuple[tuple[str, str], ...] = ()  # --set NAME=VALUE, over DRILL_SETTINGS
    outage_after: float = 2.0  # remote-outage: seconds from the submission to the outage
    outage_for: float = 15.0  # remote-outage: seconds the remote stays down
    timeout: float = 900.0

    def __post_init__(self) -> None:
        if self.drill not in RESILIENCE_DRILLS:
            raise ValueError(f"drill must be one of {RESILIENCE_DRILLS}")
        if self.settings not in SETTINGS_CHOICES:
            raise ValueError(f"settings must be one of {SETTINGS_CHOICES}")
        if self.order_count < 1 or self.outage_after < 0 or self.outage_for <= 0:
            raise ValueError("need at least one order, outage_after >= 0 and outage_for > 0")

    @property
    def order_count(self) -> int:
        return DEFAULT_ORDERS[self.drill] if self.orders is None else self.orders

    def settings_values(self) -> dict[str, str]:
        """What the system runs with over LOCAL_DEFAULTS: the base, the drill's settings, then `--set`."""
        return {**base_settings(self.settings), **DRILL_SETTINGS[self.drill], **dict(self.overrides)}


def resilience_config(
    work_dir: Path, options: ResilienceOptions, servicebus_config: Path | None = None
) -> SystemConfig:
    """The drill's system: retry-budget's remote fails every call transiently; the others' never fails by itself
    (remote-outage takes it down through the outage switch)."""
    config = SystemConfig(
        work_dir=work_dir.resolve(),
        seed=options.seed,
        transient_failure_rate=1.0 if options.drill == "retry-budget" else 0.0,
        permanent_failure_rate=0.0,
        hang_rate=0.0,
        settings=options.settings_values(),
    )
    return with_bus_config(config, servicebus_config)


@dataclass(frozen=True)
class Outage:
    """remote-outage's outage as it happened: the simulator's times (Unix s) and the orders it caught in flight."""

    in_flight: int  # orders without a final status when it began (0: it never began, every order was done)
    start: float | None = None
    end: float | None = None
    ended: float | None = None  # the drill's monotonic clock when the remote was back


async def _outage(system: LocalSystem, client: ClientApp, total: int, after: float, duration: float) -> Outage:
    """Take the remote down `after` seconds from now for `duration` seconds (not if every order is done by then)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(client.all_terminal.wait(), after)
        return Outage(in_flight=0)
    in_flight = total - len(client.terminal_at)
    await simulator_json(system, "/outage", {"down": True})
    try:
        await asyncio.sleep(duration)
    finally:  # the remote comes back even when the drill is cut short
        report = await simulator_json(system, "/outage", {"down": False})
    last = report["outages"][-1]
    return Outage(in_flight, last["start"], last["end"], time.monotonic())


@dataclass
class DrillRun:
    """What a resilience drill saw, for its judge."""

    options: ResilienceOptions
    env: dict[str, str]
    work_dir: Path
    order_ids: list[str]
    client: ClientApp
    states: StateSummary
    effects: dict[str, Any]
    monitor: Monitor
    elapsed_s: float
    outage: Outage | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)  # the simulator's call log (remote-outage)
    ended_at: float = 0.0  # Unix s at the end of the run

    def got(self, order_id: str, state: OrderStatus) -> list[Any]:
        return [s for s in self.client.statuses.get(order_id, []) if s.state is state]

    def lost(self) -> int:
        """Orders without a final status, plus those whose answer was not `rejected` and have no state record."""
        unanswered = sum(1 for o in self.order_ids if o not in self.client.terminal_at)
        unrecorded = sum(
            1
            for o in self.order_ids
            if o in self.client.terminal_at and o not in self.states.state_of and not self.got(o, OrderStatus.REJECTED)
        )
        return unanswered + unrecorded

    def attempts(self, order_ids: list[str] | None = None) -> dict[str, int]:
        ids = self.order_ids if order_ids is None else order_ids
        counted = Counter(self.states.attempts[o] for o in ids if o in self.states.attempts)
        return {str(a): n for a, n in sorted(counted.items())}


def _verdict(run: DrillRun, checks: dict[str, bool], figures: dict[str, Any]) -> Verdict:
    """The verdict with the checks every drill has: none lost, no duplicate side effect, none stuck."""
    lost = run.lost()
    duplicates = int(run.effects.get("duplicates", -1))  # -1: the simulator's ledger could not be read
    stuck = run.states.counts.get(ProcessState.PENDING.value, 0) + run.states.counts.get(
        ProcessState.PROCESSING.value, 0
    )
    common = {"none lost": lost == 0, "no duplicate side effect": duplicates == 0, "none stuck": stuck == 0}
    figures = {**figures, "elapsed_s": round(run.elapsed_s, 1), "work_dir": str(run.work_dir)}
    return Verdict(run.options.drill, len(run.order_ids), lost, duplicates, stuck, {**common, **checks}, figures)


def _missing_effects(run: DrillRun) -> int:
    """Steps of Processed orders without their side effect in the simulator's ledger."""
    applied = {(e["orderId"], e["step"]) for e in run.effects.get("effects", []) if e["applied"] >= 1}
    processed = [o for o in run.order_ids if run.states.state_of.get(o) == ProcessState.PROCESSED.value]
    return sum(1 for o in processed for step in STEPS if (o, step.value) not in applied)


FAILURE_STATUSES = (OrderStatus.FAILED, OrderStatus.COMPENSATED, OrderStatus.COMPENSATION_FAILED)


def judge_retry_budget(run: DrillRun) -> Verdict:
    """Every call fails: every order ends failed (Error, or its sent steps compensated or CompensationFailed) with its
    reason and status, the calls per step (compensations included, each its own key) within budget."""
    budget = RetryBudget.from_env(run.env)
    agent_max_retries = int(
        run.env.get("AGENT_MAX_RETRIES")
        or next(s.default for s in AGENT_SETTINGS if s.name == "AGENT_MAX_RETRIES")
        or 0
    )
    by_key: dict[str, int] = run.effects.get("callsByKey", {})
    calls = sum(by_key.values())
    most = max(by_key.values(), default=0)
    n = len(run.order_ids)
    checks = {
        # Error when nothing was sent; a step sent (its record `running`) is compensated, and with every call failing
        # its compensation fails too (CompensationFailed).
        "every order ended failed": sum(run.states.counts.get(s, 0) for s in FAILED_STATES) == n,
        "every failure has its reason": run.states.errors_without_reason == 0,
        "every order got its failure status": all(any(run.got(o, s) for s in FAILURE_STATUSES) for o in run.order_ids),
        "the remote was called": calls > 0,
        "calls per order step <= RemoteCallBudgetPerStep": most <= budget.budget,
    }
    figures = {
        "budget": budget.budget,
        "arithmetic": budget.arithmetic(agent_max_retries),
        "max_calls_per_step": most,
        "mean_calls_per_step": round(calls / len(by_key), 2) if by_key else 0.0,
        "steps_called": len(by_key),
        "calls": calls,
        "calls_per_step": {str(c): k for c, k in sorted(Counter(by_key.values()).items())},
        "error_reasons": dict(run.states.error_reasons.most_common()),
        "attempts": run.attempts(),
    }
    return _verdict(run, checks, figures)


def judge_remote_outage(run: DrillRun) -> Verdict:
    """No order in Error, every order Processed once; calls while the breaker was open <= its probes."""
    outage = run.outage or Outage(in_flight=0)
    history = BreakerHistory.from_docs(run.monitor.breaker)
    episodes = history.episodes(run.ended_at)
    counted = CallsWhileOpen.count(history, run.calls, run.ended_at)
    probes = app_settings.get_int("CircuitBreakerProbes", run.env)
    allowed = probes * counted.half_open_rounds
    n = len(run.order_ids)
    last_final = max(run.client.terminal_at.values(), default=None)

    def since_outage(at: float | None) -> float | None:
        return None if at is None or outage.start is None else round(at - outage.start, 2)

    checks = {
        "the outage caught orders in flight": outage.in_flight > 0,
        "no order in Error": run.states.counts.get(ProcessState.ERROR.value, 0) == 0,
        "every order Processed": run.states.counts.get(ProcessState.PROCESSED.value, 0) == n,
        "no missing side effect": _missing_effects(run) == 0,
        "the breaker opened": bool(history.rounds),
        "the breaker closed after the outage": bool(episodes) and episodes[-1].closed_at < run.ended_at,
        "calls while open <= probes x half-open rounds": counted.while_open <= allowed,
    }
    figures = {
        "outage_s": None if outage.end is None or outage.start is None else round(outage.end - outage.start, 2),
        "in_flight_at_outage": outage.in_flight,
        "time_to_open_s": since_outage(history.rounds[0].opened_at if history.rounds else None),
        "calls_during_outage": int(run.effects.get("callsWhileDown", -1)),
        "calls_at_opening": counted.at_opening,
        "calls_while_open": counted.while_open,
        "calls_while_strictly_open": counted.strictly_open,
        "probes": probes,
        "half_open_rounds": counted.half_open_rounds,
        "allowed_calls_while_open": allowed,
        "open_rounds_s": [_round_label(r, since_outage(r.opened_at)) for r in history.rounds],
        "closed_at_s": since_outage(episodes[-1].closed_at) if episodes else None,
        "time_to_drain_s": None
        if last_final is None or outage.ended is None
        else round(max(0.0, last_final - outage.ended), 2),
        "deferrals": run.states.deferrals,
        "failure_count": {str(f): k for f, k in sorted(run.states.failure_counts.items())},
        "error": run.states.counts.get(ProcessState.ERROR.value, 0),
        "attempts": run.attempts(),
    }
    return _verdict(run, checks, figures)


def _round_label(r: OpenRound, opened_s: float | None) -> str:
    """`2.1+3.0`: opened 2.1 s after the outage began, for a 3 s cool-down (`+held`: forced open)."""
    return f"{opened_s}+{'held' if r.open_until is None else round(r.open_until - r.opened_at, 1)}"


def judge_backlog_flood(run: DrillRun) -> Verdict:
    """One answer per order: rejected with nothing written, or admitted and Processed in attempt 1; both bounds."""
    max_processing = app_settings.get_int("MaxOrdersInProcessing", run.env)
    max_pending = app_settings.get_int("MaxPendingOrders", run.env)
    rejected = [o for o in run.order_ids if run.got(o, OrderStatus.REJECTED)]
    admitted = [o for o in run.order_ids if o in run.states.state_of]
    rejections = [s for o in rejected for s in run.got(o, OrderStatus.REJECTED)]
    checks = {
        "one outcome per order": not set(rejected) & set(admitted)
        and not any(run.got(o, OrderStatus.COMPLETED) or run.got(o, OrderStatus.FAILED) for o in rejected),
        "rejected: reason `backlog full`": all(s.reason == "backlog full" for s in rejections),
        "rejected: no state record, no orders-DB record": not any(
            o in run.states.state_of or o in run.states.in_orders_db for o in rejected
        ),
        "admitted: every one Processed": all(
            run.states.state_of[o] == ProcessState.PROCESSED.value and run.got(o, OrderStatus.COMPLETED)
            for o in admitted
        ),
        "admitted: every one in attempt 1": all(run.states.attempts[o] == 1 for o in admitted),
        "Processing <= MaxOrdersInProcessing": run.monitor.max_processing <= max_processing,
        "Pending <= MaxPendingOrders": run.monitor.max_pending <= max_pending,
        "no missing side effect": _missing_effects(run) == 0,
    }
    figures = {
        "admitted": len(admitted),
        "rejected": len(rejected),
        "max_orders_in_processing": max_processing,
        "max_processing_seen": run.monitor.max_processing,
        "max_pending_orders": max_pending,
        "max_pending_seen": run.monitor.max_pending,
        "attempts": run.attempts(admitted),
        "peak_rss_mb": run.monitor.peak_rss_mb(),
        "samples": run.monitor.samples,
        "samples_over_bounds": dict(
            zip(("processing", "pending"), run.monitor.samples_over(max_processing, max_pending), strict=True)
        ),
    }
    return _verdict(run, checks, figures)


JUDGES: dict[str, Callable[[DrillRun], Verdict]] = {
    "retry-budget": judge_retry_budget,
    "remote-outage": judge_remote_outage,
    "backlog-flood": judge_backlog_flood,
}


async def run_resilience_drill(
    system: LocalSystem, options: ResilienceOptions, console: Console | None = None, transient: bool = True
) -> Verdict:
    """The drill on a started `system` (built from `resilience_config`); the caller stops the system."""
    console = console or Console(quiet=True)
    install_for(system)
    orders = make_orders(options.order_count, options.seed, system.config.reply_queue, prefix=options.drill)
    order_ids = [o.order_id for o in orders]
    env = system.env()
    outage: Outage | None = None
    calls: list[dict[str, Any]] = []
    if options.drill == "retry-budget":
        # Every step call fails; at FailureThreshold the step that was sent is compensated. Its compensation is let
        # through (a no-op: nothing was applied), so the drill measures the steps' budget without three more rounds.
        await simulator_json(
            system,
            "/script",
            {idempotency_key(o.order_id, COMPENSATION_OF[step].value): ["ok"] for o in orders for step in STEPS},
        )
    async with client_app(system) as client, Monitor(system) as monitor:
        started = time.monotonic()
        await client.submit(orders)
        switch = None
        if options.drill == "remote-outage":
            switch = asyncio.create_task(_outage(system, client, len(orders), options.outage_after, options.outage_for))
        try:
            await wait_terminal(client, len(orders), started, options.timeout, console, transient)
            if switch is not None:
                outage = await switch  # every order may be final before the outage is over
        finally:
            if switch is not None:
                switch.cancel()
        elapsed = max(client.terminal_at.values(), default=time.monotonic()) - started
        effects = await read_effects(system)
        if options.drill == "remote-outage":
            calls = (await simulator_json(system, "/calls")).get("calls", [])
    states = await read_states(env, order_ids, orders_db=options.drill == "backlog-flood")
    run = DrillRun(
        options,
        env,
        system.config.work_dir,
        order_ids,
        client,
        states,
        effects,
        monitor,
        elapsed,
        outage,
        calls,
        time.time(),
    )
    # A `rejected` order (backlog-flood) has no record, by design.
    findings = await check_system(system, order_ids, lambda o: not run.got(o, OrderStatus.REJECTED))
    return JUDGES[options.drill](run).with_invariants(findings)


__all__ = [
    "DRILL_SETTINGS",
    "JUDGES",
    "BreakerHistory",
    "CallsWhileOpen",
    "DrillRun",
    "Monitor",
    "ResilienceOptions",
    "resilience_config",
    "run_resilience_drill",
]
