"""`python -m devhost demo`: the whole order system on this machine, with a client app that submits orders and
listens on its own reply queue; a progress bar, then a summary table (or one JSON object as the last line).

Figures: submitted, processed, error, pending, processing (state store at the end); lost = submitted orders without
a state record or without a terminal status message; duplicate_side_effects = remote side effects beyond one per
order and step (the simulator's ledger); latency = submit → terminal status received by the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
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

from orderflow.messages import TERMINAL_STATUSES, StatusMessage, SubmitOrder

from .system import ROOT, LocalSystem, SystemConfig


def make_orders(count: int, seed: int, reply_to: str) -> list[SubmitOrder]:
    rng = random.Random(seed)
    now = datetime.now(UTC)
    return [SubmitOrder(
        orderId=f"demo-{seed}-{i:05d}", replyTo=reply_to, customer={"id": f"c-{rng.randrange(1000)}", "name": "Demo"},
        items=[{"sku": f"SKU-{rng.randrange(100):03d}", "quantity": rng.randint(1, 5),
                "unitPrice": Decimal(rng.randrange(100, 10000)) / 100} for _ in range(rng.randint(1, 3))],
        currency="EUR", submittedAt=now) for i in range(count)]


@dataclass
class ClientApp:
    """The submitting application: sends orders to orders-inbound, reads statuses from its own reply queue."""

    bus: Any
    orders_queue: str
    reply_queue: str
    sent_at: dict[str, float] = field(default_factory=dict)
    statuses: dict[str, list[StatusMessage]] = field(default_factory=dict)
    terminal_at: dict[str, float] = field(default_factory=dict)

    async def submit(self, orders: list[SubmitOrder]) -> None:
        async with self.bus.get_queue_sender(self.orders_queue) as sender:
            for chunk in range(0, len(orders), 50):
                batch = orders[chunk:chunk + 50]
                now = time.monotonic()
                for o in batch:
                    self.sent_at[o.order_id] = now
                await sender.send_messages([ServiceBusMessage(o.to_json(), message_id=f"submit:{o.order_id}",
                                                              session_id=o.order_id,
                                                              content_type="application/json") for o in batch])

    async def listen(self, stop: asyncio.Event, consumers: int = 32) -> None:
        tasks = [asyncio.create_task(self._consume(stop)) for _ in range(consumers)]
        await stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _consume(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                async with self.bus.get_queue_receiver(self.reply_queue, session_id=NEXT_AVAILABLE_SESSION,
                                                       max_wait_time=5) as receiver:
                    while batch := await receiver.receive_messages(max_message_count=20, max_wait_time=0.2):
                        for msg in batch:
                            self._record(StatusMessage.model_validate_json(b"".join(msg.body)))
                            await receiver.complete_message(msg)
            except OperationTimeoutError:
                continue

    def _record(self, status: StatusMessage) -> None:
        self.statuses.setdefault(status.order_id, []).append(status)
        if status.state in TERMINAL_STATUSES and status.order_id not in self.terminal_at:
            self.terminal_at[status.order_id] = time.monotonic()


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def _read_effects(url: str) -> dict[str, Any]:
    import aiohttp  # noqa: PLC0415

    async with aiohttp.ClientSession() as s, s.get(f"{url}/effects") as r:
        return await r.json()  # type: ignore[no-any-return]


async def _state_counts(env: dict[str, str], order_ids: list[str]) -> tuple[Counter[str], int, int, Counter[str]]:
    from orderflow.store import open_stores  # noqa: PLC0415

    stores = open_stores(env)
    counts: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    missing = errors_without_reason = 0
    for oid in order_ids:
        found = await stores.state.get(oid)
        if found is None:
            missing += 1
            continue
        rec = found[0]
        counts[rec.process_state.value] += 1
        if rec.process_state.value == "Error":
            if not rec.last_error:
                errors_without_reason += 1
            reasons[_reason_kind(rec.last_error or "")] += 1
    await stores.aclose()
    return counts, missing, errors_without_reason, reasons


def _reason_kind(error: str) -> str:
    """`charge-payment: Declined: …` → `charge-payment: Declined`; `FailureThresholdReached: …` → that word."""
    parts = [p.strip() for p in error.split(":")]
    return ": ".join(parts[:2]) if parts and parts[0] in {"reserve-inventory", "charge-payment",
                                                          "arrange-shipping"} else parts[0]


async def _run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    from orderflow.bus.aio import from_connection_string  # noqa: PLC0415

    work = args.work_dir or ROOT / ".demo" / datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    config = SystemConfig(work_dir=Path(work).resolve(), seed=args.seed,
                          transient_failure_rate=args.transient_failure_rate,
                          permanent_failure_rate=args.permanent_failure_rate, hang_rate=args.hang_rate)
    system = LocalSystem(config)
    orders = make_orders(args.orders, args.seed, config.reply_queue)
    with console.status("starting devhost, the Agent and the simulator…"):
        system.start()
    env = system.env()
    bus = from_connection_string(config.bus_connection)
    client = ClientApp(bus, env.get("OrdersQueueName", "orders-inbound"), config.reply_queue)
    stop = asyncio.Event()
    started = time.monotonic()
    try:
        listener = asyncio.create_task(client.listen(stop))
        await client.submit(orders)
        with Progress(TextColumn("orders"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=args.json) as progress:
            bar = progress.add_task("orders", total=len(orders))
            while len(client.terminal_at) < len(orders) and time.monotonic() - started < args.timeout:
                progress.update(bar, completed=len(client.terminal_at))
                await asyncio.sleep(0.25)  # display refresh only; processing is event-driven
            progress.update(bar, completed=len(client.terminal_at))
        elapsed = time.monotonic() - started
        effects = await _read_effects(system.simulator.url) if system.simulator and system.simulator.url else {}
    finally:
        stop.set()
        await listener
        await bus.close()
        system.stop()
    counts, missing, errors_without_reason, reasons = await _state_counts(env, [o.order_id for o in orders])
    latencies = [(client.terminal_at[o] - client.sent_at[o]) * 1000 for o in client.terminal_at if o in client.sent_at]
    lost = sum(1 for o in orders if o.order_id not in client.terminal_at) + missing
    return {
        "submitted": len(orders), "processed": counts.get("Processed", 0), "error": counts.get("Error", 0),
        "pending": counts.get("Pending", 0), "processing": counts.get("Processing", 0), "lost": lost,
        "errors_without_reason": errors_without_reason, "error_reasons": dict(reasons.most_common()),
        "duplicate_side_effects": int(effects.get("duplicates", -1)),
        "status_messages": sum(len(v) for v in client.statuses.values()),
        "elapsed_s": round(elapsed, 3), "orders_per_s": round(len(orders) / elapsed, 2) if elapsed else 0.0,
        "latency_ms": {"p50": round(_percentile(latencies, 0.5), 1), "p99": round(_percentile(latencies, 0.99), 1)},
        "work_dir": str(config.work_dir),
    }


def _table(summary: dict[str, Any]) -> Table:
    table = Table(title="orderflow demo")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        table.add_row(key, str(value))
    return table


def run_demo(args: argparse.Namespace) -> int:
    console = Console(stderr=args.json)
    summary = asyncio.run(_run(args, console))
    console.print(_table(summary))
    if args.json:
        print(json.dumps(summary), flush=True)
    ok = summary["lost"] == 0 and summary["duplicate_side_effects"] == 0 and \
        summary["processed"] + summary["error"] == summary["submitted"]
    return 0 if ok else 1
