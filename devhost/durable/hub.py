"""Several devhost processes on one task hub: partitions, who holds them, and cross-process wake-ups.

Azure runs a Durable Functions app on as many instances as it scales to, all on one task hub. The Azure Storage
backend splits the hub into `partitionCount` control-queue partitions (host.json
`extensions.durableTask.storageProvider.partitionCount`, 4 by default, at most 16); an instance belongs to one
partition by a hash of its id, and each partition is leased by one worker at a time, which alone runs the episodes
of its instances. Activity work items sit on one shared work-item queue that any worker takes from. devhost does
the same on its SQLite task hub (store.py), with every host a member of the hub:

- **Members.** A host joins with an owner id (`<pid>-<random>`), its pid and process start (devhost/processes.py), and
  a Unix datagram socket. It is alive while that process runs: the hosts share one machine (the task hub is a local
  SQLite file), so a dead member is seen at once (gone, a zombie, or a later process with the same pid;
  devhost/processes.py reads the start so that a clock step cannot make a live host look dead, and a host judged dead
  while alive joins again). Azure has no such view: a dead worker's partition leases run out first
  (DurableTask.AzureStorage, 30 s by default), and its work items reappear after the work-item queue's visibility
  timeout. devhost takes over as soon as the process is gone, which is faster than Azure and is listed in
  docs/devhost.md, "Differences from Azure".
- **Partitions.** `partition_of(instance_id)` is FNV-1a over the id's UTF-8 bytes, modulo the hub's partition
  count. A host takes free partitions up to its fair share (the count over the live members, rounded up) and gives
  back what is over it, or one partition when another member is below the rounded-down share, so the partitions
  spread evenly as hosts join and leave. Only the holder runs an instance's episodes, and an episode's commit checks,
  in its own transaction, that its host still holds the partition (the `fence` of a Commit), so a partition handed
  over mid-episode costs a replay, never a double write.
- **Work items** belong to the host that scheduled them (the episode's commit writes the owner). The work of a
  member that is gone, or of none (a hub written before scale-out), is adopted by the next host that looks.
- **Wake-ups are event-driven.** A host that commits a message for an instance in a partition it does not hold (an
  activity's result, a start or a raised event through its HTTP API, a sub-orchestration) sends one datagram to
  the holder's socket after COMMIT; the holder reads the inbox after receiving it, so it sees the message. A
  partition taken over is read whole (its inbox and timers) after the transaction that took it; a partition with
  no holder is read by whoever takes it. A host that joins, leaves or gives partitions back wakes every member, so
  that the others rebalance now rather than at their next look (every `LOOK_SECONDS`, which only finds dead members
  and spreads partitions: it never reads an inbox).
- **Status waits** (`wait_for_status`, the HTTP API's `timeout`) on a host that does not run the instance are woken
  by the holder, which wakes every member when one of its instances reaches a terminal status.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from orderflow.embedded.notify import notify_dir_for

from ..processes import process_running, process_start
from .records import Member, Rebalance, WorkItem
from .store import Store

LOOK_SECONDS = 1.0  # how often a host looks for dead members and uneven partitions
DEFAULT_PARTITIONS = 4  # DurableTask.AzureStorage's partitionCount default
MAX_PARTITIONS = 16  # ... and its maximum
_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


@functools.lru_cache(maxsize=4096)  # asked for every mark, episode and timer of an instance
def partition_of(instance_id: str, count: int) -> int:
    """The partition an instance belongs to: 32-bit FNV-1a of its id, modulo the partition count (the Azure Storage
    backend hashes the instance id with FNV-1a to pick its control queue)."""
    value = _FNV_OFFSET
    for byte in instance_id.encode():
        value = ((value ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return value % count


def process_alive(member: Member) -> bool:
    """Whether the member's process still runs: the pid exists, was created when the member joined, and is not a
    zombie (a pid reused by a later process is not the member)."""
    return process_running(member.pid, member.started)


def plan_for(owner: str, alive: Callable[[Member], bool]) -> Callable[[list[Member], dict[int, str | None]], Rebalance]:
    """The rebalancing rule for `owner` (see the module docstring), as a function of what the store holds."""

    def plan(members: list[Member], partitions: dict[int, str | None]) -> Rebalance:
        dead = [m.owner for m in members if m.owner != owner and not alive(m)]
        live = {m.owner for m in members if m.owner not in dead} | {owner}
        held = {p: o for p, o in partitions.items() if o in live}  # a dead member's, or a stranger's, are free
        mine = sorted(p for p, o in held.items() if o == owner)
        free = sorted(p for p in partitions if p not in held)
        ceiling = math.ceil(len(partitions) / len(live))
        floor = len(partitions) // len(live)
        counts = {m: 0 for m in live}
        for o in held.values():
            if o in counts:
                counts[o] += 1
        change = Rebalance(live=live, dead=dead)
        if len(mine) > ceiling:
            change.release = mine[ceiling:]
        elif len(mine) > floor and any(n < floor for m, n in counts.items() if m != owner) and not free:
            change.release = mine[-1:]
        else:
            change.acquire = free[: max(0, ceiling - len(mine))]
        return change

    return plan


@dataclass
class HubMembership:
    """This host's membership of the task hub: its partitions, its socket, and the wake-ups it sends."""

    store: Store
    partition_count: int = DEFAULT_PARTITIONS
    alive: Callable[[Member], bool] = process_alive
    owner: str = field(default_factory=lambda: f"{os.getpid()}-{secrets.token_hex(3)}")
    mine: set[int] = field(default_factory=set)
    episodes: int = 0
    activities: int = 0
    peers: int = 0  # other live members at the last look
    _recorded: tuple[int, int] = (0, 0)
    _socket: socket.socket | None = None
    _path: str = ""
    _member: Member | None = None

    def join(self) -> socket.socket:
        """Create the partitions if the hub has none, bind the wake-up socket and join; returns the socket (the
        engine reads it on its loop)."""
        self.partition_count = self.store.ensure_partitions(self.partition_count)
        directory = notify_dir_for(str(self.store.path))
        os.makedirs(directory, exist_ok=True)
        self._path = os.path.join(directory, f"{self.owner}.s")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(self._path)
        sock.setblocking(False)
        self._socket = sock
        self._member = Member(self.owner, os.getpid(), process_start(), self._path)
        self.store.join(self._member)
        return sock

    def leave(self) -> None:
        """An orderly stop: give every partition back, wake the others so they take them now."""
        self.store.leave(self.owner, self.episodes, self.activities)
        self.mine.clear()
        self.wake_all()
        self.close()

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)

    def fileno(self) -> int:
        return self._socket.fileno() if self._socket is not None else -1

    def owns(self, instance_id: str) -> bool:
        return partition_of(instance_id, self.partition_count) in self.mine

    def partition(self, instance_id: str) -> int:
        return partition_of(instance_id, self.partition_count)

    def look(self) -> tuple[Rebalance, list[WorkItem]]:
        """Find dead members, take and give back partitions, adopt orphaned work (one transaction, or none when
        nothing changes); returns the change and the work items adopted."""
        counts = (self.episodes, self.activities)
        # What this host ran is recorded while it shares the hub (for the drills' figures), and when it leaves; a
        # host alone writes nothing at a look that changes nothing.
        record = counts if counts != self._recorded and self.peers else None
        if self.store.left(self.owner) and self._member is not None:  # judged dead while alive: join again
            self.store.join(self._member)
            self._recorded = (0, 0)
        change, adopted = self.store.rebalance(self.owner, plan_for(self.owner, self.alive), record)
        if record is not None:
            self._recorded = record
        self.peers = len(change.live) - 1
        held = {p for p, o in self.store.partition_owners().items() if o == self.owner}
        lost = self.mine - held
        change.acquired = sorted(held - self.mine)  # taken by this look, or found held: either way, read them
        self.mine = held
        if change.dead:
            for member in self.store.all_members():  # a dead member's socket file goes with it
                if member.owner in change.dead:
                    with contextlib.suppress(OSError):
                        os.unlink(member.socket)
        if change.dead or change.release or lost:
            self.wake_all()
        return change, adopted

    def wake_owner_of(self, instance_id: str) -> None:
        """Wake the member that holds the instance's partition (after COMMIT of a message for it)."""
        path = self.store.owner_socket(self.partition(instance_id))
        if path is not None and path != self._path:
            _send(path)

    def wake_all(self) -> None:
        for member in self.store.members():
            if member.owner != self.owner:
                _send(member.socket)

    def drain(self) -> None:
        """Read every pending wake-up datagram (they carry nothing: a wake-up means "look again")."""
        if self._socket is None:
            return
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while self._socket.recv(16):
                pass


def _send(path: str) -> None:
    """One wake-up datagram; a member that is gone (no socket, refused) is left to the next look, and a full
    buffer already holds a wake-up."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        with contextlib.suppress(FileNotFoundError, ConnectionRefusedError, BlockingIOError):
            sock.sendto(b"!", path)
