"""A send wakes the one receiver that can take its message, not every waiter (orderflow.embedded.notify): counted in
wake-ups (pokes received) and looks, never in time. No message stays behind while a waiter is idle: K messages
with K idle waiters in threads and another process are all taken; a batch larger than what one transaction wakes
is passed on; a due moment (scheduled message) wakes one waiter and is handed over when that waiter leaves; a
claim that meets a leaving or cancelled waiter is answered or passed on. Session messages go to the session's
holder, or to a NEXT_AVAILABLE_SESSION acceptor when the session is free. A receiver that finds nothing writes
nothing. Timeouts here are generous bounds for "promptly" (waiters block for 120 s), not speed assertions."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusSubQueue
from azure.servicebus.exceptions import OperationTimeoutError

from orderflow.embedded import notify
from orderflow.embedded.broker import DEAD_LETTER, WAKE_BOUND, EmbeddedBroker
from orderflow.embedded.client import ServiceBusClient, ServiceBusMessage
from orderflow.embedded.client_aio import ServiceBusClient as AioServiceBusClient

REPO_ROOT = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("worker.py")
BLOCK = 120  # seconds a test waiter blocks: far beyond every bound below, so only a wake-up can end it early
PROMPT = 30  # generous bound for "promptly"


def _wait_until(condition, timeout: float = PROMPT) -> bool:
    """Poll a condition with a bounded timeout (a test synchronisation aid, not a correctness sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def _registered(broker: EmbeddedBroker, key: str) -> list[str]:
    try:
        return os.listdir(os.path.join(broker.notify_dir, key))
    except FileNotFoundError:
        return []


def _decided(broker: EmbeddedBroker, key: str) -> int:
    """Registered waiters that published their wake time (they are asleep, or about to be)."""
    limit = int(notify.UNDECIDED * 1e9)
    directory = os.path.join(broker.notify_dir, key)
    count = 0
    for name in _registered(broker, key):
        try:
            count += os.stat(os.path.join(directory, name)).st_mtime_ns < limit
        except FileNotFoundError:
            pass
    return count


def _asleep(broker: EmbeddedBroker, key: str, count: int) -> None:
    assert _wait_until(lambda: _decided(broker, key) == count), _registered(broker, key)


class Blocked(threading.Thread):
    """One receive blocked in a thread (for a session receiver: the accept, then the receive)."""

    def __init__(self, receiver: Any, done: threading.Event | None = None, wait: float = BLOCK) -> None:
        super().__init__(daemon=True)
        self.receiver, self.wait, self.done = receiver, wait, done
        self.bodies: list[str] = []
        self.session_id: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if self.receiver._core.is_session:
                self.receiver._open(self.wait)
                self.session_id = self.receiver.session.session_id
            for msg in self.receiver.receive_messages(1, max_wait_time=self.wait):
                self.bodies.append(str(msg))
                self.receiver.complete_message(msg)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            if self.done is not None:
                self.done.set()

    @property
    def wakeups(self) -> int:
        waiter = self.receiver._core._waiter
        return 0 if waiter is None else waiter.wakeups


def _finished(threads: list[Blocked]) -> list[Blocked]:
    return [t for t in threads if not t.is_alive()]


def _join(threads: list[Blocked]) -> None:
    for thread in threads:
        thread.join(PROMPT)
        assert not thread.is_alive(), "a waiter stayed idle with a message available"
        assert thread.error is None, thread.error


def _send(client: ServiceBusClient, queue: str, *bodies: str, session: str | None = None) -> None:
    with client.get_queue_sender(queue) as sender:
        for body in bodies:
            sender.send_messages(ServiceBusMessage(body, session_id=session))


def _spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


# -- one send, one wake-up --------------------------------------------------------------------------------------


def _lookers(broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The threads that call `broker.take` from now on (a look at the queue), filled as they do."""
    lookers: set[int] = set()
    take = broker.take

    def counting_take(*args: Any, **kwargs: Any) -> Any:
        lookers.add(threading.get_ident())
        return take(*args, **kwargs)

    monkeypatch.setattr(broker, "take", counting_take)
    return lookers


def test_one_send_wakes_one_of_n_idle_receivers_not_all(live):
    broker, n = live.broker, 6
    broker.declare_queue("q", lock_duration=300)  # its lock expiry falls after every waiter's deadline
    done = threading.Event()
    waiters = [Blocked(live.get_queue_receiver("q"), done) for _ in range(n)]
    dead_letters = Blocked(live.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER))
    for thread in [*waiters, dead_letters]:
        thread.start()
    _asleep(broker, notify.queue_key("q"), n)
    _asleep(broker, notify.queue_key("q", DEAD_LETTER), 1)

    _send(live, "q", "first")
    assert done.wait(PROMPT)
    [taker] = _finished(waiters)
    assert taker.bodies == ["first"]
    assert sum(t.wakeups for t in waiters) == 1  # one poke for one message, not n
    assert dead_letters.wakeups == 0  # its receivers cannot take an active message
    assert len(_registered(broker, notify.queue_key("q"))) == n - 1  # the others are still idle

    _send(live, "q", *(f"m{i}" for i in range(n - 1)))  # one each for the others
    _join(waiters)
    assert sorted(b for t in waiters for b in t.bodies) == sorted(["first", *(f"m{i}" for i in range(n - 1))])
    assert all(len(t.bodies) == 1 for t in waiters)

    _send(live, "q", "poison")
    [msg] = live.get_queue_receiver("q").receive_messages(1, max_wait_time=5)
    live.get_queue_receiver("q").dead_letter_message(msg)  # dead-lettering wakes the dead-letter receiver
    _join([dead_letters])
    assert dead_letters.bodies == ["poison"] and dead_letters.wakeups == 1


def test_an_observer_does_not_take_a_wake_up_away_from_a_receiver(live):
    broker = live.broker
    broker.declare_queue("q")
    observed: list[bool] = []
    observer = threading.Thread(target=lambda: observed.append(broker.wait_for_activity("q", BLOCK)), daemon=True)
    observer.start()
    receiver = Blocked(live.get_queue_receiver("q"))
    receiver.start()
    assert _wait_until(lambda: len(_registered(broker, notify.watch_key("q"))) == 1)
    _asleep(broker, notify.queue_key("q"), 1)
    assert len(_registered(broker, notify.queue_key("q"))) == 1  # the observer is not among those claimed
    _send(live, "q", "x")
    _join([receiver])
    assert receiver.bodies == ["x"] and receiver.wakeups == 1
    # The observer was woken too, but may have looked after the receiver took "x" (then it waits on, correctly:
    # nothing is left to take). A message nobody takes ends its wait.
    _send(live, "q", "y")
    observer.join(PROMPT)
    assert observed == [True]


# -- no message stays behind while a waiter is idle -------------------------------------------------------------


def test_k_sends_with_k_idle_waiters_in_threads_and_another_process_are_all_taken(live):
    broker = live.broker
    broker.declare_queue("q", lock_duration=300)
    here = [Blocked(live.get_queue_receiver("q")) for _ in range(3)]
    for thread in here:
        thread.start()
    other = _spawn("await-one", f"Endpoint=embedded://{broker.path}", "q", "3")  # aio receivers
    try:
        _asleep(broker, notify.queue_key("q"), 6)
        bodies = [f"m{i}" for i in range(6)]
        for body in bodies:
            _send(live, "q", body)  # one transaction each: each claims one waiter
        _join(here)
        out, err = other.communicate(timeout=PROMPT)
        assert other.returncode == 0, err
    finally:
        if other.poll() is None:
            other.kill()
    got_there = [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("GOT ")]
    assert len(got_there) == 3, out  # every waiter there got one: none ran out its 120 s with nothing
    assert sorted([b for t in here for b in t.bodies] + got_there) == bodies


def test_a_batch_larger_than_one_transaction_wakes_is_passed_on(live):
    broker, n = live.broker, WAKE_BOUND + 3
    broker.declare_queue("q", lock_duration=300)
    waiters = [Blocked(live.get_queue_receiver("q")) for _ in range(n)]
    for thread in waiters:
        thread.start()
    _asleep(broker, notify.queue_key("q"), n)
    with live.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(n)])  # wakes WAKE_BOUND at once
    _join(waiters)  # the rest were woken by waiters that took one and saw more ready
    assert sorted(b for t in waiters for b in t.bodies) == sorted(f"m{i}" for i in range(n))


def test_no_lost_wake_up_with_many_senders_and_receivers_across_processes(live):
    broker = live.broker
    broker.declare_queue("q")
    per_sender, senders, receivers, remote_receivers = 30, 3, 3, 2
    received: list[str] = []
    guard = threading.Lock()

    def consume() -> None:
        receiver = live.get_queue_receiver("q")
        while True:
            for msg in receiver.receive_messages(1, max_wait_time=60):
                receiver.complete_message(msg)
                if str(msg) == "stop":
                    return
                with guard:
                    received.append(str(msg))

    def produce(name: str) -> None:
        with live.get_queue_sender("q") as sender:
            for i in range(per_sender):
                sender.send_messages(ServiceBusMessage(f"{name}-{i}"))

    other = _spawn("mixed", f"Endpoint=embedded://{broker.path}", "q", "remote", str(per_sender), str(remote_receivers))
    try:
        consumers = [threading.Thread(target=consume, daemon=True) for _ in range(receivers)]
        producers = [threading.Thread(target=produce, args=(f"s{n}",), daemon=True) for n in range(senders)]
        for thread in consumers + producers:
            thread.start()
        for thread in producers:
            thread.join(PROMPT)
        assert other.stdout is not None and other.stdout.readline().strip() == "SENT"

        def drained() -> bool:
            counts = broker.counts("q")
            return counts.active == 0 and counts.locked == 0

        assert _wait_until(drained), broker.counts("q")  # every message taken and completed, none left idle
        _send(live, "q", *["stop"] * (receivers + remote_receivers))
        for thread in consumers:
            thread.join(PROMPT)
            assert not thread.is_alive()
        out, err = other.communicate(timeout=PROMPT)
        assert other.returncode == 0, err
    finally:
        if other.poll() is None:
            other.kill()
    remote = [line for line in out.splitlines() if line != "DONE"]
    expected = {f"s{n}-{i}" for n in range(senders) for i in range(per_sender)}
    expected |= {f"remote-{i}" for i in range(per_sender)}
    everything = Counter(received + remote)
    assert set(everything) == expected and max(everything.values()) == 1  # each exactly once
    assert broker.counts("q").total == 0


# -- sessions: the holder, or an acceptor while the session is free ----------------------------------------------


def test_a_session_message_wakes_its_holder_or_one_acceptor_never_a_waiter_that_cannot_take_it(live):
    broker = live.broker
    broker.declare_queue("s", requires_session=True, lock_duration=300)
    holders = {}
    for session in ("A", "B"):
        receiver = live.get_queue_receiver("s", session_id=session)
        receiver._open()  # holds the session (empty): its receive waits for that session's messages only
        holders[session] = Blocked(receiver)
    done = threading.Event()
    acceptors = [Blocked(live.get_queue_receiver("s", session_id=NEXT_AVAILABLE_SESSION), done) for _ in range(3)]
    for thread in [*holders.values(), *acceptors]:
        thread.start()
    for session, thread in holders.items():
        _asleep(broker, notify.holder_key("s", session, thread.receiver._core.lock.token), 1)
    _asleep(broker, notify.queue_key("s"), 3)

    _send(live, "s", "a1", session="A")  # A is locked: only its holder can take it
    _join([holders["A"]])
    assert holders["A"].bodies == ["a1"] and holders["A"].wakeups == 1
    assert len(_registered(broker, notify.queue_key("s"))) == 3  # no acceptor was claimed
    assert sum(t.wakeups for t in acceptors) == 0 and holders["B"].wakeups == 0

    _send(live, "s", "c1", session="C")  # C is free: one acceptor
    assert done.wait(PROMPT)
    [taker] = _finished(acceptors)
    assert (taker.session_id, taker.bodies) == ("C", ["c1"])
    assert len(_registered(broker, notify.queue_key("s"))) == 2  # one acceptor claimed, not all
    assert sum(t.wakeups for t in acceptors) == 1 and holders["B"].wakeups == 0

    _send(live, "s", "b1", session="B")
    for session in ("D", "E"):
        _send(live, "s", f"{session}1", session=session)
    _join([holders["B"], *acceptors])
    assert holders["B"].bodies == ["b1"]
    assert sorted((t.session_id, *t.bodies) for t in acceptors) == [("C", "c1"), ("D", "D1"), ("E", "E1")]
    for thread in [*holders.values(), *acceptors]:
        thread.receiver.close()


def test_releasing_a_session_wakes_an_acceptor_for_its_waiting_messages(live):
    broker = live.broker
    broker.declare_queue("s", requires_session=True, lock_duration=300)
    holder = live.get_queue_receiver("s", session_id="A")
    holder._open()
    _send(live, "s", "a1", session="A")  # ready, but A is locked: the acceptor cannot take it yet
    acceptor = Blocked(live.get_queue_receiver("s", session_id=NEXT_AVAILABLE_SESSION))
    acceptor.start()
    _asleep(broker, notify.queue_key("s"), 1)
    assert acceptor.wakeups == 0
    holder.close()  # A is free: its message goes to an acceptor
    _join([acceptor])
    assert (acceptor.session_id, acceptor.bodies) == ("A", ["a1"])
    acceptor.receiver.close()


# -- time: due moments wake one waiter, and are handed over ------------------------------------------------------


def test_a_scheduled_message_falling_due_wakes_one_of_n_waiters(live, monkeypatch):
    broker, n = live.broker, 5
    broker.declare_queue("q", lock_duration=300)
    done = threading.Event()
    waiters = [Blocked(live.get_queue_receiver("q"), done) for _ in range(n)]
    for thread in waiters:
        thread.start()
    _asleep(broker, notify.queue_key("q"), n)
    lookers = _lookers(broker, monkeypatch)
    live.get_queue_sender("q").schedule_messages(ServiceBusMessage("later"), broker.clock() + timedelta(seconds=0.3))
    assert done.wait(PROMPT)
    [taker] = _finished(waiters)
    assert taker.bodies == ["later"]
    assert lookers == {taker.ident}  # the others slept through: not one look each at the due moment
    _send(live, "q", *(f"m{i}" for i in range(n - 1)))
    _join(waiters)


def test_waiters_that_fall_asleep_after_a_lock_was_taken_leave_its_expiry_to_one_of_them(live, monkeypatch):
    broker, n = live.broker, 5
    broker.declare_queue("q", lock_duration=3)
    _send(live, "q", "x")
    [held] = live.get_queue_receiver("q").receive_messages(1, max_wait_time=5)  # never settled: redelivered at expiry
    done = threading.Event()
    waiters = []
    for count in range(1, n + 1):  # one by one: each sees that an earlier one wakes at the expiry
        waiters.append(Blocked(live.get_queue_receiver("q"), done))
        waiters[-1].start()
        _asleep(broker, notify.queue_key("q"), count)
    lookers = _lookers(broker, monkeypatch)
    assert done.wait(PROMPT)
    [taker] = _finished(waiters)
    assert taker.bodies == ["x"]
    # The one that wakes at the expiry takes the message; then its own lock's expiry needs a waiter that knows
    # it: one more is woken to keep it. Not one look per waiter.
    assert taker.ident in lookers and len(lookers) <= 2, len(lookers)
    _send(live, "q", *(f"m{i}" for i in range(n - 1)))
    _join(waiters)


def test_an_expired_lock_taken_by_the_receive_that_released_it_wakes_nobody(client, queue, clock, monkeypatch):
    q = queue(lock_duration=60)
    _send(client, q, "x")
    receiver = client.get_queue_receiver(q)
    [held] = receiver.receive_messages(1, max_wait_time=5)
    waiter = Blocked(client.get_queue_receiver(q))  # idle; it keeps the lock's expiry (60 s on the fake clock)
    waiter.start()
    _asleep(client.broker, notify.queue_key(q), 1)
    clock.advance(61)
    claims: list[int] = []
    claim = notify.claim
    monkeypatch.setattr(notify, "claim", lambda *args, **kwargs: claims.append(claim(*args, **kwargs)) or claims[-1])
    [again] = receiver.receive_messages(1, max_wait_time=5)  # releases the expired lock and takes the message
    monkeypatch.setattr(notify, "claim", claim)
    assert again.sequence_number == held.sequence_number and again.delivery_count == 1
    assert sum(claims) == 0  # no waiter was claimed: nothing was left for it
    _send(client, q, "release")
    _join([waiter])
    assert waiter.bodies == ["release"] and waiter.wakeups == 1


def test_the_waiter_keeping_a_due_moment_hands_it_over_when_it_leaves(live):
    broker = live.broker
    broker.declare_queue("q", lock_duration=300)
    key = notify.queue_key("q")
    short = Blocked(live.get_queue_receiver("q"), wait=2.0)  # will leave before the message falls due
    short.start()
    _asleep(broker, key, 1)
    live.get_queue_sender("q").schedule_messages(ServiceBusMessage("later"), broker.clock() + timedelta(seconds=4))
    long = Blocked(live.get_queue_receiver("q"))
    long.start()
    _asleep(broker, key, 2)  # the long waiter saw the short one wake earlier, so it sleeps to its deadline
    _join([short, long])  # when the short one leaves it hands the due moment over to the long one
    assert short.bodies == [] and long.bodies == ["later"]


# -- claims meeting waiters on their way out ---------------------------------------------------------------------


def test_a_claim_that_races_with_a_timeout_is_answered_by_a_final_look(live):
    live.broker.declare_queue("q")
    core = live.get_queue_receiver("q")._core
    epoch = core.begin_wait()
    core.waiter.ensure_registered(core._key, epoch)
    looks: list[int] = []

    def attempt() -> list[str]:
        looks.append(1)
        if len(looks) == 1:  # a send commits and claims us right after this look read, as the deadline passes
            assert notify.claim(live.broker.notify_dir, core._key) == 1
            return []
        return ["the claimed message"]

    result, sleep = core.look(attempt, time.monotonic() - 1, epoch)
    assert (result, sleep) == (["the claimed message"], None)
    core.end_wait(epoch)
    core.close_waiter()


def test_a_send_between_the_first_look_and_registering_is_not_missed(live):
    live.broker.declare_queue("q")
    receiver = live.get_queue_receiver("q")
    core = receiver._core
    looks = []

    def attempt() -> list[Any]:
        if not looks:  # a send commits right after the first look, before the receiver is registered
            looks.append(_send(live, "q", "in between"))
            return []
        return core.try_receive(1)

    epoch = core.begin_wait()
    result, sleep = core.look(attempt, time.monotonic() + BLOCK, epoch)
    assert sleep is None and [str(m) for m in result] == ["in between"]  # it looked again once registered
    core.end_wait(epoch)
    receiver.close()


def test_a_receive_cut_short_passes_its_claim_on_to_another_waiter(live):
    live.broker.declare_queue("q")
    core = live.get_queue_receiver("q")._core
    epoch = core.begin_wait()
    core.waiter.ensure_registered(core._key, epoch)
    notify.claim(live.broker.notify_dir, core._key)  # claimed, and then the receive is cancelled
    with notify.Waiter(live.broker.notify_dir) as other:
        other.ensure_registered(core._key, other.start())
        core.end_wait(epoch)  # no database on this path: the claim goes on blindly
        assert other.wait(5) is True
    core.close_waiter()


async def test_an_aio_receive_cancelled_right_after_its_claim_passes_the_claim_on(live, monkeypatch):
    broker = live.broker
    broker.declare_queue("q")
    key = notify.queue_key("q")

    async def asleep(count: int) -> None:
        for _ in range(PROMPT * 100):
            if _decided(broker, key) == count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(_registered(broker, key))

    async with AioServiceBusClient(broker) as client:
        first, second = client.get_queue_receiver("q"), client.get_queue_receiver("q")
        cancelled = asyncio.create_task(first.receive_messages(max_wait_time=BLOCK))
        await asleep(1)
        other = asyncio.create_task(second.receive_messages(max_wait_time=BLOCK))
        await asleep(2)
        with monkeypatch.context() as patch:
            patch.setattr(notify, "claim", lambda *args, **kwargs: 0)
            _send(live, "q", "x")  # committed; the claim below goes to `first`, whatever the listing order
        ident = first._core.waiter.ident
        home = os.path.join(broker.notify_dir, "home", ident)
        os.rename(os.path.join(broker.notify_dir, key, ident), home)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as poker:
            poker.sendto(b"!", home)
        cancelled.cancel()  # before it runs again: it cannot look, so it hands the claim over
        await asyncio.gather(cancelled, return_exceptions=True)
        [msg] = await asyncio.wait_for(other, PROMPT)
        assert str(msg) == "x"
        await second.complete_message(msg)


# -- a receiver that finds nothing writes nothing ----------------------------------------------------------------


def _statements(broker: EmbeddedBroker) -> list[str]:
    seen: list[str] = []
    broker._conn().set_trace_callback(seen.append)  # this thread's connection: the sync client uses it
    return seen


def test_a_receiver_that_finds_nothing_makes_no_write_transaction(client, queue):
    plain, sessions = queue(), queue(requires_session=True)
    _send(client, sessions, "x", session="A")
    holder_a = client.get_queue_receiver(sessions, session_id="A")
    holder_a._open()
    holder_b = client.get_queue_receiver(sessions, session_id="B")
    holder_b._open()
    seen = _statements(client.broker)
    assert client.get_queue_receiver(plain).receive_messages(max_wait_time=0.05) == []
    with pytest.raises(OperationTimeoutError):  # A's message is locked: nothing for an acceptor
        client.get_queue_receiver(
            sessions, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=0.05, retry_total=0
        )._open()
    assert holder_b.receive_messages(max_wait_time=0.05) == []  # other sessions' messages are not B's
    assert seen and not [s for s in seen if s.startswith("BEGIN")]


def test_a_receive_that_loses_the_race_for_its_message_commits_nothing(client, queue, monkeypatch):
    q = queue()
    monkeypatch.setattr(client.broker, "_may_receive", lambda *args: True)  # the read saw a message taken since
    seen = _statements(client.broker)
    assert client.broker.receive(q, 1) == []
    assert "BEGIN IMMEDIATE" in seen and "COMMIT" not in seen and seen[-1] == "ROLLBACK"
