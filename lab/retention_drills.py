"""Retention drill, `python -m devhost drill retention` (issue 26): two local systems, one after the other. Retention:
retentions of seconds; finished orders' documents expire and their Durable instances are purged, two orders held
Processing by a hung remote and one kept by an operator (`orderflow keep`) are untouched, the recovery index holds only
live entries, every alarm stays quiet. Alarms: short thresholds; quiet on a healthy warm-up, then each alarm's
condition forced for real (a poison message on app-orders; hung orders in every Processing slot, a burst behind
them, devhost stopped) and each must fire, then go quiet. Alarms are read from the alarm timer's document `alarms` and
from the ops summary (`orderflow summary --json`'s code), never from logs; the judge is lab/_retention_checks.py.
What it forces and checks, in full: docs/modules-lab.md."""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue
from rich.console import Console

from orderflow import alarms
from orderflow.cli.common import operations
from orderflow.messages import STEPS, SubmitOrder, idempotency_key
from orderflow.operations import Operations
from orderflow.ports import IndexEntry
from orderflow.records import SUPERVISED_STATES, ProcessState, instance_id, parse_utc
from orderflow.retention import CHECKPOINT as PURGE_CHECKPOINT
from orderflow.runtime import Tunables, submitting_apps

from ._retention_checks import (
    DEAD_LETTERS,
    DRILL,
    AlarmEvidence,
    Doc,
    Fired,
    IndexRow,
    RetentionEvidence,
    alarm_key,
    fired_from,
    firing_keys,
    judge,
    merge_findings,
)
from .demo import ClientApp, client_app, default_work_dir, make_orders
from .drill_common import (
    SETTINGS_CHOICES,
    Periodic,
    base_settings,
    drill_arguments,
    report_verdict,
    run_on_system,
    usage_error,
)
from .invariants import Findings, check_system, install_for, store_path
from .lifecycle_lab import Lab, durable_instances, until
from .system import ROOT, LocalSystem, SystemConfig, with_bus_config

DEFAULT_ORDERS = 12  # the retention phase's orders that finish (besides the kept one and the held ones)
HELD = 2  # orders held Processing by a hung remote through the retention phase
WARMUP = 3  # the alarm phase's healthy orders, one after another
HANG_S = 600.0  # a scripted hang: longer than the drill (the simulator cuts it short when it stops)
WATCH_EVERY_S = 0.25
SUMMARY_EVERY_S = 0.5  # the ops summary while waiting for an alarm (it reads every queue)
_EVERY_SECOND = "*/1 * * * * *"
# Both phases, over the chosen base and under `--set`: every timer each second and the thresholds short
# (orderflow/alarms.py: oldest-pending 1 + max(1, 1) + 3 = 5 s; dead letters: any on an app's queue). No Pending
# backlog on a healthy run: the submission's fast path claims each order at once.
ALARM_SETTINGS = {
    "StarterSchedule": _EVERY_SECOND,
    "SupervisorSchedule": _EVERY_SECOND,
    "AlarmSchedule": _EVERY_SECOND,
    "ClaimLeaseSeconds": "3",
    "RetryBackoffBaseSeconds": "1",
    "RetryBackoffMaxSeconds": "1",
    "CircuitBreakerCooldownSeconds": "1",
    "CircuitBreakerMaxCooldownSeconds": "1",
    "BacklogGrowthAlarmOrders": "2",
    "BacklogGrowthWindowSeconds": "60",
    "SenderDeadLetterAlarmDepth": "0",
    "AGENT_SHUTDOWN_GRACE_MS": "500",  # a hung call must not hold the Agent's stop
}
# The retention phase: retentions of seconds, the purge each second; steps (and the Agent's call) of 120 s, so the
# held orders stay in their first attempt, Processing, through the phase (oldest-processing: 3 + 3 x 120 + 2 s).
RETENTION_SETTINGS = {
    "FinishedOrderRetentionSeconds": "5",
    "InstanceRetentionSeconds": "5",
    "PurgeSchedule": _EVERY_SECOND,
    "StepTimeoutSeconds": "120",
    "AGENT_CALL_TIMEOUT_MS": "120000",
    "SupervisorScanMode": "index",  # only index mode writes the recovery index: its entries are checked
}
# The alarm phase: 3 s steps (oldest-processing: 3 + 3 x 3 + 1 + 1 = 14 s), three Processing slots, the index scan.
ALARM_PHASE_SETTINGS = {"StepTimeoutSeconds": "3", "MaxOrdersInProcessing": "3", "SupervisorScanMode": "index"}


