"""`python -m devhost demo`: the whole order system on this machine, with a client app that submits orders and
listens on its own reply queue; a progress bar, then a summary table (or one JSON object as the last line).

Figures: submitted, processed, error, pending, processing (state store at the end); lost = submitted orders without
a state record or without a terminal status message; duplicate_side_effects = remote side effects beyond one per
order and step (the simulator's ledger); latency = submit → terminal status received by the client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage
from azure.servicebus.exceptions import OperationTimeoutError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from devhost.timing_option import add_timing_argument
from orderflow.apps import inbound_queue, status_queue
from orderflow.messages import TERMINAL_STATUSES, OrderStatus, StatusMessage, SubmitOrder

from .system import ROOT, TRANSPORTS, LocalSystem, SystemConfig

# The statuses after which a submitting app expects nothing more for an order: its terminal status (completed,
# failed), or `rejected` (admission control: `backlog full`, nothing was stored; resubmit later with a new MessageId).
FINAL_STATUSES = TERMINAL_STATUSES | {OrderStatus.REJECTED}


def make_orders(count: int, seed: int, reply_to: str, prefix: str = "demo") -> list[SubmitOrder]:
    rng = random.Random(seed)
    now = datetime.now(UTC)
    return [
        SubmitOrder(
            orderId=f"{prefix}-{seed}-{i:05d}",
            replyTo=reply_to,
            customer={"id": f"c-{rng.randrange(1000)}", "name": "Demo"},
            items=[
                {
                    "sku": f"SKU-{rng.randrange(100):03d}",
                    "quantity": rng.randint(1, 5),
                    "unitPrice": Decimal(rng.randrange(100, 10000)) / 100,
                }
                for _ in range(rng.randint(1, 3))
            ],
            currency="EUR",
            submittedAt=now,
        )
        for i in range(count)
    ]


@dataclass
class ClientApp:
    """The submitting application: sends orders to its own inbound queue, reads statuses from its own reply queue."""

    bus: Any
    orders_queue: str
    reply_queue: str
    sent_at: dict[str, float] = field(default_factory=dict)
    statuses: dict[str, list[StatusMessage]] = field(default_factory=dict)
    terminal_at: dict[str, float] = field(default_factory=dict)  # first final status (FINAL_STATUSES) per order
    # Set when every submitted order has its final status (what `wait_terminal` and the drills wait on).
    all_terminal: asyncio.Event = field(default_factory=asyncio.Event)
    _expected: set[str] = field(default_factory=set)

    async def submit(self, orders: list[SubmitOrder]) -> None:
        self._expected.update(o.order_id for o in orders)
        self.all_terminal.clear()
        async with self.bus.get_queue_sender(self.orders_queue) as sender:
            for chunk in range(0, len(orders), 50):
                batch = orders[chunk : chunk + 50]
                now = time.monotonic()
                for o in batch:
                    self.sent_at[o.order_id] = now
                await sender.send_messages(
                    [
                        ServiceBusMessage(
                            o.to_json(),
                            message_id=f"submit:{o.order_id}",
                            session_id=o.order_id,
                            content_type="application/json",
                        )
                        for o in batch
                    ]
                )

    async def listen(self, stop: asyncio.Event, consumers: int = 32) -> None:
        """Read statuses from up to `consumers` sessions (orders) at once until `stop`. One acceptor takes the next
        session whenever fewer are held: every receiver waiting for a session is woken by each status sent to the
        queue, so `consumers` idle acceptors would cost that many looks per status for the one session to take."""
        sessions: set[asyncio.Task[None]] = set()
        acceptor = asyncio.create_task(self._accept(consumers, sessions))
        await stop.wait()
        for task in (acceptor, *sessions):
            task.cancel()
        await asyncio.gather(acceptor, *sessions, return_exceptions=True)

    async def _accept(self, consumers: int, sessions: set[asyncio.Task[None]]) -> None:
        slots = asyncio.Semaphore(consumers)
        while True:
            await slots.acquire()
            receiver = self.bus.get_queue_receiver(self.reply_queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5)
            try:
                await receiver.__aenter__()
            except BaseException as exc:
                slots.release()
                await receiver.close()
                if isinstance(exc, OperationTimeoutError):
                    continue
                raise
            task = asyncio.create_task(self._consume(receiver))
            sessions.add(task)
            task.add_done_callback(sessions.discard)
            task.add_done_callback(lambda _: slots.release())

    async def _consume(self, receiver: Any) -> None:
        """The statuses of one accepted session until it is idle for 0.2 s; then the session is released. With the
        real SDK no session within the wait surfaces at the first receive (the attach was answered, then detached)."""
        try:
            while batch := await receiver.receive_messages(max_message_count=20, max_wait_time=0.2):
                for msg in batch:
                    self._record(StatusMessage.model_validate_json(b"".join(msg.body)))
                    await receiver.complete_message(msg)
        except OperationTimeoutError:
            pass
        finally:
            await receiver.close()

    def _record(self, status: StatusMessage) -> None:
        self.statuses.setdefault(status.order_id, []).append(status)
        if status.state in FINAL_STATUSES and status.order_id not in self.terminal_at:
            self.terminal_at[status.order_id] = time.monotonic()
            if self._expected and self._expected.issubset(self.terminal_at):
                self.all_terminal.set()

    def lost(self, order_ids: list[str], missing_records: int) -> int:
        """Submitted orders without a final status message, plus those without a state record."""
        return sum(1 for o in order_ids if o not in self.terminal_at) + missing_records

    def latencies_ms(self) -> list[float]:
        return [(self.terminal_at[o] - self.sent_at[o]) * 1000 for o in self.terminal_at if o in self.sent_at]


@asynccontextmanager
async def client_app(system: LocalSystem, app: str | None = None) -> AsyncIterator[ClientApp]:
    """A `ClientApp` of `app` (default: the system's submitting app) on a started system's broker, as that app's
    identity, on its own inbound and status queues, listening on its status queue until the block ends."""
    from orderflow.adapters import aio_bus_from_connection_string

    app = app or system.submitter
    bus = aio_bus_from_connection_string(system.bus_connection_for(app))  # as the submitting app
    client = ClientApp(bus, inbound_queue(app), status_queue(app))
    stop = asyncio.Event()
    listener = asyncio.create_task(client.listen(stop))
    try:
        yield client
    finally:
        stop.set()
        await listener
        await bus.close()


async def wait_terminal(
    client: ClientApp, total: int, started: float, timeout: float, console: Console, transient: bool
) -> None:
    """A progress bar until every order has its terminal status or `timeout` seconds from `started`."""
    with Progress(
        TextColumn("orders"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=transient,
    ) as progress:
        bar = progress.add_task("orders", total=total)
        while not client.all_terminal.is_set() and time.monotonic() - started < timeout:
            progress.update(bar, completed=len(client.terminal_at))
            with contextlib.suppress(TimeoutError):  # wakes on the event; the timeout only refreshes the display
                await asyncio.wait_for(client.all_terminal.wait(), 0.25)
        progress.update(bar, completed=len(client.terminal_at))


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def simulator_json(system: LocalSystem, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """GET (or, with a body, POST) `path` on the system's simulator; {} if it is not running."""
    import aiohttp

    if system.simulator is None or not system.simulator.url:
        return {}
    async with (
        aiohttp.ClientSession() as s,
        s.request("POST" if body is not None else "GET", f"{system.simulator.url}{path}", json=body) as r,
    ):
        r.raise_for_status()
        return await r.json()  # type: ignore[no-any-return]


async def read_effects(system: LocalSystem) -> dict[str, Any]:
    """The simulator's ledger (`GET /effects`): effects per order and step, duplicates, calls; {} if it is down."""
    return await simulator_json(system, "/effects")


@dataclass
class StateSummary:
    """The state store's view of a set of orders at the end of a run."""

    counts: Counter[str]  # by ProcessState value
    missing: int  # orders without a state record
    errors_without_reason: int
    error_reasons: Counter[str]
    attempts: dict[str, int]  # orderId -> the record's attempt
    state_of: dict[str, str]  # orderId -> the record's ProcessState value
    deferrals: int = 0  # sum of the records' `deferrals` (attempts handed back without a FailureCount)
    failure_counts: Counter[int] = field(default_factory=Counter)  # records by their FailureCount
    in_orders_db: set[str] = field(default_factory=set)  # orderIds with an orders-DB record (when asked for)


async def read_states(env: dict[str, str], order_ids: list[str], orders_db: bool = False) -> StateSummary:
    """The state record of each order; with `orders_db`, also which of them have an orders-DB record."""
    from orderflow.adapters import open_stores

    stores = open_stores(env)
    summary = StateSummary(Counter(), 0, 0, Counter(), {}, {})
    for oid in order_ids:
        if orders_db and await stores.orders.get(oid) is not None:
            summary.in_orders_db.add(oid)
        found = await stores.state.get(oid)
        if found is None:
            summary.missing += 1
            continue
        rec = found[0]
        summary.counts[rec.process_state.value] += 1
        summary.attempts[oid] = rec.attempt
        summary.state_of[oid] = rec.process_state.value
        summary.deferrals += rec.deferrals
        summary.failure_counts[rec.failure_count] += 1
        if rec.process_state.value in FAILED_STATES:
            # A failed order: Error (nothing sent), or its effects undone (Compensated, by a failure's cause).
            reason = rec.last_error if rec.process_state.value == "Error" else rec.compensation_cause
            if rec.process_state.value == "Compensated" and (reason or "").startswith("cancelled"):
                continue
            if not reason:
                summary.errors_without_reason += 1
            summary.error_reasons[_reason_kind(reason or "")] += 1
    await stores.aclose()
    return summary


FAILED_STATES = ("Error", "Compensated", "CompensationFailed")


def _reason_kind(error: str) -> str:
    """`charge-payment: Declined: …` → `charge-payment: Declined`; `FailureThresholdReached: …` → that word."""
    parts = [p.strip() for p in error.split(":")]
    return (
        ": ".join(parts[:2])
        if parts and parts[0] in {"reserve-inventory", "charge-payment", "arrange-shipping"}
        else parts[0]
    )


def default_work_dir(prefix: str = "") -> Path:
    """A fresh folder under .demo/ (git-ignored), e.g. .demo/drill-20261130-061733-123456 for prefix "drill-"."""
    return ROOT / ".demo" / (prefix + datetime.now().strftime("%Y%m%d-%H%M%S-%f"))


async def _run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    config = SystemConfig(
        work_dir=Path(args.work_dir or default_work_dir()).resolve(),
        seed=args.seed,
        transient_failure_rate=args.transient_failure_rate,
        permanent_failure_rate=args.permanent_failure_rate,
        hang_rate=args.hang_rate,
        hosts=getattr(args, "hosts", 1),
        transport=getattr(args, "transport", "embedded"),
        timing=getattr(args, "timing", "local") or "local",
    )
    system = LocalSystem(config)
    orders = make_orders(args.orders, args.seed, config.reply_queue)
    with console.status("starting devhost, the Agent and the simulator…"):
        system.start()
    env = system.env()
    try:
        async with client_app(system) as client:
            started = time.monotonic()
            await client.submit(orders)
            await wait_terminal(client, len(orders), started, args.timeout, console, transient=args.json)
            elapsed = time.monotonic() - started
            effects = await read_effects(system)
    finally:
        system.stop()
    order_ids = [o.order_id for o in orders]
    states = await read_states(env, order_ids)
    latencies = client.latencies_ms()
    counts = states.counts
    return {
        "submitted": len(orders),
        "processed": counts.get("Processed", 0),
        "error": counts.get("Error", 0),
        "compensated": counts.get("Compensated", 0),
        "compensation_failed": counts.get("CompensationFailed", 0),
        "pending": counts.get("Pending", 0),
        "processing": counts.get("Processing", 0),
        "compensating": counts.get("CompensationInProgress", 0),
        "lost": client.lost(order_ids, states.missing),
        "errors_without_reason": states.errors_without_reason,
        "error_reasons": dict(states.error_reasons.most_common()),
        "duplicate_side_effects": int(effects.get("duplicates", -1)),
        "status_messages": sum(len(v) for v in client.statuses.values()),
        "elapsed_s": round(elapsed, 3),
        "orders_per_s": round(len(orders) / elapsed, 2) if elapsed else 0.0,
        "latency_ms": {"p50": round(_percentile(latencies, 0.5), 1), "p99": round(_percentile(latencies, 0.99), 1)},
        "transport": config.transport,
        "timing": config.timing,
        "work_dir": str(config.work_dir),
    }


def summary_table(summary: dict[str, Any], title: str) -> Table:
    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        table.add_row(key, str(value))
    return table


def add_command(sub: Any) -> None:
    """The `demo` command on the subparsers `sub`."""
    d = sub.add_parser(
        "demo",
        help="run the whole order system locally and print a summary",
        description="Start devhost with the product's function_app.py, the Agent worker, the remote "
        "service simulator and a client app that submits orders and listens on its own "
        "reply queue; print a progress bar and a summary table (or JSON).",
    )
    d.add_argument("--orders", type=int, default=50, help="number of orders to submit (default 50)")
    d.add_argument("--seed", type=int, default=1, help="seed of the simulator's fault injection (default 1)")
    d.add_argument(
        "--transient-failure-rate",
        type=float,
        default=0.1,
        help="share of remote calls that fail transiently (default 0.1)",
    )
    d.add_argument(
        "--permanent-failure-rate",
        type=float,
        default=0.01,
        help="share of remote steps that fail permanently (default 0.01)",
    )
    d.add_argument(
        "--hang-rate",
        type=float,
        default=0.0,
        help="share of remote calls that hang past the step deadline (default 0)",
    )
    d.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds (default 600)")
    d.add_argument("--work-dir", type=Path, default=None, help="state folder (default: a fresh .demo/<timestamp>)")
    d.add_argument(
        "--hosts",
        type=int,
        default=1,
        help="devhost hosts on one task hub, as a scaled-out app (default 1; docs/devhost.md)",
    )
    d.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="embedded",
        help="Service Bus path of every process: the embedded client (default), or amqp: the real azure-servicebus SDK "
        "over `python -m devhost servicebus` on the same broker file (docs/devhost.md)",
    )
    add_timing_argument(d)
    d.add_argument("--json", action="store_true", help="print one JSON object with the figures as the last line")


def run_demo(args: argparse.Namespace) -> int:
    console = Console(stderr=args.json)
    if getattr(args, "hosts", 1) < 1:
        Console(stderr=True).print("devhost demo: --hosts must be at least 1")
        return 2
    summary = asyncio.run(_run(args, console))
    console.print(summary_table(summary, "orderflow demo"))
    if args.json:
        print(json.dumps(summary), flush=True)
    ok = (
        summary["lost"] == 0
        and summary["duplicate_side_effects"] == 0
        and summary["processed"] + summary["error"] + summary["compensated"] + summary["compensation_failed"]
        == summary["submitted"]
    )
    return 0 if ok else 1
