"""Tenant drill, `python -m devhost drill tenant-isolation`: two submitting apps on one local system, one of them
hostile. `app` submits honest orders to `app-orders` and listens on `app-status`; `partner` claims app's order ids
first (same ids, other data), sends orders and cancels whose replyTo is `app-status`, cancels app's orders by their
ids (Pending, Processing, Processed), floods its own queue far past its backlog bound and, with the rights of infra/,
tries app's queues. Contract: app's orders end as they would alone, no status crosses between the apps, each hostile
message is dead-lettered with its reason and alerted, the flood is refused on partner-status only, both backlog bounds
and MaxOrdersInProcessing hold; judged by `judge` (a pure function of `TenantEvidence`) from the stores, the ledger,
the queues and the alerts, never from logs. Drill options over `--set`: `rights=on|off`, `flood=N`.
What it sends and checks, in full: docs/modules-lab.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusAuthorizationError, ServiceBusError

from orderflow import settings as app_settings
from orderflow.apps import KeyFilter, SubmittingApps
from orderflow.messages import SubmitOrder
from orderflow.operations import cancel_message
from orderflow.records import ProcessState
from orderflow.runtime import submitting_apps

from ._tenant_checks import (
    APP,
    APP_ORDERS,
    APP_STATUS,
    INVALID_REPLY_TO,
    PARTNER,
    PARTNER_ORDERS,
    PARTNER_STATUS,
    STATUS_OF,
    UNKNOWN_ORDER,
    Rec,
    TenantEvidence,
    claims_while_both_waited,
    judge,
    was_rejected,
)
from .demo import ClientApp, client_app, default_work_dir, make_orders
from .drill_common import (
    SETTINGS_CHOICES,
    Periodic,
    Verdict,
    base_settings,
    drill_arguments,
    run_verdict_drill,
    usage_error,
)
from .invariants import check_system, dead_letters, install_for, read_transitions, store_path
from .lifecycle_lab import Lab
from .system import LocalSystem, SystemConfig, with_bus_config

DEFAULT_ORDERS = 40  # app's honest orders (and as many again alone first: the baseline)
PARTNER_BOUND = 20  # MaxPendingOrdersPerApp partner=20
FLOOD_PER_BOUND = 6  # the flood: this many times partner's backlog bound, at once
CLAIM_SHARE = 8  # partner claims one in CLAIM_SHARE of app's ids first (at least one)
REDIRECTS = 3  # of each kind: partner's own orders, app's ids, cancels of app's orders; all with replyTo app-status
PROCESSED_CANCELS = 5  # cancels of app's orders once they are Processed
SAMPLE_EVERY_S = 0.2
_EVERY_SECOND = "*/1 * * * * *"
# Over the chosen base (LOCAL_DEFAULTS or the sample's) and under `--set`; each app's backlog bound is set in
# `settings_values` (MaxPendingOrdersPerApp). Six Processing slots for both apps: they contend. The Starter every
# second, as the other drills; nothing of the crash budget changes. A remote of 40 ms a call keeps each order
# Processing for a while, so cancels find orders in every state.
TENANT_SETTINGS = {
    "SubmittingApps": f"{APP},{PARTNER}",
    "LegacyOrdersApp": APP,
    "MaxOrdersInProcessing": "6",
    "StarterSchedule": _EVERY_SECOND,
}
LATENCY_MS = 40.0
DRILL_OPTIONS = ("rights", "flood")  # `--set` names that are the drill's, not app settings


@dataclass(frozen=True)
class TenantOptions:
    orders: int | None = None  # app's honest orders; None: DEFAULT_ORDERS
    seed: int = 1
    settings: str = "local"
    overrides: tuple[tuple[str, str], ...] = ()  # --set: app settings, and the drill's `rights` and `flood`
    timeout: float = 300.0  # the longest one stage waits (every final status, every dead letter)

    def __post_init__(self) -> None:
        if self.settings not in SETTINGS_CHOICES:
            raise ValueError(f"settings must be one of {SETTINGS_CHOICES}")
        if self.order_count < 2 or self.timeout <= 0:
            raise ValueError("need at least two orders and a positive timeout")
        if self._drill_options().get("rights", "on") not in ("on", "off"):
            raise ValueError("--set rights= takes on or off")
        flood = self._drill_options().get("flood")
        if flood is not None and (not flood.isdigit() or int(flood) < 1):
            raise ValueError("--set flood= takes a positive number of orders")

    def _drill_options(self) -> dict[str, str]:
        return {k: v.strip() for k, v in self.overrides if k in DRILL_OPTIONS}

    @property
    def order_count(self) -> int:
        return DEFAULT_ORDERS if self.orders is None else self.orders

    @property
    def rights(self) -> bool:
        """Every process, and both clients, act as their identities of infra/ (off: all as the namespace owner)."""
        return self._drill_options().get("rights", "on") == "on"

    @property
    def flood(self) -> int:
        given = self._drill_options().get("flood")
        return int(given) if given is not None else FLOOD_PER_BOUND * self.partner_bound

    @property
    def partner_bound(self) -> int:
        return submitting_apps(self.settings_values()).pending_bound(PARTNER)

    @property
    def claims(self) -> int:
        return max(1, self.order_count // CLAIM_SHARE)

    @property
    def app_bound(self) -> int:
        """app's backlog bound: twice its orders, so that app alone is never refused. A process's backlog gate counts
        its acceptances of the last RESERVATION_GRACE (2 s) before a refresh twice (orderflow/admission.py: an
        over-count by design), so a burst of N orders can be counted as up to 2N - 2; with a bound of 60, 8 of 40
        orders sent at once were refused at 32 Pending."""
        return 2 * self.order_count

    def settings_values(self) -> dict[str, str]:
        overrides = {k: v for k, v in self.overrides if k not in DRILL_OPTIONS}
        bounds = {"MaxPendingOrdersPerApp": f"{APP}={self.app_bound},{PARTNER}={PARTNER_BOUND}"}
        return {**base_settings(self.settings), **TENANT_SETTINGS, **bounds, **overrides}


def tenant_config(work_dir: Path, options: TenantOptions, servicebus_config: Path | None = None) -> SystemConfig:
    """The drill's system: a remote that never fails, a little slow (LATENCY_MS), the two apps' settings."""
    config = SystemConfig(
        work_dir=work_dir.resolve(),
        seed=options.seed,
        latency_ms_mean=LATENCY_MS,
        settings=options.settings_values(),
        rights=options.rights,
    )  # SystemConfig's failure and hang rates are 0 by default
    return with_bus_config(config, servicebus_config)


# --- driving the system ----------------------------------------------------------------------------------------------


def other_data(order: SubmitOrder, reply_to: str) -> SubmitOrder:
    """The same orderId with other data (another customer) and `reply_to`: partner's claim of app's id."""
    body = json.loads(order.to_json())
    body["replyTo"] = reply_to
    body["customer"] = {"id": f"partner-{body['customer']['id']}", "name": "Partner"}
    return SubmitOrder.model_validate(body)


def _redirected(order: SubmitOrder) -> ServiceBusMessage:
    """A SubmitOrder whose statuses should go to app's queue, on partner's queue."""
    body = json.loads(order.to_json())
    body["replyTo"] = APP_STATUS
    return ServiceBusMessage(
        json.dumps(body),
        message_id=f"redirect:{order.order_id}",
        session_id=order.order_id,
        content_type="application/json",
    )


class Sampler(Periodic):
    """Every SAMPLE_EVERY_S: each app's Pending (the store's count query by key) and Processing in all; the peaks."""

    def __init__(self, env: dict[str, str]) -> None:
        from orderflow.adapters import open_stores

        super().__init__()
        self.every = SAMPLE_EVERY_S
        self.apps: SubmittingApps = submitting_apps(env)
        self.stores = open_stores(env)
        self.peaks: dict[str, int] = {}

    async def sample(self) -> None:
        state = self.stores.state
        pending = {a: await state.count_in_state(ProcessState.PENDING, keys=self._keys(a)) for a in (APP, PARTNER)}
        total = await state.count_in_state(ProcessState.PROCESSING)
        for name, value in (*pending.items(), ("processing", total)):
            self.peaks[name] = max(self.peaks.get(name, 0), value)

    def _keys(self, app: str) -> KeyFilter:
        return self.apps.keys_of(app)

    async def tick(self) -> None:
        await self.sample()

    async def __aexit__(self, *exc: object) -> None:
        await super().__aexit__(*exc)
        try:
            await self.sample()
        finally:
            await self.stores.aclose()


async def _attempt(what: str, action: Any) -> str:
    """Run `action` (an awaitable): "refused" on Service Bus's unauthorized answer, else what happened."""
    try:
        await action
    except ServiceBusAuthorizationError:
        return "refused"
    except (ServiceBusError, TimeoutError) as exc:
        return f"{what}: {type(exc).__name__}"
    return f"{what}: allowed"


