"""Several devhost processes on one task hub: partitions, who holds them, and cross-process wake-ups.

As the Durable Azure Storage backend: the hub has `partitionCount` control-queue partitions (host.json
`extensions.durableTask.storageProvider.partitionCount`, 4 by default, at most 16); `partition_of(instance_id)` is
FNV-1a over the id's UTF-8 bytes modulo that count. Only a partition's holder runs its instances' episodes, and an
episode's commit checks that its host still holds it (the `fence` of a Commit): a handover costs a replay, never a
double write. Work items belong to the host that scheduled them; a gone member's are adopted by the next host that
looks. Wake-ups are event-driven (one Unix datagram to the holder after COMMIT); every `LOOK_SECONDS` a host only finds
dead members and spreads partitions. Members, fair share, wake-ups and status waits: docs/modules-host.md.
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
from .records import Leases, Member, Rebalance, WorkItem
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


def plan_for(
    owner: str, alive: Callable[[Member], bool], *, leases: bool = False
) -> Callable[[list[Member], dict[int, str | None]], Rebalance]:
    """The rebalancing rule for `owner` (see the module docstring), as a function of what the store holds. With
    `leases` (the azure-storage timing) a partition is held while the store shows a holder, dead or alive (the store
    shows an expired lease as free: Store.rebalance)."""

    def plan(members: list[Member], partitions: dict[int, str | None]) -> Rebalance:
        dead = [m.owner for m in members if m.owner != owner and not alive(m)]
        live = {m.owner for m in members if m.owner not in dead} | {owner}
        # A dead member's, or a stranger's, are free; with leases, only once the lease ran out.
        held = {p: o for p, o in partitions.items() if (o is not None if leases else o in live)}
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
    live: set[str] = field(default_factory=set)  # the live members at the last look, this one included
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

    def look(self, leases: Leases | None = None) -> tuple[Rebalance, list[WorkItem]]:
        """Find dead members, take and give back partitions, adopt orphaned work (one transaction, or none when
        nothing changes); returns the change and the work items adopted. `leases`: the azure-storage timing's
        (Store.rebalance)."""
        counts = (self.episodes, self.activities)
        # What this host ran is recorded while it shares the hub (for the drills' figures), and when it leaves; a
        # host alone writes nothing at a look that changes nothing.
        record = counts if counts != self._recorded and self.peers else None
        if self.store.left(self.owner) and self._member is not None:  # judged dead while alive: join again
            self.store.join(self._member)
            self._recorded = (0, 0)
        plan = plan_for(self.owner, self.alive, leases=leases is not None)
        change, adopted = self.store.rebalance(self.owner, plan, record, leases)
        if record is not None:
            self._recorded = record
        self.peers = len(change.live) - 1
        self.live = set(change.live)
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
