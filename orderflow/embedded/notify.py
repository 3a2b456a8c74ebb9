"""Cross-process wake-ups for the embedded broker: one Unix datagram socket per waiting receiver, and a sender
wakes the one idle receiver that can take what it made available, not every waiter.

A waiter binds `<notify dir>/home/<ident>` and, while it sleeps, is registered by moving (os.rename) that file into
its key's directory (`queue_key`, `holder_key`; observers under `watch_key`, woken all at once by `poke`). After
COMMIT, whoever made a message available calls `claim(key)`: one rename back to `home/` plus a 1-byte datagram, so
no wake-up is lost and no message stays behind while a waiter is idle. Due moments (scheduled messages, lock expiry)
are `cover`ed by one idle waiter's timer. The notify directory is `<db>.notify` (or a short one in the temp dir);
without AF_UNIX, waiters re-check every 0.25 s. The layout and the proof: docs/modules-product.md."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import itertools
import os
import secrets
import select
import socket
import tempfile
import threading
import time

_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux, 104 on macOS; keep a margin
_SOCKET_NAME_LEN = 24  # "<pid>-<n>-<tag>.s", generously
_HOME = "home"  # where a waiter's socket file lives while it is not registered (busy, or just claimed)
_counter = itertools.count()
_counter_lock = threading.Lock()
SUPPORTED = hasattr(socket, "AF_UNIX")
_FALLBACK_RECHECK = 0.25  # seconds, only without AF_UNIX
UNDECIDED = 4_000_000_000.0  # the wake time (mtime) of a registered waiter that has not decided yet: never early


def notify_dir_for(db_path: str) -> str:
    """The notify directory every process derives from the same database path."""
    real = os.path.realpath(db_path)
    beside = real + ".notify"
    if len(beside) + 1 + 16 + 1 + _SOCKET_NAME_LEN <= _MAX_SOCKET_PATH:
        return beside
    digest = hashlib.sha1(real.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"ofbus-{digest}")


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def queue_key(queue: str, sub_queue: str = "") -> str:
    """Key of the receivers of a queue (or its dead-letter sub-queue); on a session queue, of the
    NEXT_AVAILABLE_SESSION acceptors. Short and filesystem-safe."""
    return _digest(f"{queue}/{sub_queue}")


def holder_key(queue: str, session_id: str, lock_token: str) -> str:
    """Key of the one receiver holding a session under a lock token: only it can take that session's messages."""
    return _digest(f"{queue}//{session_id}/{lock_token}")


def watch_key(queue: str, sub_queue: str = "") -> str:
    """Key of observers of a queue (`wait_for_activity`): woken by every event of `queue_key`, never claimed."""
    return _digest(f"{queue}/{sub_queue}/watch")


def _ensure_dir(directory: str) -> None:
    os.makedirs(directory, exist_ok=True)


# -- the sending side ----------------------------------------------------------------------------------------


def _listed(notify_dir: str, key: str) -> tuple[str, list[str]]:
    """The directory of `key` and the socket files registered in it (none when it does not exist yet)."""
    directory = os.path.join(notify_dir, key)
    try:
        return directory, os.listdir(directory)
    except FileNotFoundError:
        return directory, []


def claim(notify_dir: str, key: str, count: int = 1) -> int:
    """Claim and wake up to `count` idle waiters of `key`; returns how many were woken."""
    if not SUPPORTED or count <= 0:
        return 0
    directory, names = _listed(notify_dir, key)
    if not names:
        return 0
    home = os.path.join(notify_dir, _HOME)
    woken = 0
    sender: socket.socket | None = None
    try:
        for name in names:
            if woken >= count:
                break
            target = os.path.join(home, name)
            try:
                os.rename(os.path.join(directory, name), target)
            except FileNotFoundError:
                continue  # claimed by someone else, or the waiter left: not idle any more
            if sender is None:
                sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sender.setblocking(False)
            woken += _poke_claimed(sender, target)
    finally:
        if sender is not None:
            sender.close()
    return woken