@dataclass(frozen=True)
class RetentionOptions:
    orders: int | None = None  # the retention phase's finishing orders; None: DEFAULT_ORDERS
    seed: int = 1
    settings: str = "local"
    overrides: tuple[tuple[str, str], ...] = ()  # --set: app settings over both phases'
    timeout: float = 900.0  # the longest one stage waits (each stage has its own, shorter, bound)

    def __post_init__(self) -> None:
        if self.settings not in SETTINGS_CHOICES:
            raise ValueError(f"settings must be one of {SETTINGS_CHOICES}")
        if self.order_count < 1 or self.timeout <= 0:
            raise ValueError("need at least one order and a positive timeout")
        for name in ("FinishedOrderRetentionSeconds", "InstanceRetentionSeconds"):
            if int(self.retention_values()[name]) < 1:
                raise ValueError(f"the drill needs a retention: {name} must be at least 1")

    @property
    def order_count(self) -> int:
        return DEFAULT_ORDERS if self.orders is None else self.orders

    def _values(self, phase: dict[str, str]) -> dict[str, str]:
        return {**base_settings(self.settings), **ALARM_SETTINGS, **phase, **dict(self.overrides)}

    def retention_values(self) -> dict[str, str]:
        return self._values(RETENTION_SETTINGS)

    def alarm_values(self) -> dict[str, str]:
        return self._values(ALARM_PHASE_SETTINGS)

    def stage(self, bound: float) -> float:
        return min(self.timeout, bound)


def drill_config(work_dir: Path, values: dict[str, str], seed: int, servicebus_config: Path | None) -> SystemConfig:
    """A phase's system: a remote that never fails unless scripted (a scripted hang lasts HANG_S)."""
    config = SystemConfig(work_dir=work_dir.resolve(), seed=seed, hang_seconds=HANG_S, settings=values)
    return with_bus_config(config, servicebus_config)


# --- what the drill reads ----------------------------------------------------------------------------------------


class AlarmWatch(Periodic):
    """Every WATCH_EVERY_S: the alarm timer's document `alarms` (orderflow/alarms.py), its etag (one a tick) and its
    firing set, kept as a history."""

    every = WATCH_EVERY_S

    def __init__(self, lab: Lab) -> None:
        super().__init__()
        self.state = lab.stores.state
        self.history: list[tuple[float, str | None, frozenset[str]]] = []

    async def look(self) -> frozenset[str]:
        found = await self.state.get_checkpoint(alarms.DOCUMENT)
        firing = frozenset() if found is None else frozenset(str(k) for k in found[0].get("firing") or ())
        self.history.append((time.monotonic(), None if found is None else found[1], firing))
        return firing

    def firing(self, since: float) -> set[str]:
        """Every alarm key the document named since `since`."""
        return {k for at, _, f in self.history if at >= since for k in f}

    def ticks(self, since: float) -> int:
        """The timer's writes of its document seen since `since` (etag changes)."""
        seen = [etag for at, etag, _ in self.history if at >= since and etag is not None]
        return sum(1 for a, b in zip(seen, seen[1:], strict=False) if a != b)

    def first(self, key: str, since: float) -> float | None:
        return next((at for at, _, f in self.history if at >= since and key in f), None)

    @property
    def now(self) -> frozenset[str]:
        return self.history[-1][2] if self.history else frozenset()

    async def tick(self) -> frozenset[str]:
        return await self.look()


async def summary_alarms(ops: Operations) -> list[dict[str, Any]]:
    """The ops summary's alarms (what `orderflow summary --json` prints under `alarms`)."""
    return list((await ops.summary())["alarms"])


def _expiries(path: Path) -> tuple[dict[str, float], dict[str, float]]:
    """The embedded store's documents that hold an expiry time (epoch seconds), by id: state records, stored orders."""
    with sqlite3.connect(path, timeout=30) as conn:
        records = dict(conn.execute("SELECT id, expires_at FROM order_state WHERE expires_at IS NOT NULL"))
        stored = dict(conn.execute("SELECT id, expires_at FROM orders WHERE expires_at IS NOT NULL"))
    return records, stored


