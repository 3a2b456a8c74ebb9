"""The aio client runs a broker call on the event loop while the writer lock is free, else in a worker thread
(orderflow/embedded/client_aio.py `_run`, broker/_base.py `inline_first`): an uncontended call costs no hand-off to a
thread, a contended one never stalls the loop, and a call that got the lock never starts over."""

from __future__ import annotations

import asyncio
import threading

import pytest
from support.loop_watch import LoopBeat, record_hand_offs

from orderflow.embedded.broker import EmbeddedBroker
from orderflow.embedded.broker._base import WriterBusy, _writer_lock, inline_first
from orderflow.embedded.client import ServiceBusMessage
from orderflow.embedded.client_aio import ServiceBusClient


@pytest.fixture
def hand_offs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The calls the aio client handed to a worker thread."""
    return record_hand_offs(monkeypatch)


async def test_an_uncontended_send_and_receive_take_no_thread(tmp_path, hand_offs) -> None:
    broker = EmbeddedBroker(tmp_path / "bus.db")
    broker.declare_queue("q")
    try:
        async with ServiceBusClient(broker) as bus:
            async with bus.get_queue_sender("q") as sender:
                await sender.send_messages(ServiceBusMessage("x"))
            async with bus.get_queue_receiver("q") as receiver:
                [got] = await receiver.receive_messages(max_wait_time=1)
                await receiver.complete_message(got)
        assert str(got) == "x"
        assert hand_offs == []
    finally:
        broker.close()


async def test_a_send_that_would_wait_for_the_lock_goes_to_a_thread_and_the_loop_runs_on(tmp_path, hand_offs) -> None:
    broker = EmbeddedBroker(tmp_path / "bus.db")
    broker.declare_queue("q")
    held, release = threading.Event(), threading.Event()

    def holder() -> None:  # another writer of this process holds the broker's writer lock for a while
        with _writer_lock(broker.path).held():
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(10)
        async with ServiceBusClient(broker) as bus, bus.get_queue_sender("q") as sender, LoopBeat() as beat:
            send = asyncio.create_task(sender.send_messages(ServiceBusMessage("x")))
            await asyncio.sleep(0.3)
            assert not send.done() and beat.ticks >= 10  # waiting in a thread, the loop free meanwhile
            release.set()
            await asyncio.wait_for(send, 10)
        assert "send" in hand_offs
        assert broker.counts("q").active == 1  # sent once: the refused inline attempt did nothing
    finally:
        release.set()
        thread.join()
        broker.close()


class Holder:
    """Another thread of this process holding the writer lock until `release`."""

    def __init__(self, path: str) -> None:
        self.held, self.done = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, args=(path,))
        self.thread.start()
        assert self.held.wait(5)

    def _hold(self, path: str) -> None:
        with _writer_lock(path).held():
            self.held.set()
            self.done.wait(10)

    def release(self) -> None:
        self.done.set()
        self.thread.join()


def test_the_first_transaction_of_an_inline_call_refuses_to_wait(tmp_path) -> None:
    path = str(tmp_path / "bus.db")
    holder = Holder(path)
    try:
        with pytest.raises(WriterBusy), inline_first(), _writer_lock(path).held():
            pytest.fail("the lock was taken while another thread held it")
    finally:
        holder.release()
    with inline_first(), _writer_lock(path).held():
        pass  # free again: taken inline


def test_a_later_transaction_of_the_same_call_waits_like_any_other(tmp_path) -> None:
    """A call whose first transaction made a change never raises WriterBusy (its caller would run it again)."""
    path = str(tmp_path / "bus.db")
    lock = _writer_lock(path)
    with inline_first():
        with lock.held():
            pass  # the call's first transaction: free, taken inline
        holder = Holder(path)
        threading.Timer(0.2, holder.release).start()
        with lock.held():  # held by the other thread: this one waits for it instead of raising
            assert holder.done.is_set()


async def test_a_call_yields_to_the_loop_before_it_runs(tmp_path) -> None:
    """As a call to Service Bus does: what runs meanwhile sees the call in flight."""
    broker = EmbeddedBroker(tmp_path / "bus.db")
    broker.declare_queue("q")
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    try:
        async with ServiceBusClient(broker) as bus, bus.get_queue_sender("q") as sender:
            task = asyncio.create_task(other())
            await sender.send_messages(ServiceBusMessage("x"))
            ran.append("sent")
            await task
        assert ran == ["other", "sent"]
    finally:
        broker.close()
