"""The Durable engine's timing (`--timing`): `local`, event-driven (a message is read the moment it is committed), or
`azure-storage`, with the Azure Storage provider's latencies: control and work-item queues polled with its
randomized exponential backoff up to `maxQueuePollingInterval`, partition leases that a lost host keeps until they
expire, and the messages a lost host had dequeued hidden until their visibility timeout. Values from host.json with
the provider's defaults; each rule's source: docs/modules-host.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from ..config import ConfigError, _duration_seconds, _max_queue_polling_interval, setting
from ..timing_option import TIMINGS
from .hub import LOOK_SECONDS
from .records import Leases, Pending, WorkItem

if TYPE_CHECKING:
    from .hub import HubMembership
    from .store import Store

log = logging.getLogger("devhost.durable")


class Dispatcher(Protocol):
    """What the pollers use of the engine (devhost/durable/_dispatch.py Dispatcher)."""

    hub: HubMembership | None
    _running: set[str]

    @property
    def store(self) -> Store: ...

    def _clock(self) -> datetime: ...

    def _mark(self, instance_id: str) -> None: ...

    def _spawn(self, coro: Any, name: str) -> None: ...

    def _spawn_work(self, item: WorkItem) -> None: ...


class Released(Exception):
    """A poller's queue is no longer this host's (its partition went, or the engine stopped)."""


@dataclass(frozen=True)
class AzureStorageSettings:
    """The provider's waits in seconds. The first three are host.json `storageProvider` keys (AzureStorageOptions);
    the lease figures are not, and keep AzureStorageOrchestrationServiceSettings' defaults."""

    max_queue_polling_s: float = 30.0  # MaxQueuePollingInterval
    control_queue_visibility_s: float = 300.0  # ControlQueueVisibilityTimeout
    work_item_visibility_s: float = 300.0  # WorkItemQueueVisibilityTimeout
    lease_interval_s: float = 30.0  # LeaseInterval: a renewed lease runs that long
    lease_acquire_interval_s: float = 10.0  # LeaseAcquireInterval: the partition manager's pass
    claim_lease_s: float = 60.0  # TablePartitionManager.ClaimLease: ExpiresAt = UtcNow.AddMinutes(1)
    min_polling_s: float = 0.05  # TaskHubQueue: minPollingDelay = TimeSpan.FromMilliseconds(50)

    @classmethod
    def from_host_json(cls, durable: Mapping[str, Any]) -> AzureStorageSettings:
        """From host.json `extensions.durableTask` (keys case-insensitive, as .NET binds them); a value the
        extension refuses is a ConfigError with its rule (AzureStorageOptions.Validate)."""
        provider = setting(durable, "storageProvider") or {}
        kind = setting(provider, "type")
        if kind is not None and str(kind).lower() not in ("azurestorage", ""):
            raise ConfigError(
                f"--timing azure-storage is the Azure Storage provider's, but host.json's storageProvider type is "
                f"{kind!r}; run with --timing local"
            )
        control = _seconds(provider, "controlQueueVisibilityTimeout", 300.0)
        if not 60.0 <= control <= 3600.0:
            raise ConfigError(
                "host.json: extensions.durableTask.storageProvider.controlQueueVisibilityTimeout must be between 1 "
                "and 60 minutes"
            )
        work = _seconds(provider, "workItemQueueVisibilityTimeout", 300.0)
        if work < 0:
            raise ConfigError("host.json: extensions.durableTask.storageProvider.workItemQueueVisibilityTimeout < 0")
        polling = _max_queue_polling_interval(setting(provider, "maxQueuePollingInterval"))
        return cls(max_queue_polling_s=polling, control_queue_visibility_s=control, work_item_visibility_s=work)


def _seconds(section: Mapping[str, Any], name: str, default: float) -> float:
    value = setting(section, name)
    return default if value is None else _duration_seconds(value)


