"""Our side's load driver for `python -m benchmarks compare`: the demo's client app (lab/demo.py `ClientApp`: it
sends SubmitOrder messages to orders-inbound and reads the statuses on its own reply queue with 32 session
consumers) in its own process, so its CPU is measured apart. An order is terminal when its terminal status
(completed, failed, rejected) reaches the client. Speaks benchmarks/compare_proto.py on stdin/stdout.

    python -m benchmarks.compare_ours --connection "Endpoint=embedded://…" --orders-queue orders-inbound \
        --reply-queue app-status
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections import Counter
from typing import Any

from . import compare_proto as proto


class OurClient:
    def __init__(self, connection: str, orders_queue: str, reply_queue: str, timeout_s: float) -> None:
        self.connection, self.orders_queue, self.reply_queue = connection, orders_queue, reply_queue
        self.timeout_s = timeout_s
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="client-loop", daemon=True)
        self._thread.start()
        self.client: Any = self._run(self._open())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _open(self) -> Any:
        from lab.demo import ClientApp
        from orderflow.adapters import aio_bus_from_connection_string

        self.bus = aio_bus_from_connection_string(self.connection)
        client = ClientApp(self.bus, self.orders_queue, self.reply_queue)
        self._stop = asyncio.Event()
        self._listener = asyncio.create_task(client.listen(self._stop))
        return client

    async def _close(self) -> None:
        self._stop.set()
        await self._listener
        await self.bus.close()

    def close(self) -> None:
        self._run(self._close())
        self.loop.call_soon_threadsafe(self.loop.stop)

    # -- workloads ------------------------------------------------------------------------------------------------
    def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        kind = command["cmd"]
        if kind == "burst":
            return self._run(self._burst(command["prefix"], int(command["n"])))
        if kind == "sequential":
            return self._run(self._sequential(command["prefix"], int(command["n"])))
        if kind == "rate":
            return self._run(self._rate(command["prefix"], float(command["rate"]), float(command["duration_s"])))
        raise ValueError(f"unknown command {kind!r}")

    def _answer(self, orders: list[Any], submit_lag_s: float = 0.0) -> dict[str, Any]:
        ids = [o.order_id for o in orders]
        sent = {o: self.client.sent_at[o] for o in ids if o in self.client.sent_at}
        terminal = {o: self.client.terminal_at[o] for o in ids if o in self.client.terminal_at}
        from lab.demo import FINAL_STATUSES

        outcomes: Counter[str] = Counter()
        for o in terminal:
            outcomes[next(str(s.state) for s in self.client.statuses[o] if s.state in FINAL_STATUSES)] += 1
        return proto.answer_dict(proto.Answer.of(len(orders), sent, terminal, outcomes, submit_lag_s))

    async def _wait_all(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining > 0:
            try:
                await asyncio.wait_for(self.client.all_terminal.wait(), remaining)
            except TimeoutError:
                pass

    async def _burst(self, prefix: str, n: int) -> dict[str, Any]:
        orders = proto.orders_for(prefix, n, self.reply_queue)
        started = time.monotonic()
        await self.client.submit(orders)  # batches of 50 per send, as the demo does
        await self._wait_all(started + self.timeout_s)
        return self._answer(orders)

    async def _sequential(self, prefix: str, n: int) -> dict[str, Any]:
        orders = proto.orders_for(prefix, n, self.reply_queue)
        deadline = time.monotonic() + self.timeout_s
        for order in orders:
            await self.client.submit([order])
            await self._wait_all(deadline)
        return self._answer(orders)

    async def _rate(self, prefix: str, rate: float, duration_s: float) -> dict[str, Any]:
        offsets = proto.rate_schedule(rate, duration_s)
        orders = proto.orders_for(prefix, len(offsets), self.reply_queue)
        started = time.monotonic()
        lag = 0.0
        sends = []
        for offset, order in zip(offsets, orders, strict=True):
            delay = started + offset - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            lag = max(lag, time.monotonic() - started - offset)
            sends.append(asyncio.create_task(self.client.submit([order])))
        await asyncio.gather(*sends)
        await self._wait_all(time.monotonic() + self.timeout_s)
        return self._answer(orders, lag)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compare_ours", description=__doc__)
    p.add_argument("--connection", required=True)
    p.add_argument("--orders-queue", default="orders-inbound")
    p.add_argument("--reply-queue", default="app-status")
    p.add_argument("--timeout", type=float, default=600.0, help="most seconds to wait for a workload's orders")
    args = p.parse_args(argv)
    client = OurClient(args.connection, args.orders_queue, args.reply_queue, args.timeout)
    try:
        proto.serve(client.handle)
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