async def impersonate(partner: ClientApp, order: SubmitOrder) -> dict[str, str]:
    """partner, with its own identity, on app's queues: send an order of its own as app's (to `app-orders` and the
    shared queue, which only the legacy app may send to) and peek at `app-status`. Each must be refused."""
    body = json.loads(order.to_json())
    body["replyTo"] = APP_STATUS

    async def send(queue: str) -> None:
        message = ServiceBusMessage(json.dumps(body), message_id=f"impersonate:{queue}", session_id=order.order_id)
        async with partner.bus.get_queue_sender(queue) as sender:
            await sender.send_messages(message)

    async def peek() -> None:
        receiver = partner.bus.get_queue_receiver(APP_STATUS, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1)
        async with receiver:
            await receiver.peek_messages(max_message_count=10)

    return {
        f"send to {APP_ORDERS}": await _attempt("sent", send(APP_ORDERS)),
        "send to orders-inbound": await _attempt("sent", send("orders-inbound")),
        f"read {APP_STATUS}": await _attempt("read", peek()),
    }


@dataclass
class Hostile:
    """partner's hostile messages as sent: MessageId -> the dead-letter reason each must get; cancels by the state
    app's order was in."""

    expected: dict[str, str] = field(default_factory=dict)
    cancels_by_state: Counter[str] = field(default_factory=Counter)

    async def send(self, partner: ClientApp, messages: list[tuple[ServiceBusMessage, str]]) -> None:
        async with partner.bus.get_queue_sender(PARTNER_ORDERS) as sender:
            for message, reason in messages:
                self.expected[str(message.message_id)] = reason
                await sender.send_messages(message)

    async def cancel(self, partner: ClientApp, order_id: str, state: str) -> None:
        """A cancel of app's order `order_id` from partner's queue, with partner's replyTo: an unknown order there."""
        message = cancel_message(order_id, PARTNER_STATUS, f"hostile cancel while {state}")
        await self.send(partner, [(message, UNKNOWN_ORDER)])
        self.cancels_by_state[state] += 1