async def first_expiry_in(lab: Lab, keys: list[str]) -> float | None:
    """Seconds until the first of these orders' documents expires (negative: one has); None: none will."""
    records, stored = await asyncio.to_thread(_expiries, store_path(lab.env))
    found = [at for k in keys for at in (records.get(k), stored.get(k)) if at is not None]
    return round(min(found) - time.time(), 1) if found else None


async def read_docs(lab: Lab, keys: list[str]) -> dict[str, Doc]:
    """Each order's record and stored order through the ports (an expired one reads as absent) and their expiry."""
    with_expiry, stored_expiry = await asyncio.to_thread(_expiries, store_path(lab.env))
    now = datetime.now(UTC)
    docs: dict[str, Doc] = {}
    for key in keys:
        found, stored = await lab.stores.state.get(key), await lab.stores.orders.get(key)
        rec = None if found is None else found[0]
        docs[key] = Doc(
            record=rec is not None,
            stored=stored is not None,
            state=None if rec is None else rec.process_state.value,
            attempt=0 if rec is None else rec.attempt,
            ttl=None if rec is None else rec.ttl,
            notified=rec is not None and rec.notified_at is not None,
            kept=rec is not None and rec.kept is not None,
            record_expiry=key in with_expiry,
            stored_expiry=key in stored_expiry,
            deadline_in_s=None if rec is None or rec.complete_by is None else (rec.complete_by - now).total_seconds(),
        )
    return docs


def _index_rows(path: Path) -> list[tuple[str, str, str | None]]:
    with sqlite3.connect(path, timeout=30) as conn:
        rows = conn.execute("SELECT order_id, complete_by, locked_by FROM recovery_index").fetchall()
    return [(str(order_id), str(complete_by), locked_by) for order_id, complete_by, locked_by in rows]


async def read_index(lab: Lab, keys: list[str]) -> tuple[list[IndexRow], list[str]]:
    """Every entry of the recovery index, live when it matches its record (IndexEntry.matches); and the orders of
    `keys` the Supervisor watches now (supervised, with a CompleteBy)."""
    rows = []
    for order_id, complete_by, locked_by in await asyncio.to_thread(_index_rows, store_path(lab.env)):
        found = await lab.stores.state.get(order_id)
        entry = IndexEntry(order_id, parse_utc(complete_by), locked_by)
        rows.append(IndexRow(order_id, found is not None and entry.matches(found[0])))
    records = await lab.records(keys)
    supervised = [k for k, r in records.items() if r.process_state in SUPERVISED_STATES and r.complete_by is not None]
    return rows, supervised


def _instances(system: LocalSystem) -> dict[str, str | None]:
    found = durable_instances(system.config.work_dir / "devhost" / "durable.db")
    return {i: v["status"] for i, v in found.items()}


def final_statuses(client: ClientApp, keys: dict[str, str]) -> dict[str, str]:
    """orderId-keyed final statuses, by order key."""
    return {k: client.statuses[o][-1].state.value for o, k in keys.items() if o in client.terminal_at}


async def wait_until(
    lab: Lab, probe: Callable[[], Awaitable[bool]], what: str, timeout: float, every: float = 0.1
) -> float:
    """`lab.wait` polling every `every` s (a timeout is noted), returning how long it took."""
    start = time.monotonic()
    if not await until(probe, timeout, every):
        lab.timeouts.append(what)
    return round(time.monotonic() - start, 1)


# --- the retention phase -----------------------------------------------------------------------------------------


