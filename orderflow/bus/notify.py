"""Cross-process wake-ups for the embedded broker: Unix datagram sockets, one per waiting receiver.

A waiter binds a datagram socket in `<notify dir>/<queue key>/`; whoever makes a message available on that
queue (send, abandon, lock release, dead-lettering) `poke`s every socket in the directory with a 1-byte
datagram. The waiter blocks in select()/the event loop on its socket, so an idle receiver uses no CPU and a
send from any process wakes it at once. Lost pokes are impossible as long as the waiter binds (and drains)
before it checks the database. Sockets of dead processes refuse datagrams and are unlinked by the poker.

The notify directory lives next to the database file (`<db>.notify`) unless that path is too long for a
Unix socket address (108 bytes), in which case a short, deterministic directory in the temp dir is used.
Where the platform has no AF_UNIX (some Windows builds) waiters degrade to a bounded 0.25 s re-check.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import itertools
import os
import select
import socket
import tempfile
import threading
import time

_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux, 104 on macOS; keep a margin
_SOCKET_NAME_LEN = 24  # "<pid>-<n>.s", generously
_counter = itertools.count()
_counter_lock = threading.Lock()
SUPPORTED = hasattr(socket, "AF_UNIX")
_FALLBACK_RECHECK = 0.25  # seconds, only without AF_UNIX


def notify_dir_for(db_path: str) -> str:
    """The notify directory every process derives from the same database path."""
    real = os.path.realpath(db_path)
    beside = real + ".notify"
    if len(beside) + 1 + 16 + 1 + _SOCKET_NAME_LEN <= _MAX_SOCKET_PATH:
        return beside
    digest = hashlib.sha1(real.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"ofbus-{digest}")


def queue_key(queue: str, sub_queue: str = "") -> str:
    """Directory name for one queue (or its dead-letter sub-queue): short and filesystem-safe."""
    return hashlib.sha1(f"{queue}/{sub_queue}".encode()).hexdigest()[:16]


def poke(notify_dir: str, key: str) -> int:
    """Wake every waiter of one queue; returns how many sockets were poked."""
    if not SUPPORTED:
        return 0
    directory = os.path.join(notify_dir, key)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    poked = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.setblocking(False)
        for name in names:
            poked += _poke_one(sender, os.path.join(directory, name))
    return poked


def _poke_one(sender: socket.socket, path: str) -> int:
    try:
        sender.sendto(b"!", path)
        return 1
    except BlockingIOError:
        return 1  # the waiter's buffer is full: it has pending wake-ups already
    except (ConnectionRefusedError, FileNotFoundError):
        _unlink_quietly(path)  # the process that bound it is gone
    except OSError as exc:
        if exc.errno not in (errno.ENOTSOCK, errno.EPROTOTYPE):
            raise
    return 0


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class Waiter:
    """A bound datagram socket that receives the pokes of one queue. Not thread-safe; one per receiver."""

    def __init__(self, notify_dir: str, key: str) -> None:
        self._sock: socket.socket | None = None
        self._path = ""
        if SUPPORTED:
            self._bind(os.path.join(notify_dir, key))

    def _bind(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        with _counter_lock:
            number = next(_counter)
        self._path = os.path.join(directory, f"{os.getpid()}-{number}.s")
        _unlink_quietly(self._path)  # a leftover of a dead process that had our pid
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self._path)
        self._sock.setblocking(False)

    def drain(self) -> bool:
        """Consume pending pokes; True if there were any."""
        got = False
        while self._sock is not None:
            try:
                self._sock.recv(64)
                got = True
            except BlockingIOError:
                break
        return got

    def wait(self, timeout: float) -> bool:
        """Block until poked or `timeout` seconds pass; True if poked."""
        if self._sock is None:
            time.sleep(min(max(timeout, 0.0), _FALLBACK_RECHECK))
            return False
        readable, _, _ = select.select([self._sock], [], [], max(timeout, 0.0))
        return bool(readable) and self.drain()

    async def wait_async(self, timeout: float) -> bool:
        """Like `wait`, without blocking the event loop."""
        if self._sock is None:
            await asyncio.sleep(min(max(timeout, 0.0), _FALLBACK_RECHECK))
            return False
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.sock_recv(self._sock, 64), max(timeout, 0.0))
        except TimeoutError:
            return False
        self.drain()
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            _unlink_quietly(self._path)

    def __enter__(self) -> Waiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
