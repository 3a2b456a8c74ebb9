"""Closing a broker while other threads are still inside calls on it does not crash the process.

An aio receive whose await was cancelled goes on in its worker thread (asyncio.to_thread cannot stop it), so a client
can close while a look is mid-statement. Closing a sqlite3 connection under another thread's running statement
finalizes that statement and crashes the interpreter (seen as a segmentation fault of the whole test run in
tests/lab/test_crash_drills.py). The race runs in a child process, so a crash is a failed assertion here.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]

RACE = textwrap.dedent("""
    import os, sys, tempfile, threading, time
    from orderflow.embedded.broker import EmbeddedBroker

    for _ in range(int(sys.argv[1])):
        broker = EmbeddedBroker(os.path.join(tempfile.mkdtemp(), "bus.db"))
        broker.declare_queue("q")
        stop = threading.Event()

        def look() -> None:
            while not stop.is_set():
                try:
                    broker.due_at("q")
                except Exception:
                    pass  # a call after close may fail; it must not crash

        threads = [threading.Thread(target=look) for _ in range(3)]
        for thread in threads:
            thread.start()
        time.sleep(0.01)
        broker.close()
        time.sleep(0.005)
        stop.set()
        for thread in threads:
            thread.join()
        broker.close()  # the connections the looks opened after the first close: their threads have ended
    print("survived")
""")


def test_close_while_other_threads_run_statements_does_not_crash() -> None:
    done = subprocess.run(
        [sys.executable, "-c", RACE, "60"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "survived", (done.returncode, done.stderr[-2000:])