async def cancel_while_running(
    lab: Lab, partner: ClientApp, hostile: Hostile, targets: dict[str, str], done: asyncio.Event
) -> None:
    """Until `done`: each of app's `targets` (orderId -> its key) seen Pending or Processing gets partner's cancel
    (once per state)."""
    cancelled: dict[str, set[str]] = {o: set() for o in targets}
    while not done.is_set():
        for order_id, key in targets.items():
            found = await lab.record(key)
            state = None if found is None else found[0].process_state.value
            if (
                state in (ProcessState.PENDING.value, ProcessState.PROCESSING.value)
                and state not in cancelled[order_id]
            ):
                cancelled[order_id].add(state)
                await hostile.cancel(partner, order_id, state)
        await asyncio.sleep(0.05)


def _queue_idle(connection: str, queues: Iterable[str]) -> bool:
    """No message of `queues` left unsettled (active, scheduled or deferred) on the embedded broker."""
    from orderflow.adapters import bus_from_connection_string

    with bus_from_connection_string(connection) as bus:
        for queue in queues:
            c = bus.broker.counts(queue)
            if c.active + c.scheduled + c.deferred:
                return False
    return True


def _dead_letters(connection: str, queues: Iterable[str]) -> dict[str, dict[str, str | None]]:
    return {q: {d.message_id: d.reason for d in dead_letters(connection, q)} for q in queues}