async def drive_retention(system: LocalSystem, options: RetentionOptions) -> tuple[RetentionEvidence, Findings]:
    install_for(system)
    env = system.env()
    retention_s = int(env["FinishedOrderRetentionSeconds"])
    purge_s = int(env["InstanceRetentionSeconds"])
    n = options.order_count
    orders = make_orders(n + 1 + HELD, options.seed, system.config.reply_queue, prefix="retention")
    apps = submitting_apps(env)
    key = {o.order_id: apps.order_key(system.submitter, o.order_id) for o in orders}
    finished = [key[o.order_id] for o in orders[:n]]
    kept, held = key[orders[n].order_id], [key[o.order_id] for o in orders[n + 1 :]]
    ended = [*finished, kept]
    started = time.monotonic()
    async with client_app(system) as client, operations(ROOT, env) as ops:
        lab = Lab(system, client)
        try:
            async with AlarmWatch(lab) as watch:
                await lab.script({idempotency_key(h, STEPS[0].value): ["hang"] for h in held})
                await client.submit(orders)

                async def notified(keys: list[str]) -> bool:
                    found = await lab.records(keys)
                    return all(k in found and found[k].notified_at is not None for k in keys)

                # The kept order, once finished (its status sent, its TTL set): an operator keeps it, as
                # `orderflow keep KEY --reason R` does (Operations.keep).
                await lab.wait(lambda: notified([kept]), "the kept order finished", options.stage(60))
                kept_before = (await read_docs(lab, [kept]))[kept]
                await ops.keep(kept, "retention drill", "kept by the drill: must outlive the retention")
                await lab.wait(lambda: notified(ended), "every finished order notified", options.stage(60))

                async def hung() -> bool:
                    ledger = await lab.ledger()
                    return all(ledger.first_call(h, STEPS[0].value) is not None for h in held)

                await lab.wait(hung, "the held orders' first calls hanging", options.stage(30))
                # Before anything expires: the documents, the instances and the invariants.
                at_finish = await read_docs(lab, [*ended, *held])
                instances_at_finish = await asyncio.to_thread(_instances, system)
                findings = await check_system(system, ended)
                margin = await first_expiry_in(lab, finished)
                finished_at = time.monotonic()

                async def expired() -> bool:
                    docs = await read_docs(lab, finished)
                    return not any(d.record or d.stored for d in docs.values())

                instance_of = {k: instance_id(k, max(1, d.attempt)) for k, d in at_finish.items()}

                async def purged() -> bool:
                    left = await asyncio.to_thread(_instances, system)
                    return not any(instance_of[k] in left for k in ended)

                waits = {
                    "expired_after": await wait_until(lab, expired, "finished orders expired", retention_s + 30),
                    "purged_after": await wait_until(lab, purged, "finished instances purged", purge_s + 30),
                }
                # The kept order's TTL would have run out by now: one more second past it, then the end state.
                await asyncio.sleep(max(0.0, retention_s + 1 - (time.monotonic() - finished_at)))
                after = await read_docs(lab, [*ended, *held])
                instance_of.update({h: instance_id(h, max(1, after[h].attempt)) for h in held})
                instances_after = await asyncio.to_thread(_instances, system)
                index, supervised = await read_index(lab, [*ended, *held])
                purge = await lab.stores.state.get_checkpoint(PURGE_CHECKPOINT)
                summary = firing_keys(await summary_alarms(ops))
                await watch.look()
            evidence = RetentionEvidence(
                finished=finished,
                kept=kept,
                held=held,
                retention_s=retention_s,
                statuses=final_statuses(client, {o.order_id: key[o.order_id] for o in orders}),
                kept_before=kept_before,
                at_finish=at_finish,
                after=after,
                instance_of=instance_of,
                instances_at_finish=instances_at_finish,
                instances_after=instances_after,
                index=index,
                supervised=supervised,
                firing_seen=sorted(watch.firing(started)),
                ticks=watch.ticks(started),
                summary_firing=summary,
                purge=None if purge is None else dict(purge[0]),
                timeouts=list(lab.timeouts),
                waits_s=waits,
                invariants_margin_s=margin,
                elapsed_s=time.monotonic() - started,
            )
        finally:
            await lab.aclose()
    return evidence, findings


# --- the alarm phase ---------------------------------------------------------------------------------------------


def _drain_dead_letters(connection: str, queue: str) -> int:
    """Remove every dead letter of `queue` (what an operator does once they are dealt with); how many."""
    from orderflow.adapters import bus_from_connection_string

    removed = 0
    with (
        bus_from_connection_string(connection) as bus,
        bus.get_queue_receiver(
            queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ) as receiver,
    ):
        while batch := receiver.receive_messages(max_message_count=100, max_wait_time=0.2):
            removed += len(batch)
    return removed


def thresholds(env: dict[str, str]) -> dict[str, float]:
    config = alarms.AlarmConfig.from_env(Tunables.from_env(env), env)
    return {
        "oldest_pending_s": config.pending_threshold.total_seconds(),
        "oldest_processing_s": config.processing_threshold.total_seconds(),
        "backlog_growth_orders": config.growth_orders,
        "sender_dead_letters": config.sender_dead_letters,
    }


