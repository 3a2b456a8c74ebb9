"""The cross-process wake-up mechanism (orderflow.bus.notify): pokes reach bound waiters, dead waiters'
sockets are cleaned up, long database paths still give a valid socket address, and platforms without
AF_UNIX degrade to a bounded re-check instead of failing."""

from __future__ import annotations

import os
import socket
import time

from orderflow.bus import EmbeddedBroker, notify
from orderflow.bus.embedded import ServiceBusClient, ServiceBusMessage


def test_poke_wakes_a_bound_waiter_and_drain_clears_it(tmp_path):
    with notify.Waiter(str(tmp_path), "k") as waiter:
        assert waiter.wait(0.01) is False
        assert notify.poke(str(tmp_path), "k") == 1
        assert waiter.wait(5) is True
        assert waiter.drain() is False  # consumed
    assert os.listdir(tmp_path / "k") == []  # closing unlinks the socket


def test_poke_removes_sockets_of_dead_waiters(tmp_path):
    (tmp_path / "k").mkdir()
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(tmp_path / "k" / "999999-0.s"))
    dead.close()  # the file stays, nobody listens: as after a crash
    assert notify.poke(str(tmp_path), "k") == 0
    assert os.listdir(tmp_path / "k") == []


def test_long_database_paths_get_a_short_notify_dir(tmp_path):
    deep = tmp_path / ("d" * 120) / "bus.db"
    directory = notify.notify_dir_for(str(deep))
    assert len(directory) < 80 and directory == notify.notify_dir_for(str(deep))  # same in every process
    assert notify.notify_dir_for("/srv/of/bus.db") == "/srv/of/bus.db.notify"  # short: beside the file


def test_without_af_unix_receive_still_wakes_by_bounded_recheck(tmp_path, monkeypatch):
    monkeypatch.setattr(notify, "SUPPORTED", False)
    broker = EmbeddedBroker(tmp_path / "bus.db")
    broker.declare_queue("q")
    with ServiceBusClient(broker) as client:
        receiver = client.get_queue_receiver("q")
        assert receiver.receive_messages(max_wait_time=0.05) == []
        client.get_queue_sender("q").send_messages(ServiceBusMessage("x"))
        started = time.monotonic()
        assert [str(m) for m in receiver.receive_messages(max_wait_time=5)] == ["x"]
        assert time.monotonic() - started < 1.0
    broker.close()