def _poke_claimed(sender: socket.socket, path: str) -> int:
    try:
        sender.sendto(b"!", path)
    except BlockingIOError:
        pass  # its buffer is full: it has pending wake-ups already
    except FileNotFoundError:
        pass  # it already noticed the claim (ENOENT on its own registration) and moved its socket file on
    except ConnectionRefusedError:
        _unlink_quietly(path)  # the process that bound it is gone
        return 0
    except OSError as exc:
        if exc.errno not in (errno.ENOTSOCK, errno.EPROTOTYPE):
            raise
        _unlink_quietly(path)  # not a socket of ours
        return 0
    return 1


def covered(notify_dir: str, key: str, at: float) -> bool:
    """Whether some registered waiter of `key` wakes by itself at or before `at` (a broker-clock timestamp)."""
    if not SUPPORTED:
        return True
    limit = int(at * 1e9)
    try:
        entries = os.scandir(os.path.join(notify_dir, key))
    except FileNotFoundError:
        return False
    with entries:
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_mtime_ns > limit:
                    continue
            except FileNotFoundError:
                continue
            if _alive(entry.name):
                return True
            _unlink_quietly(entry.path)  # a crashed process's waiter keeps no due moment
    return False


def _alive(name: str) -> bool:
    """Whether the process that registered `<pid>-…` still runs (a reused pid passes: then a claim cleans up)."""
    try:
        pid = int(name.split("-", 1)[0])
    except ValueError:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def needs_cover(notify_dir: str, key: str, at: float) -> bool:
    """Whether waiters are registered under `key` but none of them wakes by `at`: a waiter leaving must then hand
    the due moments it may have kept over (with nobody registered there is nobody to hand them to)."""
    if not SUPPORTED:
        return False
    try:
        names = os.listdir(os.path.join(notify_dir, key))
    except FileNotFoundError:
        return False
    return bool(names) and not covered(notify_dir, key, at)


def cover(notify_dir: str, key: str, at: float) -> int:
    """Make sure an idle waiter of `key` wakes by `at`: claim one (it re-reads the due moments) if none does."""
    if covered(notify_dir, key, at):
        return 0
    return claim(notify_dir, key, 1)


def poke(notify_dir: str, key: str) -> int:
    """Wake every socket registered under `key` without claiming it (observers); returns how many were poked."""
    if not SUPPORTED:
        return 0
    directory, names = _listed(notify_dir, key)
    if not names:
        return 0
    poked = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.setblocking(False)
        for name in names:
            path = os.path.join(directory, name)
            try:
                sender.sendto(b"!", path)
                poked += 1
            except BlockingIOError:
                poked += 1
            except FileNotFoundError:
                pass  # it left meanwhile
            except ConnectionRefusedError:
                _unlink_quietly(path)
            except OSError as exc:
                if exc.errno not in (errno.ENOTSOCK, errno.EPROTOTYPE):
                    raise
    return poked


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# -- the waiting side ----------------------------------------------------------------------------------------