class AlarmRun:
    """The alarm phase on a started system: the lab, the timer's document watched, the ops summary, what fired and
    how long each stage took."""

    def __init__(self, lab: Lab, watch: AlarmWatch, ops: Operations, options: RetentionOptions) -> None:
        self.lab, self.watch, self.ops, self.options = lab, watch, ops, options
        self.fired: dict[str, Fired] = {}
        self.phases: dict[str, float] = {}
        self._mark = time.monotonic()

    def phase(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = round(now - self._mark, 1)
        self._mark = now

    async def healthy(self, warm: list[SubmitOrder], started: float) -> tuple[list[str], int, list[str]]:
        """Orders one after another, never waiting; every alarm quiet over a few ticks (timer and summary)."""
        lab, client, watch = self.lab, self.lab.client, self.watch
        for order in warm:
            await client.submit([order])
            await lab.wait(partial(client.terminal_at.__contains__, order.order_id), "a warm-up order", 60)
        settled = time.monotonic()
        await lab.wait(lambda: watch.ticks(started) >= 3 and watch.ticks(settled) >= 1, "alarm ticks", 30)
        self.phase("healthy")
        return sorted(watch.firing(started)), watch.ticks(started), firing_keys(await summary_alarms(self.ops))

    async def dead_letter(self, seed: int) -> tuple[str | None, bool]:
        """A poison message on the app's inbound queue: dead-lettered, the alarm fires (the timer's document); the
        dead letter removed, it goes quiet. The poison's dead-letter reason, and whether the alarm went quiet."""
        lab, key = self.lab, f"{DEAD_LETTERS}:{self.lab.orders_queue}"
        message_id = f"{DRILL}-{seed}-poison"
        poison = ServiceBusMessage(b"retention drill: not JSON", session_id=message_id, message_id=message_id)
        forced = time.monotonic()
        await lab.send([poison])

        async def reason() -> str | None:
            return next((d.reason for d in await lab.dead_letters() if d.message_id == message_id), None)

        await lab.wait(reason, "the poison dead-lettered", self.options.stage(30))
        await lab.wait(lambda: key in self.watch.now, "the dead-letters alarm", self.options.stage(30))
        at = self.watch.first(key, forced)
        if at is not None:
            alarm = next((a for a in await summary_alarms(self.ops) if alarm_key(a) == key), {"name": DEAD_LETTERS})
            self.fired[DEAD_LETTERS] = fired_from({**alarm, "queue": lab.orders_queue}, "timer", at - forced)
        why = await reason()
        await asyncio.to_thread(_drain_dead_letters, lab.system.config.bus_connection, lab.orders_queue)
        quiet = await lab.wait(lambda: key not in self.watch.now, "dead-letters quiet", self.options.stage(30))
        self.phase("dead_letters")
        return why, bool(quiet)

    async def outage(
        self, held: list[SubmitOrder], hold: list[str], burst: list[SubmitOrder], burst_keys: list[str]
    ) -> dict[str, Doc]:
        """Every Processing slot held by a hung call, a burst behind them, then devhost stopped (the Starter and the
        Supervisor with it); the ops summary, the product's own evaluation, must see every alarm fire. Returns the
        held orders as they were once devhost had stopped."""
        lab, system = self.lab, self.lab.system
        await lab.script({idempotency_key(h, STEPS[0].value): ["hang"] for h in hold})
        await lab.client.submit(held)

        async def hanging() -> bool:
            found, ledger = await lab.records(hold), await lab.ledger()
            return all(
                h in found
                and found[h].process_state is ProcessState.PROCESSING
                and ledger.first_call(h, STEPS[0].value) is not None
                for h in hold
            )

        await lab.wait(hanging, "the held orders' calls hanging", self.options.stage(30))
        await lab.client.submit(burst)

        async def waiting() -> bool:
            found = await lab.records(burst_keys)
            return all(k in found and found[k].process_state is ProcessState.PENDING for k in burst_keys)

        await lab.wait(waiting, "the burst Pending", self.options.stage(30))
        forced = time.monotonic()
        assert system.devhost is not None
        await asyncio.to_thread(system.devhost.stop)
        at_stop = await read_docs(lab, hold)
        self.phase("held_and_burst")

        async def all_fired() -> bool:
            for alarm in await summary_alarms(self.ops):
                if alarm["firing"] and alarm["name"] not in self.fired:
                    self.fired[alarm["name"]] = fired_from(alarm, "summary", time.monotonic() - forced)
            return all(a in self.fired for a in alarms.RUNBOOK)

        bound = thresholds(lab.env)["oldest_processing_s"] + 20
        await wait_until(lab, all_fired, "every alarm fired", self.options.stage(bound), SUMMARY_EVERY_S)
        self.phase("devhost_down")
        return at_stop

    async def back(self, ids: list[str]) -> tuple[float, list[str]]:
        """devhost restarted: the Supervisor recovers the hung order, the backlog drains, every alarm goes quiet
        (a tick of the timer after the last order, and the summary). When it drained, and the summary's firing."""
        lab, watch = self.lab, self.watch
        await asyncio.to_thread(lab.system.start_devhost)
        await lab.wait(
            lambda: all(o in lab.client.terminal_at for o in ids), "every order final", self.options.stage(90)
        )
        drained = time.monotonic()
        self.phase("drain")

        async def all_quiet() -> bool:
            return watch.ticks(drained) >= 1 and not watch.now and not firing_keys(await summary_alarms(self.ops))

        await wait_until(lab, all_quiet, "every alarm quiet again", self.options.stage(30), SUMMARY_EVERY_S)
        self.phase("quiet_again")
        return drained, firing_keys(await summary_alarms(self.ops))


async def drive_alarms(system: LocalSystem, options: RetentionOptions) -> tuple[AlarmEvidence, Findings]:
    install_for(system)
    env = system.env()
    limits = thresholds(env)
    apps = submitting_apps(env)
    slots = int(env["MaxOrdersInProcessing"])  # each held by a hung order
    count = WARMUP + slots + int(limits["backlog_growth_orders"]) + 1  # and a burst one past the growth bound
    orders = make_orders(count, options.seed, system.config.reply_queue, prefix="alarms")
    key = {o.order_id: apps.order_key(system.submitter, o.order_id) for o in orders}
    warm, held, burst = orders[:WARMUP], orders[WARMUP : WARMUP + slots], orders[WARMUP + slots :]
    hold, burst_keys = [key[o.order_id] for o in held], [key[o.order_id] for o in burst]
    started = time.monotonic()
    async with client_app(system) as client, operations(ROOT, env) as ops:
        lab = Lab(system, client)
        try:
            async with AlarmWatch(lab) as watch:
                run = AlarmRun(lab, watch, ops, options)
                warmup_firing, warmup_ticks, warmup_summary = await run.healthy(warm, started)
                reason, quiet = await run.dead_letter(options.seed)
                at_stop = await run.outage(held, hold, burst, burst_keys)
                drained, final_summary = await run.back(list(key))
                records = await lab.records(list(key.values()))
                index, _ = await read_index(lab, list(key.values()))
                findings = await check_system(system, list(key.values()))
            evidence = AlarmEvidence(
                warmup_firing=warmup_firing,
                warmup_ticks=warmup_ticks,
                warmup_summary_firing=warmup_summary,
                poison_reason=reason,
                poison_queue=lab.orders_queue,
                fired=run.fired,
                dead_letters_quiet=quiet,
                warmup=[key[o.order_id] for o in warm],
                held=hold,
                burst=burst_keys,
                held_at_stop=at_stop,
                final_firing=sorted(watch.now),
                final_ticks=watch.ticks(drained),
                final_summary_firing=final_summary,
                statuses=final_statuses(client, key),
                attempts={k: r.attempt for k, r in records.items()},
                index=index,
                thresholds=limits,
                phases_s=run.phases,
                timeouts=list(lab.timeouts),
                elapsed_s=time.monotonic() - started,
            )
        finally:
            await lab.aclose()
    return evidence, findings


def run_command(args: argparse.Namespace) -> int:
    try:
        options = RetentionOptions(
            **drill_arguments(args),
        )
    except ValueError as exc:
        return usage_error(exc)
    work = Path(args.work_dir or default_work_dir("drill-"))
    console = Console(stderr=args.json)
    first = LocalSystem(
        drill_config(work / "retention", options.retention_values(), options.seed, args.servicebus_config)
    )
    retention, found = run_on_system(first, console, lambda: drive_retention(first, options))
    second = LocalSystem(drill_config(work / "alarms", options.alarm_values(), options.seed, args.servicebus_config))
    fired, found_too = run_on_system(second, console, lambda: drive_alarms(second, options))
    verdict = judge(retention, fired, merge_findings(found, found_too))
    verdict.figures["work_dir"] = str(work)
    return report_verdict(args, console, verdict)