async def drive(system: LocalSystem, options: TenantOptions) -> tuple[TenantEvidence, list[str], set[str]]:
    """The drill on a started system; the evidence, the store keys of every order and those that must have a record."""
    env = system.env()
    apps = submitting_apps(env)
    connection = system.config.bus_connection
    shared = env.get("OrdersQueueName", "orders-inbound")
    n, seed = options.order_count, options.seed
    baseline = make_orders(n, seed, APP_STATUS, prefix="tenant-baseline")
    orders = make_orders(n, seed, APP_STATUS, prefix="tenant")
    ids = [o.order_id for o in orders]
    claims = [other_data(o, PARTNER_STATUS) for o in orders[: options.claims]]
    flood = make_orders(options.flood, seed, PARTNER_STATUS, prefix="tenant-flood")
    targets = ids[options.claims :]  # app's orders partner did not claim: its cancels find nothing of its own
    own_redirects = make_orders(REDIRECTS, seed, PARTNER_STATUS, prefix="tenant-redirect")
    app_key = {o: apps.order_key(APP, o) for o in [*ids, *(o.order_id for o in baseline)]}
    hostile = Hostile()
    async with client_app(system, APP) as app, client_app(system, PARTNER) as partner:
        lab = Lab(system, app)
        try:
            # 1. app alone: the baseline of its latency.
            phases = [("start", time.monotonic())]
            await app.submit(baseline)
            await lab.wait(
                lambda: all(o.order_id in app.terminal_at for o in baseline), "the baseline", options.timeout
            )
            # 2. partner claims app's ids first: each stored (as partner's) before app sends its own.
            phases.append(("baseline", time.monotonic()))
            await partner.submit(claims)
            keys = [apps.order_key(PARTNER, c.order_id) for c in claims]

            async def claims_stored() -> bool:
                return all([await lab.record(k) is not None for k in keys])

            await lab.wait(claims_stored, "partner's claims stored", options.timeout)
            # 3. app's orders, and at once partner's flood, its redirects and its cancels.
            phases.append(("claims", time.monotonic()))
            async with Sampler(env) as sampler:
                started = time.monotonic()
                await app.submit(orders)
                done = asyncio.Event()
                on = {o: app_key[o] for o in targets}
                canceller = asyncio.create_task(cancel_while_running(lab, partner, hostile, on, done))
                try:
                    await partner.submit(flood)
                    await hostile.send(
                        partner,
                        [(_redirected(o), INVALID_REPLY_TO) for o in own_redirects]
                        + [(_redirected(o), INVALID_REPLY_TO) for o in orders[-REDIRECTS:]]
                        + [
                            (cancel_message(o, APP_STATUS, "hostile cancel, statuses to app"), INVALID_REPLY_TO)
                            for o in targets[:REDIRECTS]
                        ],
                    )
                    impersonation = await impersonate(partner, own_redirects[0]) if options.rights else None
                    await lab.wait(lambda: all(o in app.terminal_at for o in ids), "app's orders", options.timeout)
                finally:
                    done.set()
                    await asyncio.gather(canceller, return_exceptions=True)
                elapsed = max((app.terminal_at[o] for o in ids if o in app.terminal_at), default=time.monotonic())
                phases.append(("beside_partner", time.monotonic()))
                # 4. cancels of app's finished orders.
                found = await lab.records(list(on.values()))
                ended = [(o, found[k].process_state.value) for o, k in on.items() if k in found]
                for order_id, state in [(o, s) for o, s in ended if s in STATUS_OF][-PROCESSED_CANCELS:]:
                    await hostile.cancel(partner, order_id, state)
                partner_ids = [o.order_id for o in (*claims, *flood)]
                await lab.wait(
                    lambda: all(o in partner.terminal_at for o in partner_ids), "partner's orders", options.timeout
                )

                def all_dead_lettered() -> bool:
                    found = _dead_letters(connection, [PARTNER_ORDERS])[PARTNER_ORDERS]
                    return set(hostile.expected) <= set(found)

                # Handled beside partner's orders: by now, or never (WAIT_STEP_S more).
                await lab.wait(lambda: asyncio.to_thread(all_dead_lettered), "every hostile message dead-lettered")
            queues = (APP_ORDERS, PARTNER_ORDERS, shared, APP_STATUS, PARTNER_STATUS)
            # Every message handled and every status read (a stray status would be read by now).
            await lab.wait(lambda: asyncio.to_thread(_queue_idle, connection, queues), "every queue drained")

            async def alerted() -> bool:
                await lab.read_alerts()
                seen = {a.details.get("messageId") for a in lab.alerts}
                return set(hostile.expected) <= seen

            await lab.wait(alerted, "an alert for every hostile message")
            await asyncio.sleep(1.0)  # a last look for a late status
            phases.append(("settled", time.monotonic()))
            app_records = await lab.records(list(app_key.values()))
            partner_keys = {o: apps.order_key(PARTNER, o) for o in partner_ids}
            found_partner = await lab.records(list(partner_keys.values()))
            ledger = await lab.ledger()
            dead = await asyncio.to_thread(_dead_letters, connection, (APP_ORDERS, PARTNER_ORDERS, shared))
        finally:
            await lab.aclose()
    evidence = TenantEvidence(
        app_ids=ids,
        baseline_ids=[o.order_id for o in baseline],
        app_hashes={o.order_id: o.immutable_hash() for o in (*baseline, *orders)},
        app_keys=set(app_key.values()),
        claimed=[c.order_id for c in claims],
        partner_hashes={o.order_id: o.immutable_hash() for o in (*claims, *flood)},
        flood=[o.order_id for o in flood],
        app_records={o: _rec(app_records[k]) for o, k in app_key.items() if k in app_records},
        partner_records={o: _rec(found_partner[k]) for o, k in partner_keys.items() if k in found_partner},
        app_effects={o: ledger.effect_counts(k) for o, k in app_key.items()},
        app_compensations={o: ledger.compensation_counts(k) for o, k in app_key.items()},
        app_statuses=dict(app.statuses),
        partner_statuses=dict(partner.statuses),
        hostile=dict(hostile.expected),
        dead_letters=dead,
        alerts=list(lab.alerts),
        cancels_by_state=dict(hostile.cancels_by_state),
        bounds={
            APP: apps.pending_bound(APP),
            PARTNER: apps.pending_bound(PARTNER),
            "processing": app_settings.get_int("MaxOrdersInProcessing", env),
        },
        peaks=dict(sampler.peaks),
        duplicates=ledger.duplicates,
        impersonation=impersonation,
        baseline_latency_ms=[
            (app.terminal_at[o.order_id] - app.sent_at[o.order_id]) * 1000
            for o in baseline
            if o.order_id in app.terminal_at
        ],
        latency_ms=[(app.terminal_at[o] - app.sent_at[o]) * 1000 for o in ids if o in app.terminal_at],
        claims_while_both_waited=claims_while_both_waited(read_transitions(store_path(env)), apps.owner),
        elapsed_s=elapsed - started,
        phases_s={name: round(at - phases[i][1], 1) for i, (name, at) in enumerate(phases[1:])},
        timeouts=list(lab.timeouts),
    )
    every_key = [*app_key.values(), *partner_keys.values()]
    must_exist = set(app_key.values()) | {partner_keys[o] for o in partner_ids if not was_rejected(evidence, o)}
    return evidence, every_key, must_exist


def _rec(record: Any) -> Rec:
    return Rec(record.process_state.value, record.attempt, record.order_hash)


async def run_tenant_drill(system: LocalSystem, options: TenantOptions) -> Verdict:
    """The drill on a started `system` (built from `tenant_config`), then the invariants every drill checks over both
    apps' orders (a `rejected` flood order has no record, by design); the caller stops the system."""
    install_for(system)
    evidence, keys, must_exist = await drive(system, options)
    findings = await check_system(system, keys, lambda k: k in must_exist)
    return judge(evidence).with_invariants(findings)


def run_command(args: argparse.Namespace) -> int:
    try:
        options = TenantOptions(
            **drill_arguments(args),
        )
    except ValueError as exc:
        return usage_error(exc)
    work = Path(args.work_dir or default_work_dir("drill-"))
    system = LocalSystem(tenant_config(work, options, args.servicebus_config))
    return run_verdict_drill(args, system, lambda _: run_tenant_drill(system, options))
