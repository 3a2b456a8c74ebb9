"""A separate OS process for the cross-process tests (run as a script: `python worker.py MODE ...`).

Modes:
  exchange <conn> <queue> <name> <count>: send <count> messages "<name>-<i>" while receiving and completing
      from the same queue in another thread; print every received body, then "DONE".
  sessions <conn> <queue> <name> <count>: the same on a session queue (session "<name>-<i % 4>"), taking
      NEXT_AVAILABLE_SESSION; the session state holds the last index seen, so FIFO across processes is
      checked: an out-of-order message prints "VIOLATION ...".
  wait <conn> <queue> <idle seconds>: receive on an empty queue for <idle seconds> and print the CPU seconds
      that took ("IDLE_CPU x"), then print "READY" and block in one receive; print "GOT <body> <time.time()>".
  await-one <conn> <queue> <n>: <n> aio receivers each block in one receive (max_wait_time 120 s) and print
      "GOT <body>" (or "NONE"), then "DONE": one message per waiter, none stranded.
  mixed <conn> <queue> <name> <count> <consumers>: send <count> messages "<name>-<i>" from a thread and print
      "SENT"; meanwhile <consumers> aio receivers receive and complete until each takes a "stop" message; print
      every body received, then "DONE".
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time

from azure.servicebus import NEXT_AVAILABLE_SESSION
from azure.servicebus.exceptions import OperationTimeoutError

from orderflow.adapters import bus_from_connection_string
from orderflow.embedded.client import ServiceBusMessage

SESSIONS_PER_SENDER = 4


def _start_sending(client, queue: str, name: str, count: int, sessions: bool) -> threading.Thread:
    def send() -> None:
        with client.get_queue_sender(queue) as sender:
            for i in range(count):
                session = f"{name}-{i % SESSIONS_PER_SENDER}" if sessions else None
                sender.send_messages(ServiceBusMessage(f"{name}-{i}", session_id=session))

    sending = threading.Thread(target=send)
    sending.start()
    return sending


def exchange(conn: str, queue: str, name: str, count: int) -> None:
    client = bus_from_connection_string(conn)
    received: list[str] = []
    sending = _start_sending(client, queue, name, count, sessions=False)
    with client.get_queue_receiver(queue) as receiver:
        while True:
            messages = receiver.receive_messages(10, max_wait_time=1.0)
            if not messages and not sending.is_alive():
                break
            for msg in messages:
                received.append(str(msg))
                receiver.complete_message(msg)
    sending.join()
    print("\n".join(received + ["DONE"]), flush=True)


def sessions(conn: str, queue: str, name: str, count: int) -> None:
    client = bus_from_connection_string(conn)
    lines: list[str] = []
    sending = _start_sending(client, queue, name, count, sessions=True)
    while True:
        try:
            receiver = client.get_queue_receiver(
                queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1.0, retry_total=0
            )
            receiver.__enter__()
        except OperationTimeoutError:
            if not sending.is_alive():
                break
            continue
        with receiver:
            for msg in receiver.receive_messages(5, max_wait_time=0.1):
                lines.extend(_check_order(receiver, msg))
                receiver.complete_message(msg)
    sending.join()
    print("\n".join(lines + ["DONE"]), flush=True)


def _check_order(receiver, msg) -> list[str]:
    """Record the message; the session state carries the last index across receivers and processes."""
    index = int(str(msg).rsplit("-", 1)[1])
    last = int(receiver.session.get_state() or b"-1")
    receiver.session.set_state(str(index))
    expected = last + SESSIONS_PER_SENDER if last >= 0 else index % SESSIONS_PER_SENDER
    ok = index == expected
    return [str(msg)] if ok else [str(msg), f"VIOLATION {msg.session_id} got {index} after {last}"]


def wait(conn: str, queue: str, idle: float) -> None:
    client = bus_from_connection_string(conn)
    with client.get_queue_receiver(queue) as receiver:
        cpu = time.process_time()
        assert receiver.receive_messages(max_wait_time=idle) == []
        print(f"IDLE_CPU {time.process_time() - cpu:.4f}", flush=True)
        print("READY", flush=True)
        [msg] = receiver.receive_messages(max_wait_time=30)
        print(f"GOT {msg} {time.time():.6f}", flush=True)
        receiver.complete_message(msg)


async def await_one(conn: str, queue: str, count: int) -> None:
    from orderflow.adapters import aio_bus_from_connection_string as aio_client

    async with aio_client(conn) as client:

        async def one() -> str:
            async with client.get_queue_receiver(queue) as receiver:
                messages = await receiver.receive_messages(1, max_wait_time=120)
                for msg in messages:
                    await receiver.complete_message(msg)
                return f"GOT {messages[0]}" if messages else "NONE"

        for line in await asyncio.gather(*(one() for _ in range(count))):
            print(line, flush=True)
    print("DONE", flush=True)


async def mixed(conn: str, queue: str, name: str, count: int, consumers: int) -> None:
    from orderflow.adapters import aio_bus_from_connection_string as aio_client

    def send() -> None:
        with bus_from_connection_string(conn) as client, client.get_queue_sender(queue) as sender:
            for i in range(count):
                sender.send_messages(ServiceBusMessage(f"{name}-{i}"))
        print("SENT", flush=True)

    sending = threading.Thread(target=send)
    sending.start()
    received: list[str] = []
    async with aio_client(conn) as client:

        async def consume() -> None:
            async with client.get_queue_receiver(queue) as receiver:
                while True:
                    for msg in await receiver.receive_messages(1, max_wait_time=60):
                        await receiver.complete_message(msg)
                        if str(msg) == "stop":
                            return
                        received.append(str(msg))

        await asyncio.gather(*(consume() for _ in range(consumers)))
    sending.join()
    print("\n".join(received + ["DONE"]), flush=True)


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "exchange":
        exchange(args[0], args[1], args[2], int(args[3]))
    elif mode == "sessions":
        sessions(args[0], args[1], args[2], int(args[3]))
    elif mode == "wait":
        wait(args[0], args[1], float(args[2]))
    elif mode == "await-one":
        asyncio.run(await_one(args[0], args[1], int(args[2])))
    elif mode == "mixed":
        asyncio.run(mixed(args[0], args[1], args[2], int(args[3]), int(args[4])))
    else:
        raise SystemExit(f"unknown mode {mode}")
