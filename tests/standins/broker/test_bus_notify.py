"""The cross-process wake-up registry (orderflow.embedded.notify): a claim moves one registered waiter out of the idle
set and wakes it, two claims never take the same waiter, dead waiters' sockets are cleaned up, a waiter learns of a
claim from its own registration, observers are woken without being claimed, published wake times decide whether a
due moment is covered (a crashed process's waiter does not count), long database paths still give a valid socket
address, and platforms without AF_UNIX degrade to a bounded re-check instead of failing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from orderflow.embedded import notify
from orderflow.embedded.broker import EmbeddedBroker
from orderflow.embedded.client import ServiceBusClient, ServiceBusMessage


def _registered(directory, key) -> list[str]:
    try:
        return os.listdir(os.path.join(directory, key))
    except FileNotFoundError:
        return []


def test_claim_wakes_one_registered_waiter_and_takes_it_out_of_the_idle_set(tmp_path):
    d = str(tmp_path)
    with notify.Waiter(d) as first, notify.Waiter(d) as second:
        for waiter in (first, second):
            assert waiter.ensure_registered("k", waiter.start()) is True  # registered: look again before sleeping
        assert len(_registered(d, "k")) == 2
        assert notify.claim(d, "k") == 1
        assert len(_registered(d, "k")) == 1  # the other one stays idle
        woken = [w for w in (first, second) if w.wait(0.01)]
        assert len(woken) == 1 and woken[0].wakeups == 1
        assert notify.claim(d, "k") == 1 and notify.claim(d, "k") == 0  # nobody left to claim
        assert _registered(d, "k") == []
    assert os.listdir(tmp_path / "home") == []  # closing unlinks the socket


def test_a_waiter_learns_of_a_claim_from_its_own_registration(tmp_path):
    d = str(tmp_path)
    with notify.Waiter(d) as waiter:
        epoch = waiter.start()
        waiter.ensure_registered("k", epoch)
        assert waiter.unregister(epoch) is False  # nobody claimed it
        waiter.ensure_registered("k", epoch)
        notify.claim(d, "k")
        assert waiter.set_wake_at(time.time() + 60, epoch) is False  # claimed meanwhile: look again, do not sleep
        assert waiter.ensure_registered("k", epoch) is True
        notify.claim(d, "k")
        assert waiter.unregister(epoch) is True  # claimed on its way out: the claim is its to answer
        assert waiter.claimed


def test_a_stopped_wait_session_cannot_register_again(tmp_path):
    d = str(tmp_path)
    with notify.Waiter(d) as waiter:
        epoch = waiter.start()
        waiter.stop(epoch)  # e.g. an aio receive cancelled while its look still runs in a worker thread
        assert waiter.ensure_registered("k", epoch) is False
        assert _registered(d, "k") == []


def test_claim_skips_dead_waiters_and_removes_their_sockets(tmp_path):
    (tmp_path / "k").mkdir()
    (tmp_path / "home").mkdir()
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(tmp_path / "k" / "999999-0-dead.s"))
    dead.close()  # the file stays, nobody listens: as after a crash
    assert notify.claim(str(tmp_path), "k") == 0
    assert os.listdir(tmp_path / "k") == [] and os.listdir(tmp_path / "home") == []
    with notify.Waiter(str(tmp_path)) as alive:
        alive.ensure_registered("k", alive.start())
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        dead.bind(str(tmp_path / "k" / "999999-1-dead.s"))
        dead.close()
        assert notify.claim(str(tmp_path), "k") == 1  # the live one, whichever comes first in the listing
        assert alive.wait(5) is True


def test_poke_wakes_every_observer_without_claiming_it(tmp_path):
    d = str(tmp_path)
    with notify.Waiter(d) as one, notify.Waiter(d) as two:
        for waiter in (one, two):
            waiter.ensure_registered("w", waiter.start())
        assert notify.poke(d, "w") == 2
        assert one.wait(5) and two.wait(5)
        assert len(_registered(d, "w")) == 2  # still registered


def test_published_wake_times_decide_whether_a_due_moment_is_covered(tmp_path):
    d = str(tmp_path)
    with notify.Waiter(d) as waiter:
        epoch = waiter.start()
        waiter.ensure_registered("k", epoch)
        assert notify.covered(d, "k", 1000.0) is False  # undecided: it may still sleep past any moment
        assert waiter.set_wake_at(500.0, epoch)
        assert notify.covered(d, "k", 1000.0) and notify.covered(d, "k", 500.0)
        assert notify.covered(d, "k", 499.0) is False
        assert notify.cover(d, "k", 1000.0) == 0 and not waiter.wait(0)  # covered: nobody is woken
        assert notify.cover(d, "k", 100.0) == 1 and waiter.wait(5)  # not: the waiter is claimed to re-read


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


def test_a_crashed_processs_waiter_does_not_count_as_keeping_a_due_moment(tmp_path):
    (tmp_path / "k").mkdir()
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = int(child.stdout)  # a pid that has exited
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "k" / f"{gone}-0-dead.s"
    dead.bind(str(path))
    dead.close()
    os.utime(path, ns=(10**9, 10**9))  # it had published an early wake time
    assert notify.covered(str(tmp_path), "k", 1000.0) is False
    assert os.listdir(tmp_path / "k") == []
