"""Timing drills, `python -m devhost drill NAME` with NAME one of `remote-hang`, `late-replies`, `reply-reordering`,
`clock-skew`: a remote that never answers, replies after the Scheduler stopped waiting, replies that overtake each
other, an Agent whose clock is wrong.

Each runs on the whole local system in real processes and ends with the `Verdict` plus the invariants every drill
checks (lab/invariants.py). Evidence, never logs: the state store, the simulator's ledger, the client's statuses,
devhost's durable history and a message audit installed in the embedded broker's file. Options, settings and system
(`TimingOptions`, `TIMING_SETTINGS`, `timing_config`) live in lab/_timing_options.py; this module re-exports them.
What each proves, and the audit: docs/modules-lab.md.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from orderflow.embedded.rights import AGENT
from orderflow.messages import STEPS, AgentOutcome, AlertKind, OrderStatus, idempotency_key
from orderflow.records import OrderStateRecord, ProcessState, StepStatus

from ._timing_options import (
    DEFAULT_ORDERS,
    HANG_SHARE,
    HOLD,
    LATE_MARGIN_S,
    SETTLE_S,
    TIMING_DRILLS,
    TIMING_SETTINGS,
    TimingOptions,
    lock_duration_s,
    timing_config,
)
from .agent_faults import ReplyDelay
from .demo import client_app, default_work_dir, make_orders, wait_terminal
from .drill_common import Verdict, drill_arguments, run_verdict_drill, usage_error
from .invariants import check_system, install_for
from .lifecycle_lab import Lab, Ledger, lifecycle_verdict
from .system import LocalSystem, Process, agent_args
from .timing_evidence import Instance, Reply, Trail, bus_path, install_message_audit, logged_late, read_instances

# --- what every timing drill checks -----------------------------------------------------------------------------


@dataclass
class Seen:
    """What a timing drill read at its end."""

    options: TimingOptions
    lab: Lab
    order_ids: list[str]
    records: dict[str, OrderStateRecord]
    ledger: Ledger
    trail: Trail
    instances: dict[str, Instance]
    replies_drained: bool
    replies_dead_lettered: int
    elapsed: float
    extra: dict[str, Any] = field(default_factory=dict)

    def processed(self, order_id: str) -> bool:
        rec = self.records.get(order_id)
        return rec is not None and rec.process_state is ProcessState.PROCESSED

    def completed_once(self, order_id: str) -> bool:
        completed = self.lab.statuses(order_id, OrderStatus.COMPLETED)
        rec = self.records.get(order_id)
        return len(completed) == 1 and rec is not None and completed[0].attempt == rec.attempt

    def recorded_by(self, order_id: str) -> dict[str, int]:
        """Step → the attempt that recorded it succeeded."""
        rec = self.records.get(order_id)
        return {} if rec is None else {s.name.value: s.attempt for s in rec.steps if s.status is StepStatus.SUCCEEDED}

    def taken(self, reply: Reply) -> bool:
        """Whether this reply's attempt is the one that recorded its step (a success reply that was used)."""
        return (
            reply.outcome == AgentOutcome.SUCCEEDED.value
            and self.recorded_by(reply.order_id).get(reply.step) == reply.attempt
        )

    def attempts(self) -> dict[str, int]:
        counted = Counter(r.attempt for r in self.records.values())
        return {str(a): n for a, n in sorted(counted.items())}

    def raised_to_own_instance(self) -> bool:
        """Every reply raised to an instance names that instance and its event's step."""
        return all(
            reply is not None and reply.instance_id == instance_id and name == f"AgentReply:{reply.step.value}"
            for instance_id, inst in self.instances.items()
            for name, reply in inst.raised
            if name.startswith("AgentReply:")
        )

    def common_checks(self) -> dict[str, bool]:
        ids = self.order_ids
        failed = [i for i, inst in self.instances.items() if inst.status == "Failed"]
        return {
            "every order Processed": all(self.processed(o) for o in ids),
            "each order completed once (one `completed`, from the attempt on its record)": all(
                self.completed_once(o) for o in ids
            ),
            "one effect per step of every order": all(
                self.ledger.effect_counts(o) == {s.value: 1 for s in STEPS} for o in ids
            ),
            "no orchestration Failed": not failed,
            "every reply raised to an instance is that instance's own (instanceId, step)": (
                self.raised_to_own_instance()
            ),
            "agent-replies drained, none dead-lettered": self.replies_drained and self.replies_dead_lettered == 0,
            "no PoisonMessage alert for the drill's orders": not any(
                a.kind is AlertKind.POISON_MESSAGE and a.order_id in ids for a in self.lab.alerts
            ),
        }

    def verdict(self, checks: dict[str, bool], figures: dict[str, Any]) -> Verdict:
        return lifecycle_verdict(
            self.options.drill,
            self.lab,
            self.order_ids,
            self.records,
            self.ledger,
            {**self.common_checks(), **checks},
            {
                "step_timeout_s": self.options.step_timeout_s,
                "attempts": self.attempts(),
                "replies": len(self.trail.replies),
                "late_replies": len(self.trail.late()),
                **figures,
            },
            self.elapsed,
        )


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {"p50": round(ordered[len(ordered) // 2], 2), "max": round(ordered[-1], 2)}


# --- remote-hang ------------------------------------------------------------------------------------------------


def hang_plan(order_ids: list[str], seed: int, drill: str) -> dict[str, list[str]]:
    """Order → the steps whose first call hangs (a step twice: its first two calls), seeded; at least one order."""
    two, one = HANG_SHARE[drill]
    rng = random.Random(f"{drill}:{seed}")
    plan: dict[str, list[str]] = {}
    for o in order_ids:
        roll = rng.random()
        count = 2 if roll < two else 1 if roll < one else 0
        plan[o] = sorted((rng.choice(STEPS).value for _ in range(count)), key=[s.value for s in STEPS].index)
    if not any(plan.values()):
        plan[order_ids[0]] = [STEPS[0].value]
    return plan


def hang_script(plan: dict[str, list[str]]) -> dict[str, list[str]]:
    return {idempotency_key(o, step): ["hang"] * n for o, steps in plan.items() for step, n in Counter(steps).items()}


def judge_remote_hang(seen: Seen, plan: dict[str, list[str]]) -> Verdict:
    ledger = seen.ledger
    calls_by_key: dict[str, int] = ledger.report.get("callsByKey", {})
    hangs = {o: len(steps) for o, steps in plan.items()}
    script = hang_script(plan)
    hung_calls = sum(min(calls_by_key.get(k, 0), len(v)) for k, v in script.items())
    recovery: list[float] = []  # from a hung call to the next call of its key (the new attempt's)
    to_processed: list[float] = []  # from an order's first hung call to its `completed`
    for key, hung in script.items():
        at = sorted(c["at"] for c in ledger.calls if c["key"] == key)
        recovery.extend(at[i + 1] - at[i] for i in range(min(len(hung), len(at) - 1)))
    for o, steps in plan.items():
        first = min(
            (c["at"] for c in ledger.calls if steps and c["key"] in {idempotency_key(o, s) for s in steps}),
            default=None,
        )
        done = seen.lab.status(o, OrderStatus.COMPLETED)
        if first is not None and done is not None:
            to_processed.append(done.timestamp.timestamp() - first)
    hung_orders = [o for o in seen.order_ids if hangs.get(o)]
    records = seen.records
    extra = sum(max(0, records[o].attempt - 1 - hangs.get(o, 0)) for o in seen.order_ids if o in records)
    checks = {
        "every scripted hang happened, then a call of the same key answered": all(
            calls_by_key.get(k, 0) > len(v) for k, v in script.items()
        ),
        "each hang cost its attempt: attempt > hangs, FailureCount >= hangs (recovered by the Supervisor)": all(
            o in records and records[o].attempt >= 1 + hangs[o] and records[o].failure_count >= hangs[o]
            for o in hung_orders
        ),
        "a hung step was recorded by a later attempt than the one it hung in": all(
            seen.recorded_by(o).get(step, 0) > 1 for o in hung_orders for step in plan[o]
        ),
    }
    figures = {
        "hang_s": seen.options.hang_s,
        "orders_with_a_hang": len(hung_orders),
        "hangs_planned": sum(hangs.values()),
        "hung_calls": hung_calls,
        "extra_attempts_beyond_hangs": extra,
        "recovery_s (hung call → next call of its key)": _percentiles(recovery),
        "hang_to_completed_s": _percentiles(to_processed),
        "calls": int(ledger.report.get("calls", -1)),
        "calls_per_step": {str(c): n for c, n in sorted(Counter(calls_by_key.values()).items())},
        "failure_count": dict(Counter(str(r.failure_count) for r in records.values())),
    }
    return seen.verdict(checks, figures)


# --- late-replies and reply-reordering --------------------------------------------------------------------------


def _hold(seen: Seen) -> ReplyDelay:
    values = {**seen.lab.env}
    return ReplyDelay(
        int(values.get("AGENT_REPLY_DELAY_MS") or 0),
        int(values.get("AGENT_REPLY_DELAY_MIN_MS") or 0),
        float(values.get("AGENT_REPLY_DELAY_SHARE") or 1),
        seen.options.seed,
    )


def judge_late_replies(seen: Seen) -> Verdict:
    hold = _hold(seen)
    trail = seen.trail
    held = [r for r in trail.replies if hold.seconds(r.message_id) > 0]
    late = trail.late()
    surely_late = trail.late(LATE_MARGIN_S)
    logged = seen.extra.get("logged_late", set())
    late_ids = {r.message_id for r in late}
    delivered = {(i, reply.step.value) for i, inst in seen.instances.items() for _, reply in inst.raised if reply}
    orders_with_late = {r.order_id for r in late}
    checks = {
        "replies came late (after their step's CompleteBy)": bool(surely_late),
        "every request answered": not trail.unanswered(),
        f"every reply later than CompleteBy + {LATE_MARGIN_S:g} s was ignored: its attempt recorded nothing": all(
            not seen.taken(r) for r in surely_late
        ),
        "every held reply was late, and ignored": all((r.late_by() or 0) > 0 and not seen.taken(r) for r in held),
        "each order with a late reply completed in a later attempt": all(
            seen.processed(o) and seen.records[o].attempt > min(r.attempt for r in late if r.order_id == o)
            for o in orders_with_late
        ),
        "the reply trigger logged them as late (raise_event 410/404) and completed them": bool(
            logged & {r.message_id for r in surely_late}
        )
        and seen.replies_drained,
    }
    figures = {
        "hold": f"{hold.share:g} of replies, {hold.min_ms}-{hold.max_ms} ms",
        "held_replies": len(held),
        "late_by_more_than_margin": len(surely_late),
        "late_replies_raised_to_their_instance": sum(1 for r in late if (r.instance_id, r.step) in delivered),
        "late_replies_logged_by_the_trigger": len(logged & late_ids),
        "logged_late_but_sent_before_complete_by": len(logged - late_ids),
        "late_by_s": _percentiles([r.late_by() or 0.0 for r in late]),
        "orders_with_a_late_reply": len(orders_with_late),
    }
    return seen.verdict(checks, figures)


def judge_reply_reordering(seen: Seen) -> Verdict:
    hold = _hold(seen)
    trail = seen.trail
    across_orders = trail.overtaken_across_orders()
    across_attempts = trail.overtaken_across_attempts()
    by_id = {r.message_id: r for r in trail.replies}

    def own_reply(order_id: str, step: str, attempt: int) -> bool:
        """The step was recorded by `attempt` from that attempt's own success reply: sent by the Agent (audited) and
        raised to that attempt's instance."""
        instance_id = f"{order_id}:{attempt}"
        reply = by_id.get(f"{instance_id}:{step}:reply")
        inst = seen.instances.get(instance_id)
        return (
            reply is not None
            and reply.outcome == AgentOutcome.SUCCEEDED.value
            and inst is not None
            and any(r is not None and r.instance_id == instance_id and r.step.value == step for _, r in inst.raised)
        )

    overtaken_older = {older.message_id for older, _ in across_attempts}
    checks = {
        "replies overtook replies of other orders sent before them": bool(across_orders),
        "an earlier attempt's reply arrived after a newer attempt's": bool(across_attempts),
        "every step recorded from its own attempt's reply (audited, raised to that attempt's instance)": all(
            own_reply(o, step, attempt) for o in seen.order_ids for step, attempt in seen.recorded_by(o).items()
        ),
        "no overtaken earlier-attempt reply was used": all(
            not seen.taken(by_id[m]) for m in overtaken_older if m in by_id
        ),
        "every request answered": not trail.unanswered(),
    }
    figures = {
        "hold": f"{hold.share:g} of replies, {hold.min_ms}-{hold.max_ms} ms",
        "held_replies": sum(1 for r in trail.replies if hold.seconds(r.message_id) > 0),
        "replies_overtaken_by_other_orders": len(across_orders),
        "earlier_attempt_replies_after_newer": len(overtaken_older),
        "orders_with_attempt_inversions": len({o.order_id for o, _ in across_attempts}),
        "replies_raised": sum(len(i.raised) for i in seen.instances.values()),
    }
    return seen.verdict(checks, figures)


# --- clock-skew -------------------------------------------------------------------------------------------------


def judge_clock_skew(seen: Seen, skew: float, plan: dict[str, list[str]]) -> Verdict:
    trail = seen.trail
    # Which clock stamped a reply: its completedAt minus when it was enqueued (the broker's clock) is about the
    # Agent's skew, +skew or -skew (sending takes milliseconds; on a loaded machine up to a second or so).
    ahead = [r for r in trail.replies if r.completed_at.timestamp() - r.at > 0]
    behind = [r for r in trail.replies if r.completed_at.timestamp() - r.at <= 0]

    def gave_up(replies: list[Reply]) -> int:
        return sum(1 for r in replies if r.error_code == "DeadlineExceeded")

    def offsets(replies: list[Reply]) -> dict[str, float]:
        return _percentiles([r.completed_at.timestamp() - r.at for r in replies])

    checks = {
        "both Agents answered: replies stamped by the clock ahead and by the clock behind": bool(ahead and behind),
        # The Agent ahead reads its deadline `skew` early: a request it answers later than CompleteBy - skew (+1.5 s
        # for sending on a loaded machine) reached it after that (redelivered), and it did not call the remote for
        # it. Proves the deadline checks read the skewed clock.
        "the Agent ahead called nothing after CompleteBy - skew "
        "(a later reply: DeadlineExceeded, remote not called)": all(
            r.deadline is not None
            and (
                r.at <= r.deadline - skew + 1.5
                or (r.error_code == "DeadlineExceeded" and "remote not called" in (r.error or ""))
            )
            for r in ahead
        ),
    }
    figures = {
        "clock_skew_s": f"+{skew:g} / -{skew:g}",
        "lock_duration_agent_requests_s": lock_duration_s("agent-requests", seen.lab.system.config.servicebus_config),
        "replies_by_clock": {"ahead": len(ahead), "behind": len(behind)},
        "clock_offset_seen_s": {"ahead": offsets(ahead), "behind": offsets(behind)},
        "deadline_exceeded_replies": {"ahead": gave_up(ahead), "behind": gave_up(behind)},
        "late_replies_by_clock": {
            "ahead": sum(1 for r in ahead if (r.late_by() or 0) > 0),
            "behind": sum(1 for r in behind if (r.late_by() or 0) > 0),
        },
        "late_replies_used": sum(1 for r in trail.late() if seen.taken(r)),
        "request_deliveries_lost": len(trail.redelivered),  # ended unsettled: lock lost, abandoned, closed
        "orders_with_a_hang": sum(1 for v in plan.values() if v),
        "calls": int(seen.ledger.report.get("calls", -1)),
        "failure_count": dict(Counter(str(r.failure_count) for r in seen.records.values())),
    }
    return seen.verdict(checks, figures)


# --- running ----------------------------------------------------------------------------------------------------


def _queue_state(connection: str, queue: str) -> tuple[int, int]:
    """(messages not yet settled, dead-lettered) of a queue on the embedded broker."""
    from orderflow.adapters import bus_from_connection_string

    with bus_from_connection_string(connection) as bus:
        counts = bus.broker.counts(queue)
        return int(counts.active), int(counts.dead_lettered)


def _second_agent(system: LocalSystem, skew: float) -> Process:
    """Another Agent process on the same broker, store and remote, with its own clock skew."""
    env = {**system.env(AGENT), "AGENT_CLOCK_SKEW_SECONDS": str(skew)}
    process = Process(
        "agent-2",
        [sys.executable, *agent_args("--jitter-seed", str(system.config.seed + 1))],
        env,
        system.config.work_dir / "agent-2.log",
    )
    return process.start(wait_for_url=False)


async def run_timing_drill(
    system: LocalSystem, options: TimingOptions, console: Console | None = None, transient: bool = True
) -> Verdict:
    """The drill on a started `system` (built from `timing_config`); the caller stops the system."""
    console = console or Console(quiet=True)
    env = system.env()
    requests_queue, replies_queue = env["AgentRequestsQueueName"], env["AgentRepliesQueueName"]
    install_for(system)
    audit = bus_path(system.config.bus_connection)
    install_message_audit(audit, (requests_queue, replies_queue))
    orders = make_orders(options.order_count, options.seed, system.config.reply_queue, prefix=options.drill)
    ids = [o.order_id for o in orders]
    plan: dict[str, list[str]] = {}
    if options.drill in HANG_SHARE:
        plan = hang_plan(ids, options.seed, options.drill)
    second = _second_agent(system, -options.skew_s) if options.drill == "clock-skew" else None
    try:
        async with client_app(system) as client:
            lab = Lab(system, client)
            try:
                if plan:
                    await lab.script(hang_script(plan))
                started = time.monotonic()
                await client.submit(orders)
                await wait_terminal(client, len(orders), started, options.timeout, console, transient)
                if not client.all_terminal.is_set():
                    lab.timeouts.append("every final status")
                elapsed = max(client.terminal_at.values(), default=time.monotonic()) - started
                # Held replies still on their way, then the queues drained: every request answered and every reply
                # settled by the trigger (a late one completed, not retried).
                hold_s = int(env.get("AGENT_REPLY_DELAY_MS") or 0) / 1000
                await lab.wait(
                    lambda: not Trail.read(audit, requests_queue, replies_queue).of(set(ids)).unanswered(),
                    "every request answered",
                    hold_s + SETTLE_S,
                )
                connection = system.config.bus_connection
                await lab.wait(
                    lambda: _drained(connection, (requests_queue, replies_queue)),
                    "agent-requests and agent-replies drained",
                    SETTLE_S,
                )
                active, dead = await asyncio.to_thread(_queue_state, connection, replies_queue)
                await lab.read_alerts()
                seen = Seen(
                    options,
                    lab,
                    ids,
                    await lab.records(ids),
                    await lab.ledger(),
                    Trail.read(audit, requests_queue, replies_queue).of(set(ids)),
                    read_instances(system.config.work_dir / "devhost" / "durable.db", set(ids)),
                    active == 0,
                    dead,
                    elapsed,
                    {"logged_late": logged_late(system.config.work_dir / "devhost.log")},
                )
                findings = await check_system(system, ids)
            finally:
                await lab.aclose()
    finally:
        if second is not None:
            second.stop()
    if options.drill == "remote-hang":
        verdict = judge_remote_hang(seen, plan)
    elif options.drill == "late-replies":
        verdict = judge_late_replies(seen)
    elif options.drill == "reply-reordering":
        verdict = judge_reply_reordering(seen)
    else:
        verdict = judge_clock_skew(seen, options.skew_s, plan)
    return verdict.with_invariants(findings)


async def _drained(connection: str, queues: tuple[str, ...]) -> bool:
    states = [await asyncio.to_thread(_queue_state, connection, q) for q in queues]
    return all(active == 0 for active, _ in states)


def run_command(args: argparse.Namespace) -> int:
    try:
        options = TimingOptions(
            drill=args.scenario,
            **drill_arguments(args),
            hang_seconds=args.hang_seconds,
            servicebus_config=args.servicebus_config,
        )
    except ValueError as exc:
        return usage_error(exc)
    work = Path(args.work_dir or default_work_dir("drill-"))
    system = LocalSystem(timing_config(work, options, args.servicebus_config))
    return run_verdict_drill(
        args, system, lambda console: run_timing_drill(system, options, console, transient=args.json)
    )


__all__ = [
    "DEFAULT_ORDERS",
    "HOLD",
    "TIMING_DRILLS",
    "TIMING_SETTINGS",
    "Seen",
    "TimingOptions",
    "hang_plan",
    "hang_script",
    "lock_duration_s",
    "run_command",
    "run_timing_drill",
    "timing_config",
]
