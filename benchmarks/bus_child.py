"""Child process of the broker benchmarks: a receiver blocked in another process (wake-up latency), or a
process
holding N blocked receivers (memory, and how many of them each send wakes). Speaks one line of text per event on stdout.

    python -m benchmarks.bus_child wake-sync  <conn> <queue>
    python -m benchmarks.bus_child wake-async <conn> <queue>
    python -m benchmarks.bus_child hold <conn> <queue> <N>
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import psutil

from benchmarks.common import rss_mib


def wake_sync(conn: str, queue: str) -> None:
    """Block in `receive_messages`; print '<body> <monotonic receive time>' for each message until 'stop'."""
    from orderflow.adapters import bus_from_connection_string

    with bus_from_connection_string(conn) as client, client.get_queue_receiver(queue) as receiver:
        print("ready", flush=True)
        while True:
            for msg in receiver.receive_messages(1, max_wait_time=60):
                received = time.monotonic()
                body = b"".join(msg.body).decode()
                receiver.complete_message(msg)
                if body == "stop":
                    return
                print(f"{body} {received!r}", flush=True)


async def wake_async(conn: str, queue: str) -> None:
    """As `wake_sync`, with the aio client that devhost's triggers use."""
    from orderflow.adapters import aio_bus_from_connection_string

    async with aio_bus_from_connection_string(conn) as client, client.get_queue_receiver(queue) as receiver:
        print("ready", flush=True)
        while True:
            for msg in await receiver.receive_messages(1, max_wait_time=60):
                received = time.monotonic()
                body = b"".join(msg.body).decode()
                await receiver.complete_message(msg)
                if body == "stop":
                    return
                print(f"{body} {received!r}", flush=True)


async def hold(conn: str, queue: str, count: int) -> None:
    """Open `count` aio receivers blocked on `queue`; print RSS before/after as JSON; exit on a stdin line."""
    from orderflow.adapters import aio_bus_from_connection_string

    client = aio_bus_from_connection_string(conn)
    client.broker.queue_properties(queue)  # warm the connection and the properties cache
    baseline = rss_mib()
    received = [0]
    receivers: list[Any] = []

    async def one() -> None:
        async with client.get_queue_receiver(queue) as receiver:
            receivers.append(receiver)
            while True:
                for msg in await receiver.receive_messages(1, max_wait_time=300):
                    await receiver.complete_message(msg)
                    received[0] += 1

    tasks = [asyncio.create_task(one()) for _ in range(count)]
    await asyncio.sleep(1.0 + count / 500)  # let every receiver open and block
    proc = psutil.Process()
    report: dict[str, Any] = {
        "baseline_rss_mib": baseline,
        "rss_mib": rss_mib(),
        "threads": proc.num_threads(),
        "open_fds": proc.num_fds(),
        "cpu_s": sum(proc.cpu_times()[:2]),
    }
    print(json.dumps(report), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    cpu_after = sum(proc.cpu_times()[:2])
    wakeups = sum(r._core._waiter.wakeups for r in receivers if r._core._waiter is not None)
    print(json.dumps({"cpu_s": cpu_after, "received": received[0], "wakeups": wakeups}), flush=True)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.close()


def main(argv: list[str]) -> None:
    mode, conn, queue, *rest = argv
    if mode == "wake-sync":
        wake_sync(conn, queue)
    elif mode == "wake-async":
        asyncio.run(wake_async(conn, queue))
    elif mode == "hold":
        asyncio.run(hold(conn, queue, int(rest[0])))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    os._exit(0)  # skip interpreter teardown of the default executor's idle threads


if __name__ == "__main__":
    main(sys.argv[1:])