class BackoffStrategy:
    """DurableTask.AzureStorage BackoffPollingHelper's RandomizedExponentialBackoffStrategy: the wait before the next
    poll. Found work sets it to the minimum; each empty poll adds minimum x 2^(n-1) x a random factor in [0.8, 1.2)
    up to the maximum, which then stays. It starts at zero: the first poll of a queue is at once."""

    RANDOMIZATION = 0.2

    def __init__(self, minimum: float, maximum: float, rng: random.Random) -> None:
        if minimum < 0 or maximum < 0 or minimum > maximum:
            raise ValueError("need 0 <= minimum <= maximum")
        self.minimum, self.maximum, self.delta = minimum, maximum, minimum
        self.current = 0.0
        self._exponent = 0
        self._rng = rng

    def update(self, succeeded: bool) -> float:
        if succeeded:
            self.current = self.minimum
            self._exponent = 1
        elif self.current != self.maximum:
            interval = self.minimum
            if self._exponent > 0:  # Utils.Next(random, min, max): NextDouble() * (max - min) + min
                factor = self._rng.uniform(1.0 - self.RANDOMIZATION, 1.0 + self.RANDOMIZATION)
                interval += factor * 2.0 ** (self._exponent - 1) * self.delta
            if interval < self.maximum:
                self.current = interval
                self._exponent += 1
            else:
                self.current = self.maximum
        return self.current


async def _wait_event(event: asyncio.Event, timeout: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)


class BackoffPoller:
    """BackoffPollingHelper: `wait()` until the current interval passes or `reset()` is called (an auto-reset
    event: a reset before the wait ends it at once); the interval then goes to the minimum if reset, else backs off.
    `sleep(event, seconds)` is injectable (tests run it on a fake clock)."""

    def __init__(
        self,
        minimum: float,
        maximum: float,
        rng: random.Random | None = None,
        sleep: Callable[[asyncio.Event, float], Awaitable[None]] = _wait_event,
    ) -> None:
        self.strategy = BackoffStrategy(minimum, max(minimum, maximum), rng or random.Random())
        self._event = asyncio.Event()
        self._sleep = sleep

    def reset(self) -> None:
        self._event.set()

    async def wait(self) -> bool:
        if not self._event.is_set():
            await self._sleep(self._event, self.strategy.current)
        signaled = self._event.is_set()
        self._event.clear()
        self.strategy.update(signaled)
        return signaled

    async def run(self, poll: Callable[[], bool]) -> None:
        """Poll until `poll` raises Released: after work found, at once (TaskHubQueue resets its helper
        after each batch); after an empty poll, when `wait()` ends."""
        while True:
            try:
                found = poll()
            except Released:
                return
            except sqlite3.Error as exc:  # the hub file busy past its timeout: an empty poll
                log.warning("queue poll failed, backing off: %s", exc)
                found = False
            if found:
                self.reset()
            else:
                await self.wait()


class LocalTiming:
    """Today's timing: every hook does nothing, wake-ups are datagrams, looks every LOOK_SECONDS."""

    name = "local"
    polls = False  # the azure-storage timing finds messages from other hosts and fired timers by polling
    look_seconds = LOOK_SECONDS

    def leases(self, now: datetime, periodic: bool) -> Leases | None:
        return None

    def dequeue(self, store: Store, owner: str, instance_id: str, execution_id: str, now: datetime) -> Pending:
        return store.pending(instance_id, execution_id)

    def abandon(self, store: Store, pending: Pending) -> None:
        pass

    def work_started(self, store: Store, item: WorkItem, now: datetime) -> None:
        pass

    def enqueued(self, partition: int) -> None:
        pass

    def work_enqueued(self) -> None:
        pass

    def sync(self, engine: Dispatcher) -> None:
        pass


