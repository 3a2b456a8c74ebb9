"""The broker's writer lock orders the write transactions of every process
(orderflow/embedded/broker/_base.py `_WriterLock`):
a writer in another process waits for the holder and proceeds when it lets go, instead of polling through SQLite's
busy handler; the kernel releases the lock of a process that dies.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from orderflow.embedded.broker import EmbeddedBroker
from orderflow.embedded.broker._base import _writer_lock

REPO_ROOT = Path(__file__).resolve().parents[3]
PROMPT = 20.0  # generous bound for a child process to start and write; the checks are about order, not speed


def _child_send(db: Path, marker: Path) -> subprocess.Popen[str]:
    """A process that sends one message to queue q and then writes `marker`."""
    code = textwrap.dedent(f"""
        from pathlib import Path
        from orderflow.embedded.broker import EmbeddedBroker
        from orderflow.embedded.message import Envelope
        broker = EmbeddedBroker({str(db)!r})
        broker.send("q", [Envelope(body=b"from-child", message_id="m-1")])
        Path({str(marker)!r}).write_text("sent")
    """)
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(path: Path, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            return True
        time.sleep(0.02)  # polls the test's own marker file, not the product
    return False


def test_a_writer_in_another_process_waits_for_the_holder_and_goes_on_when_it_lets_go(tmp_path: Path) -> None:
    db = tmp_path / "bus.db"
    broker = EmbeddedBroker(db)
    broker.declare_queue("q")
    marker = tmp_path / "sent"
    with _writer_lock(str(db)).held():
        child = _child_send(db, marker)
        try:
            # While this process holds the writer lock the child's send cannot commit (its SQLite busy timeout is
            # 30 s, so this is the flock, not SQLite giving up).
            assert not _wait_for(marker, 3.0)
        except BaseException:
            child.kill()
            raise
    assert _wait_for(marker, PROMPT), child.communicate()
    assert child.wait(PROMPT) == 0
    assert broker.counts("q").active == 1
    broker.close()


def test_the_lock_of_a_killed_process_is_released(tmp_path: Path) -> None:
    db = tmp_path / "bus.db"
    EmbeddedBroker(db).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import fcntl, os, sys, time
        fd = os.open({str(db) + ".writer-lock"!r}, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(600)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        fd = os.open(str(db) + ".writer-lock", os.O_RDWR)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                raise AssertionError("the lock should be held by the other process")
            except BlockingIOError:
                pass
            holder.send_signal(signal.SIGKILL)
            holder.wait(PROMPT)
            fcntl.flock(fd, fcntl.LOCK_EX)  # returns: the kernel released the dead holder's lock
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    finally:
        holder.kill()
