"""Benchmarks of the embedded Service Bus broker (orderflow/embedded/broker): send throughput (single and batched,
sync and
aio), receive+complete throughput, session queue throughput, cross-process wake-up latency of a blocked
receiver,
and the memory of a process holding N blocked receivers and what one send costs it (how many it wakes).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage

from orderflow.adapters import bus_from_connection_string
from orderflow.embedded.broker import EmbeddedBroker

from .common import ROOT, latency_summary, python, rate, stopwatch

BODY = json.dumps({"orderId": "bench-00000", "step": "reserve", "payload": "x" * 200})


@dataclass(frozen=True)
class BusSizes:
    single_sends: int
    batched_sends: int
    batch_size: int
    receives: int
    sessions: int
    per_session: int
    wake_samples: int
    holders: tuple[int, ...]

    @classmethod
    def for_run(cls, quick: bool) -> BusSizes:
        if quick:
            return cls(200, 2000, 100, 500, 20, 10, 30, (1, 100))
        return cls(2000, 20000, 100, 5000, 200, 10, 200, (1, 100, 1000))


@contextmanager
def fresh_bus() -> Iterator[tuple[str, EmbeddedBroker]]:
    """A broker in a new temporary folder: its connection string and an `EmbeddedBroker` to declare queues."""
    with tempfile.TemporaryDirectory(prefix="bench-bus-") as tmp:
        path = Path(tmp) / "bus.db"
        broker = EmbeddedBroker(path)
        try:
            yield f"Endpoint=embedded://{path}", broker
        finally:
            broker.close()


def _messages(count: int, session_id: str | None = None) -> list[ServiceBusMessage]:
    return [ServiceBusMessage(BODY, session_id=session_id) for _ in range(count)]


def send_single(conn: str, count: int) -> dict[str, Any]:
    with (
        bus_from_connection_string(conn) as client,
        client.get_queue_sender("q") as sender,
        stopwatch() as elapsed,
    ):
        for message in _messages(count):
            sender.send_messages(message)
    return {"messages": count, "seconds": round(elapsed(), 3), "msgs_per_s": rate(count, elapsed())}


def send_batched(conn: str, count: int, batch: int) -> dict[str, Any]:
    with (
        bus_from_connection_string(conn) as client,
        client.get_queue_sender("q") as sender,
        stopwatch() as elapsed,
    ):
        for _ in range(count // batch):
            sender.send_messages(_messages(batch))
    return {
        "messages": count,
        "batch": batch,
        "seconds": round(elapsed(), 3),
        "msgs_per_s": rate(count, elapsed()),
    }


def send_single_aio(conn: str, count: int) -> dict[str, Any]:
    from orderflow.adapters import aio_bus_from_connection_string as aio_client

    async def run() -> float:
        async with aio_client(conn) as client, client.get_queue_sender("q") as sender:
            with stopwatch() as elapsed:
                for message in _messages(count):
                    await sender.send_messages(message)
            return elapsed()

    seconds = asyncio.run(run())
    return {"messages": count, "seconds": round(seconds, 3), "msgs_per_s": rate(count, seconds)}


def receive_complete(conn: str, count: int, batch: int) -> dict[str, Any]:
    """Drain `count` pre-sent messages with peek-lock, completing each; `batch` messages per receive call."""
    with bus_from_connection_string(conn) as client:
        with client.get_queue_sender("r") as sender:
            for start in range(0, count, 100):
                sender.send_messages(_messages(min(100, count - start)))
        done = 0
        with client.get_queue_receiver("r", max_wait_time=5) as receiver, stopwatch() as elapsed:
            while done < count:
                for msg in receiver.receive_messages(batch, max_wait_time=5):
                    receiver.complete_message(msg)
                    done += 1
    return {
        "messages": count,
        "receive_batch": batch,
        "seconds": round(elapsed(), 3),
        "msgs_per_s": rate(count, elapsed()),
    }


def session_queue(conn: str, sessions: int, per_session: int) -> dict[str, Any]:
    """Send `per_session` messages to each of `sessions` sessions, then drain them session by session with
    NEXT_AVAILABLE_SESSION receivers (accept session, receive, complete, release)."""
    total = sessions * per_session
    with bus_from_connection_string(conn) as client:
        with client.get_queue_sender("s") as sender, stopwatch() as send_time:
            for n in range(sessions):
                sender.send_messages(_messages(per_session, session_id=f"order-{n:05d}"))
        with stopwatch() as drain_time:
            for _ in range(sessions):
                _drain_one_session(client, per_session)
    return {
        "sessions": sessions,
        "per_session": per_session,
        "messages": total,
        "send_seconds": round(send_time(), 3),
        "send_msgs_per_s": rate(total, send_time()),
        "drain_seconds": round(drain_time(), 3),
        "drain_msgs_per_s": rate(total, drain_time()),
        "sessions_per_s": rate(sessions, drain_time()),
    }


def _drain_one_session(client: Any, expected: int) -> None:
    with client.get_queue_receiver("s", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5) as receiver:
        got = 0
        while got < expected:
            for msg in receiver.receive_messages(expected - got, max_wait_time=5):
                receiver.complete_message(msg)
                got += 1


def _child(mode: str, conn: str, queue: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [python(), "-m", "benchmarks.bus_child", mode, conn, queue, *extra],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _line(stream: IO[str] | None) -> str:
    assert stream is not None
    line = stream.readline()
    if not line:
        raise RuntimeError("benchmark child process exited early")
    return line.strip()


def wake_latency(conn: str, mode: str, samples: int, pause: float = 0.05) -> dict[str, Any]:
    """A receiver blocked in another process; for each send: send start → receive, and send return →
    receive."""
    child = _child(mode, conn, "w")
    try:
        _line(child.stdout)  # "ready"
        from_start, from_commit, send_cost = [], [], []
        with bus_from_connection_string(conn) as client, client.get_queue_sender("w") as sender:
            for n in range(samples):
                time.sleep(pause)  # pacing, so the receiver is blocked again before the next send
                t0 = time.monotonic()
                sender.send_messages(ServiceBusMessage(str(n)))
                t1 = time.monotonic()
                body, received = _line(child.stdout).split()
                assert body == str(n)
                from_start.append(float(received) - t0)
                from_commit.append(float(received) - t1)
                send_cost.append(t1 - t0)
            sender.send_messages(ServiceBusMessage("stop"))
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    return {
        "receiver": mode,
        "send_start_to_receive": latency_summary(from_start),
        "send_return_to_receive": latency_summary(from_commit),
        "send_call": latency_summary(send_cost),
    }


def hold_receivers(conn: str, count: int, sends: int = 20) -> dict[str, Any]:
    """RSS of a process holding `count` blocked aio receivers, and what one send costs with that many waiting:
    the send's call time, the holder's CPU per send, and how many receivers each send woke (pokes received; the
    sender claims one idle waiter per message, see orderflow/embedded/notify.py)."""
    child = _child("hold", conn, "h", str(count))
    try:
        report = json.loads(_line(child.stdout))
        send_cost = []
        with bus_from_connection_string(conn) as client, client.get_queue_sender("h") as sender:
            for _ in range(sends):
                time.sleep(0.1)
                with stopwatch() as elapsed:
                    sender.send_messages(ServiceBusMessage(BODY))
                send_cost.append(elapsed())
        time.sleep(0.5)
        assert child.stdin is not None
        child.stdin.write("done\n")
        child.stdin.flush()
        after = json.loads(_line(child.stdout))
        child.wait(60)
    finally:
        if child.poll() is None:
            child.kill()
    per_receiver = (report["rss_mib"] - report["baseline_rss_mib"]) / count
    return {
        "receivers": count,
        "baseline_rss_mib": report["baseline_rss_mib"],
        "rss_mib": report["rss_mib"],
        "rss_per_receiver_kib": round(per_receiver * 1024, 1),
        "threads": report["threads"],
        "open_fds": report["open_fds"],
        "send_call_with_waiters": latency_summary(send_cost),
        "holder_cpu_ms_per_send": round((after["cpu_s"] - report["cpu_s"]) / sends * 1000, 2),
        "woken_per_send": round(after["wakeups"] / sends, 2),
        "delivered": after["received"],
    }


def run(quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """All broker benchmarks; returns (figures, parameters)."""
    sizes = BusSizes.for_run(quick)
    figures: dict[str, Any] = {}
    with fresh_bus() as (conn, broker):
        for name in ("q", "r", "w", "h"):
            broker.declare_queue(name)
        broker.declare_queue("s", requires_session=True)
        figures["send_single"] = send_single(conn, sizes.single_sends)
        figures["send_single_aio"] = send_single_aio(conn, sizes.single_sends)
        figures["send_batched"] = send_batched(conn, sizes.batched_sends, sizes.batch_size)
        figures["receive_complete_1"] = receive_complete(conn, sizes.receives, 1)
        figures["receive_complete_50"] = receive_complete(conn, sizes.receives, 50)
        figures["session_queue"] = session_queue(conn, sizes.sessions, sizes.per_session)
        figures["wake_sync"] = wake_latency(conn, "wake-sync", sizes.wake_samples)
        figures["wake_async"] = wake_latency(conn, "wake-async", sizes.wake_samples)
        figures["hold"] = [hold_receivers(conn, n) for n in sizes.holders]
    return figures, {"sizes": sizes.__dict__ | {"holders": list(sizes.holders)}, "body_bytes": len(BODY)}
