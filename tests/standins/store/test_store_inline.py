"""The embedded store runs a call on the event loop when nothing has to wait, else in a worker thread
(orderflow/embedded/store/_file.py `SqliteFile._call`): no hand-off for an uncontended call, a write that meets another
connection's write lock waits in a thread while the loop runs on, and every call yields to the loop first, as a
Cosmos DB request does (admission's group commit counts on seeing calls in flight)."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from support.loop_watch import LoopBeat, record_hand_offs

from orderflow.embedded.store._file import SqliteFile


@pytest.fixture
def hand_offs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The calls the store handed to a worker thread."""
    return record_hand_offs(monkeypatch)


def _put(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS t (v INTEGER)")
    conn.execute("INSERT INTO t VALUES (1)")


def _count(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM t").fetchone()[0])


async def test_uncontended_reads_and_writes_take_no_thread(tmp_path, hand_offs) -> None:
    file = SqliteFile(tmp_path / "store.db")
    try:
        await file.write(_put)
        assert await file.read(_count) == 1
        assert hand_offs == []
    finally:
        await file.aclose()


async def test_a_write_that_meets_another_writer_waits_in_a_thread_and_the_loop_runs_on(tmp_path, hand_offs) -> None:
    file = SqliteFile(tmp_path / "store.db")
    await file.write(_put)
    rival = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    rival.execute("BEGIN IMMEDIATE")  # another process's writer, say: holds the database's write lock
    try:
        async with LoopBeat() as beat:
            write = asyncio.create_task(file.write(_put))
            await asyncio.sleep(0.3)
            assert not write.done() and beat.ticks >= 10  # waiting in a thread, the loop free meanwhile
            rival.execute("COMMIT")
            await asyncio.wait_for(write, 10)
        assert hand_offs == ["_locked"]
        assert await file.read(_count) == 2  # written once: the refused inline attempt did nothing
    finally:
        rival.close()
        await file.aclose()


async def test_a_call_yields_to_the_loop_before_it_runs(tmp_path) -> None:
    file = SqliteFile(tmp_path / "store.db")
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    try:
        task = asyncio.create_task(other())
        await file.write(lambda conn: ran.append("write"))
        await task
        assert ran == ["other", "write"]
    finally:
        await file.aclose()