class Waiter:
    """One receiver's socket and its registration. A receiver waits in *sessions* (`start` … `stop`): the
    registration calls take the session's number, and calls of a session that was stopped are ignored, so a
    worker thread still running a look for a cancelled aio receive cannot register it again. Thread-safe."""

    def __init__(self, notify_dir: str) -> None:
        self.notify_dir = notify_dir
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._epoch = 0
        self._key: str | None = None  # the key it is registered under, None while its file is at home
        self.last_key: str | None = None
        self.last_wake_at: float | None = None  # the wake time it last published, until it hands it over
        self.claimed = False  # poked or found claimed since `start`
        self.wakeups = 0  # pokes received over its life (tests, benchmarks)
        with _counter_lock:
            number = next(_counter)
        self.ident = f"{os.getpid()}-{number}-{secrets.token_hex(3)}.s"
        self._home = os.path.join(notify_dir, _HOME, self.ident)
        if SUPPORTED:
            _ensure_dir(os.path.dirname(self._home))
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.bind(self._home)
            self._sock.setblocking(False)

    @property
    def key(self) -> str | None:
        return self._key

    def _path(self, key: str) -> str:
        return os.path.join(self.notify_dir, key, self.ident)

    def start(self) -> int:
        """Begin a wait session; returns its number."""
        with self._lock:
            self._epoch += 1
            self.claimed = False
            return self._epoch

    def ensure_registered(self, key: str, epoch: int) -> bool:
        """Be registered under `key`, undecided. True if that took a (re)registration: the caller must look
        again before sleeping, since a claim may have gone to it, or to no one, while it was not registered."""
        with self._lock:
            if epoch != self._epoch or self._sock is None:
                return False
            if self._key == key:
                try:
                    os.utime(self._path(key), ns=(int(UNDECIDED * 1e9),) * 2)
                    return False
                except FileNotFoundError:
                    self._key, self.claimed = None, True  # claimed: the file is at home
            elif self._key is not None:
                self._leave_locked(pass_claim_on=True)  # moving to another key is leaving this one
            os.utime(self._home, ns=(int(UNDECIDED * 1e9),) * 2)
            _ensure_dir(os.path.join(self.notify_dir, key))
            os.rename(self._home, self._path(key))
            self._key = self.last_key = key
            return True

    def notice_claim(self, epoch: int) -> None:
        """After a poke: if a claimer took the registration, know it now (the look that follows answers that
        claim), so that leaving does not mistake it for a claim that came after the look."""
        with self._lock:
            if epoch == self._epoch and self._key is not None and not os.path.lexists(self._path(self._key)):
                self._key, self.claimed = None, True

    def set_wake_at(self, at: float, epoch: int) -> bool:
        """Publish when it will wake by itself; False if it was claimed meanwhile (look again, do not sleep)."""
        with self._lock:
            if epoch != self._epoch or self._key is None:
                return self._sock is None
            try:
                os.utime(self._path(self._key), ns=(int(at * 1e9),) * 2)
            except FileNotFoundError:
                self._key, self.claimed = None, True
                return False
            self.last_wake_at = at
            return True

    def unregister(self, epoch: int) -> bool:
        """Leave the idle set; True if it had been claimed (the claim's message may still be waiting)."""
        with self._lock:
            if epoch != self._epoch:
                return False
            return self._leave_locked()

    def _leave_locked(self, *, pass_claim_on: bool = False) -> bool:
        """Move the socket file home; True if a claimer had moved it already. With `pass_claim_on`, for a waiter
        that will not look again, that claim is handed to another waiter of the key."""
        key, self._key = self._key, None
        if key is None:
            return False
        try:
            os.rename(self._path(key), self._home)
            return False
        except FileNotFoundError:
            self.claimed = True
            if pass_claim_on:
                claim(self.notify_dir, key, 1)
            return True

    def stop(self, epoch: int) -> tuple[str | None, bool, float | None]:
        """End a wait session (also an interrupted one): (key it was last registered under, whether a claim found
        it on the way out, the wake time it had published). Later calls with this session's number are ignored."""
        with self._lock:
            if epoch != self._epoch:
                return None, False, None
            self._epoch += 1
            claimed = self._leave_locked()
            last, self.last_wake_at = self.last_wake_at, None
            return self.last_key, claimed, last

    def drain(self) -> bool:
        """Consume pending pokes; True if there were any."""
        got = False
        while self._sock is not None:
            try:
                self._sock.recv(64)
                got = True
            except OSError:  # BlockingIOError: nothing more pending
                break
        if got:
            self.claimed = True
        return got

    def wait(self, timeout: float) -> bool:
        """Block until poked or `timeout` seconds pass; True if poked."""
        if self._sock is None:
            time.sleep(min(max(timeout, 0.0), _FALLBACK_RECHECK))
            return False
        readable, _, _ = select.select([self._sock], [], [], max(timeout, 0.0))
        poked = bool(readable) and self.drain()
        self.wakeups += poked
        return poked

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
        self.claimed = True
        self.wakeups += 1
        return True

    def close(self) -> None:
        """Unregister (handing a claim that found it on to another waiter) and remove the socket."""
        with self._lock:
            self._epoch += 1
            self._leave_locked(pass_claim_on=True)
            if self._sock is not None:
                self._sock.close()
                self._sock = None
                _unlink_quietly(self._home)

    def __enter__(self) -> Waiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