class AzureStorageTiming(LocalTiming):
    """The Azure Storage provider's timing (module docstring). One poller per partition this host holds (its control
    queue) and one for the work-item queue; a commit on this host resets the poller of the queue it writes to, as
    TaskHubQueue.AddMessageAsync resets its own helper, so only messages from other hosts, fired timers and work a
    dead host left wait for a poll."""

    name = "azure-storage"
    polls = True

    def __init__(self, settings: AzureStorageSettings, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.look_seconds = settings.lease_acquire_interval_s
        self._rng = rng or random.Random()
        self._control: dict[int, BackoffPoller] = {}
        # Per partition, the instances a poll handed to the engine, with their newest message then: found again only
        # with a newer one (a message the engine cannot consume, e.g. for an instance purged since, is not a busy loop).
        self._handed: dict[int, dict[str, int]] = {}
        self._work: BackoffPoller | None = None
        self._hub: HubMembership | None = None  # the membership the pollers serve (a new one at each start)

    def _poller(self) -> BackoffPoller:
        return BackoffPoller(self.settings.min_polling_s, self.settings.max_queue_polling_s, self._rng)

    def leases(self, now: datetime, periodic: bool) -> Leases | None:
        s = self.settings
        return Leases(now.timestamp(), s.lease_interval_s, s.claim_lease_s, periodic)

    def dequeue(self, store: Store, owner: str, instance_id: str, execution_id: str, now: datetime) -> Pending:
        """The messages this host may read (ControlQueue.GetMessagesAsync: dequeued with ControlQueueVisibility-
        Timeout, so none another host dequeued), hidden from the others until that timeout."""
        at = now.timestamp()
        pending = store.pending(instance_id, execution_id, viewer=owner, now=at)
        if pending.messages:
            try:
                store.hide([i for i, _ in pending.messages], owner, at + self.settings.control_queue_visibility_s)
            except sqlite3.Error as exc:  # the hub file busy past its timeout: read, not hidden
                log.warning("inbox messages of %s not marked as dequeued: %s", instance_id, exc)
        return pending

    def abandon(self, store: Store, pending: Pending) -> None:
        """An episode this host may not commit (its partition moved): its messages are the new holder's at once, as
        the partition manager drains a partition before it releases it."""
        if pending.messages:
            try:
                store.unhide([i for i, _ in pending.messages])
            except sqlite3.Error as exc:  # the hub file busy past its timeout: visible at the timeout instead
                log.warning("inbox messages not given back: %s", exc)

    def work_started(self, store: Store, item: WorkItem, now: datetime) -> None:
        """WorkItemQueue.GetMessageAsync dequeues with WorkItemQueueVisibilityTimeout: another host may run the
        activity only once that passes."""
        try:
            store.take_work(item.id, now.timestamp() + self.settings.work_item_visibility_s)
        except sqlite3.Error as exc:  # the hub file busy past its timeout: run, not hidden
            log.warning("work item %s not marked as dequeued: %s", item.id, exc)

    def enqueued(self, partition: int) -> None:
        poller = self._control.get(partition)
        if poller is not None:
            poller.reset()

    def work_enqueued(self) -> None:
        if self._work is not None:
            self._work.reset()

    def sync(self, engine: Dispatcher) -> None:
        """Start a poller for each partition held and not polled yet (a new ControlQueue polls at once), and the
        work-item poller; a poller stops at its first poll after its partition went."""
        hub = engine.hub
        if hub is None:
            return
        if self._hub is not hub:  # the engine (re)started: its pollers went with its tasks
            self._hub, self._control = hub, {}
            self._work = self._poller()
            engine._spawn(self._work.run(lambda: self._poll_work(engine, hub)), "durable-poll:work-items")
        for partition in sorted(hub.mine - set(self._control)):
            poller = self._control[partition] = self._poller()
            engine._spawn(poller.run(self._poll_control(engine, partition, poller)), f"durable-poll:{partition}")

    def _poll_control(self, engine: Dispatcher, partition: int, poller: BackoffPoller) -> Callable[[], bool]:
        def poll() -> bool:
            hub = engine.hub
            if (
                hub is None
                or hub is not self._hub
                or partition not in hub.mine
                or self._control.get(partition) is not poller
            ):
                if self._control.get(partition) is poller:
                    del self._control[partition]
                raise Released
            visible = {
                i: top
                for i, top in engine.store.visible_inbox(engine._clock().timestamp()).items()
                if hub.partition(i) == partition
            }
            handed = self._handed.get(partition, {})
            found = [i for i, top in visible.items() if i not in engine._running and handed.get(i) != top]
            self._handed[partition] = {i: top for i, top in visible.items() if i in handed or i in found}
            for instance_id in found:
                engine._mark(instance_id)
            return bool(found)

        return poll

    def _poll_work(self, engine: Dispatcher, hub: HubMembership) -> bool:
        if engine.hub is not hub:
            raise Released
        adopted = engine.store.adopt_work(hub.owner, hub.live or {hub.owner}, engine._clock().timestamp())
        for item in adopted:
            engine._spawn_work(item)
        return bool(adopted)


def timing_for(name: str, durable: Mapping[str, Any]) -> LocalTiming:
    """The timing `--timing NAME` selects, its settings from host.json `extensions.durableTask`."""
    if name == "local":
        return LocalTiming()
    if name == "azure-storage":
        return AzureStorageTiming(AzureStorageSettings.from_host_json(durable))
    raise ConfigError(f"--timing must be one of {', '.join(TIMINGS)}, not {name!r}")
