"""Data that ends (issue 26): finished orders expire, finished Durable instances are purged, an operator keeps one.

- A finished order (terminal, its status sent) gets the Cosmos DB per-item TTL FinishedOrderRetentionSeconds on its
  stored order and its state record (orderflow/notifications.py); nothing unfinished ever carries one.
- `run_purge`: the purge timer's pass over finished Durable instances created before now - InstanceRetentionSeconds,
  through `purge_instance_history_by` (terminal statuses only), in created-time windows from a checkpoint, at most
  PurgeMaxCallsPerRun calls a run; a window doubles after an empty call and halves after a call that deleted more
  than PurgeMaxInstancesPerCall.
- `keep_order`: an operator's hold: the order's two documents never expire (TTL -1), audited on the record.
Choices and caveats: docs/retention.md."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from orderflow import settings
from orderflow.clock import ensure_utc
from orderflow.errors import Conflict, NotFound, PreconditionFailed
from orderflow.records import TTL_NEVER, Kept, OrderStateRecord, format_utc, parse_utc
from orderflow.runtime import Services

log = logging.getLogger("orderflow.retention")

CHECKPOINT = "purge"
START = datetime(2000, 1, 1, tzinfo=UTC)  # where the first purge window starts (before any instance)
# Runtime statuses of a finished instance (OrchestrationRuntimeStatus): a Running, Pending or Suspended instance is
# never named, so never purged.
FINISHED_STATUSES = ("Completed", "Failed", "Terminated", "Canceled")
MIN_WINDOW = timedelta(seconds=1)
# DurableOrchestrationClient.purge_instance_history_by(created_time_from, created_time_to, runtime_status): the
# instances deleted (PurgeHistoryResult.instances_deleted).
PurgeBy = Callable[[datetime, datetime, list[Any]], Awaitable[int]]


@dataclass(frozen=True)
class Retention:
    """The purge timer's settings: `instances` None never purges. (FinishedOrderRetentionSeconds is a tunable:
    `Tunables.finished_ttl`, read where the notification sets it.)"""

    instances: timedelta | None
    window: timedelta
    max_per_call: int
    max_calls: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Retention:
        def n(name: str, least: int) -> int:
            value = settings.get_int(name, env)
            if value < least:
                raise ValueError(f"app setting {name} must be at least {least}, got {value}")
            return value

        instances = n("InstanceRetentionSeconds", 0)
        return cls(
            instances=timedelta(seconds=instances) if instances else None,
            window=timedelta(seconds=n("PurgeWindowSeconds", 1)),
            max_per_call=n("PurgeMaxInstancesPerCall", 1),
            max_calls=n("PurgeMaxCallsPerRun", 1),
        )


@dataclass
class PurgeRun:
    calls: int = 0
    deleted: int = 0
    position: datetime | None = None  # created-time up to which finished instances are purged
    window: timedelta | None = None  # the next call's width


async def run_purge(services: Services, purge_by: PurgeBy, retention: Retention | None = None) -> PurgeRun:
    """One pass of the purge timer. Each call purges finished instances created in [position, position + window),
    never past now - InstanceRetentionSeconds; the position and the window are checkpointed (etag-guarded: of two
    concurrent runs, the one that saves second keeps the other's position, both safe)."""
    cfg = retention or Retention.from_env()
    run = PurgeRun()
    if cfg.instances is None:
        return run
    cutoff = services.clock.now() - cfg.instances
    found = await services.state.get_checkpoint(CHECKPOINT)
    etag = None if found is None else found[1]
    position = START if found is None else parse_utc(found[0]["position"])
    window = cfg.window if found is None else timedelta(seconds=float(found[0]["windowSeconds"]))
    while run.calls < cfg.max_calls and position < cutoff:
        end = min(position + window, cutoff)
        deleted = await purge_by(position, end, list(FINISHED_STATUSES))
        run.calls += 1
        run.deleted += deleted
        position = end
        if deleted == 0:
            window *= 2
        elif deleted > cfg.max_per_call:
            window = max(window / 2, MIN_WINDOW)
    run.position, run.window = position, window
    if run.calls:
        data = {"position": format_utc(position), "windowSeconds": window.total_seconds(), "deleted": run.deleted}
        try:
            await services.state.put_checkpoint(CHECKPOINT, data, etag)
        except (PreconditionFailed, Conflict):
            log.info("purge checkpoint moved by another instance; keeping theirs")
        log.info("purge: %d calls, %d finished instances deleted, up to %s", run.calls, run.deleted, data["position"])
    return run


def durable_purge(client: Any) -> PurgeBy:
    """`PurgeBy` over a DurableOrchestrationClient."""
    from azure.durable_functions import OrchestrationRuntimeStatus

    async def purge_by(start: datetime, end: datetime, statuses: list[Any]) -> int:
        result = await client.purge_instance_history_by(
            created_time_from=start,
            created_time_to=end,
            runtime_status=[OrchestrationRuntimeStatus(s) for s in statuses],
        )
        return int(result.instances_deleted)

    return purge_by


async def expire_finished(services: Services, rec: OrderStateRecord, ttl: int | None) -> None:
    """The stored order of a finished order gets its TTL before the state record does (the notification's write):
    a crash in between leaves the notification owed, and the sweep sets both again. A kept order, or no retention,
    writes nothing; a stored order that is gone is nothing to expire."""
    if ttl is None or rec.ttl == TTL_NEVER:
        return
    try:
        await services.orders.set_ttl(rec.order_id, ttl)
    except NotFound:
        log.warning("order %s has no stored order to expire", rec.order_id)


def keep(rec: OrderStateRecord, now: datetime, by: str, reason: str) -> OrderStateRecord:
    """An operator's hold (`orderflow keep`): the record never expires (TTL_NEVER), whatever its state, audited. Not a
    state change; keeping a kept order again is a no-op."""
    if rec.ttl == TTL_NEVER and rec.kept is not None:
        return rec
    held = Kept(at=ensure_utc(now), by=by, reason=reason)
    return rec.model_copy(update={"ttl": TTL_NEVER, "kept": held, "updated_at": ensure_utc(now)})


async def keep_order(services: Services, key: str, by: str, reason: str) -> OrderStateRecord:
    """An operator's hold on order `key`: its state record, then its stored order, never expire. Repeatable."""
    now = services.clock.now()
    rec, _ = await services.state.update_with_retry(key, lambda r: keep(r, now, by, reason))
    try:
        await services.orders.set_ttl(key, TTL_NEVER)
    except NotFound:
        log.warning("order %s has no stored order to keep", key)
    return rec
