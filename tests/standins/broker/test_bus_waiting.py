"""Event-driven waiting in one process: a blocked receive wakes on a send from another thread, on a
scheduled message falling due and on a lock expiring, without polling; `wait_for_activity` for a dispatcher.
These use the real clock (waits are bounded by short due times, never slept for correctness)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from orderflow.embedded.client import ServiceBusMessage


def _elapsed(action) -> tuple[object, float]:
    started = time.monotonic()
    result = action()
    return result, time.monotonic() - started


def test_blocked_receive_wakes_on_send_from_another_thread(live):
    live.broker.declare_queue("q")
    receiver = live.get_queue_receiver("q")
    sender = live.get_queue_sender("q")
    timer = threading.Timer(0.1, lambda: sender.send_messages(ServiceBusMessage("x")))
    timer.start()
    messages, took = _elapsed(lambda: receiver.receive_messages(max_wait_time=20))
    timer.join()
    assert [str(m) for m in messages] == ["x"] and took < 1.0


def test_blocked_receive_wakes_when_a_scheduled_message_falls_due(live):
    live.broker.declare_queue("q")
    due = live.broker.clock() + timedelta(milliseconds=200)
    live.get_queue_sender("q").schedule_messages(ServiceBusMessage("later"), due)
    messages, took = _elapsed(lambda: live.get_queue_receiver("q").receive_messages(max_wait_time=20))
    assert [str(m) for m in messages] == ["later"]
    assert 0.15 <= took < 1.0  # not before it is due, and without waiting out max_wait_time


def test_blocked_receive_wakes_when_a_lock_expires(live):
    live.broker.declare_queue("q", lock_duration=0.2)
    live.get_queue_sender("q").send_messages(ServiceBusMessage("x"))
    [first] = live.get_queue_receiver("q").receive_messages(max_wait_time=1)
    messages, took = _elapsed(lambda: live.get_queue_receiver("q").receive_messages(max_wait_time=20))
    assert messages[0].sequence_number == first.sequence_number and messages[0].delivery_count == 1
    assert took < 1.0


def test_wait_for_activity_returns_false_on_timeout_and_true_on_send(live):
    live.broker.declare_queue("q")
    assert live.broker.wait_for_activity("q", timeout=0.05) is False
    timer = threading.Timer(0.1, lambda: live.get_queue_sender("q").send_messages(ServiceBusMessage("x")))
    timer.start()
    woke, took = _elapsed(lambda: live.broker.wait_for_activity("q", timeout=20))
    timer.join()
    assert woke is True and took < 1.0


def test_wait_for_activity_ignores_messages_of_locked_sessions(live):
    live.broker.declare_queue("s", requires_session=True)
    live.get_queue_sender("s").send_messages(ServiceBusMessage("x", session_id="A"))
    assert live.broker.wait_for_activity("s", timeout=0.05) is True
    with live.get_queue_receiver("s", session_id="A"):
        assert live.broker.wait_for_activity("s", timeout=0.05) is False  # nothing a dispatcher could take
