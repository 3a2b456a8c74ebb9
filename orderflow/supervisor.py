"""The Supervisor: find Processing records whose CompleteBy expired and recover or escalate them.

Each run scans bounded CompleteBy windows from an etag-guarded checkpoint, so no expired record is skipped, even
after a downtime. An attempt whose orchestration never started is started again (state_machine.restart),
FailureCount unchanged. Recovery is a conditional update fenced on the expired LockedBy: FailureCount+1, then Pending
with backoff, or at FailureThreshold Error + operator alert + status `failed`; two Supervisors never double-recover.
Each run ends with the sweep of owed terminal notifications (orderflow/notifications.py). A record skipped for a
reason that may pass holds the checkpoint; one skipped because another writer won does not.
The scan, the restart and the checkpoint rules in detail: docs/modules-product.md."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from orderflow import admission, telemetry
from orderflow.errors import Conflict, NotFound, PreconditionFailed, is_transient
from orderflow.notifications import entered_end, sweep_unnotified
from orderflow.records import TERMINAL_STATES, OrderStateRecord, ProcessState, format_utc, parse_utc
from orderflow.recovery_index import ExpiredSource, ScanCost, expired_source, index_deadline, update_indexed
from orderflow.runtime import Services
from orderflow.starter import DurableStarts, StarterRun, never_started, start_attempt, workflow_input
from orderflow.state_machine import Fenced, IllegalTransition, recover, restart

log = logging.getLogger("orderflow.supervisor")

CHECKPOINT = "supervisor"
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
# Records written by another instance with a slightly skewed clock may carry a CompleteBy a little in the past:
# the checkpoint never moves closer to now than this, so such a record is still scanned.
CLOCK_SKEW = timedelta(seconds=60)


@dataclass
class SupervisorRun:
    scanned: int = 0
    recovered: list[str] = field(default_factory=list)
    escalated: list[str] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)  # never-started attempts started again (no FailureCount)
    skipped: int = 0  # held ones included
    held: list[str] = field(default_factory=list)  # skipped for a reason that may pass: seen again next run
    hold: datetime | None = None  # the earliest CompleteBy among `held`: the checkpoint stays at or before it
    request_charge: float = 0.0
    position: datetime | None = None
    notified: int = 0  # owed terminal notifications sent by this run's sweep
    cost: ScanCost = field(default_factory=ScanCost)  # queries, documents, point reads, stale index entries
    reads: str = "query"  # what this run read: the CompleteBy query, or the recovery index (reads_index)

    @property
    def handled(self) -> int:
        """Expired records dealt with in this run (the result budget counts them)."""
        return len(self.recovered) + len(self.escalated) + len(self.restarted) + self.skipped

    def hold_for(self, rec: OrderStateRecord) -> None:
        """Skip `rec` for now and keep the checkpoint at or before its CompleteBy."""
        self.skipped += 1
        self.held.append(rec.order_id)
        if rec.complete_by is not None and (self.hold is None or rec.complete_by < self.hold):
            self.hold = rec.complete_by


@dataclass(frozen=True)
class Checkpoint:
    """The Supervisor's checkpoint: its position, the etag it was read with, and, in index mode, since when the
    writers write the recovery index (`index_since`; None in query mode)."""

    position: datetime
    etag: str | None
    index_since: datetime | None


async def _load_checkpoint(services: Services, now: datetime) -> Checkpoint:
    """The checkpoint, with `index_since` as this run sees it: in index mode, EPOCH on a new deployment (no
    checkpoint: every order's entries are written from its start), the stored moment, or now when the mode has just
    changed from query (the writers start writing with this deployment)."""
    current = await services.state.get_checkpoint(CHECKPOINT)
    index = services.tunables.scan_mode == "index"
    if current is None:
        return Checkpoint(EPOCH, None, EPOCH if index else None)
    data, etag = current
    since = (parse_utc(data["indexSince"]) if "indexSince" in data else now) if index else None
    return Checkpoint(parse_utc(data["position"]), etag, since)


def reads_index(services: Services, checkpoint: Checkpoint) -> bool:
    """Whether this run reads the recovery index: in index mode, once the checkpoint's position has passed every
    CompleteBy written before the writers wrote entries (index_since + the longest CompleteBy, + CLOCK_SKEW for a
    straggling instance of the previous deployment). Until then the CompleteBy query finds those orders."""
    t = services.tunables
    if checkpoint.index_since is None:
        return False
    covered = checkpoint.index_since + max(t.claim_lease, t.step_timeout) + CLOCK_SKEW
    return checkpoint.index_since == EPOCH or checkpoint.position >= covered


def last_run(run: SupervisorRun, at: datetime) -> dict[str, Any]:
    """What the checkpoint keeps of the run that wrote it: the ops summary's "Supervisor's last run with its scan
    cost" (`orderflow summary`, GET /api/ops/summary)."""
    return {
        "at": format_utc(at),
        "scanned": run.scanned,
        "recovered": len(run.recovered),
        "escalated": len(run.escalated),
        "restarted": len(run.restarted),
        "requestCharge": run.request_charge,
        "queries": run.cost.queries,
        "documents": run.cost.documents,
        "pointReads": run.cost.point_reads,
    }


async def _save_position(
    services: Services, position: datetime, checkpoint: Checkpoint, run: SupervisorRun, now: datetime
) -> None:
    try:
        data: dict[str, Any] = {"position": format_utc(position), "lastRun": last_run(run, now)}
        if checkpoint.index_since is not None:
            data["indexSince"] = format_utc(checkpoint.index_since)
        await services.state.put_checkpoint(CHECKPOINT, data, checkpoint.etag)
    except (PreconditionFailed, Conflict):
        # Another Supervisor moved the checkpoint meanwhile; its position is as good as ours (both are safe).
        log.info("supervisor checkpoint moved by another instance; keeping theirs")


async def run_supervisor(services: Services, durable: DurableStarts | None = None) -> SupervisorRun:
    """One Supervisor pass. The trigger passes its Durable client as `durable`; without one (no orchestration
    status to ask), every expired attempt is recovered as a failure."""
    t = services.tunables
    now = services.clock.now()
    checkpoint = await _load_checkpoint(services, now)
    position = checkpoint.position
    run = SupervisorRun()
    run.reads = "index" if reads_index(services, checkpoint) else "query"
    source = expired_source(services.state, services.index, run.reads, run.cost)
    while run.handled < t.max_results:
        end = min(position + t.scan_window, now)
        drained = await _scan_window(source, services, run, position, end, durable)
        if not drained:
            break  # result budget used up inside this window: resume from the same position next run
        if end >= now:
            position = max(position, min(end, now - CLOCK_SKEW))
            break
        first, charge = await source.first_expired(end, now)
        run.request_charge += charge
        if first is None:
            position = max(position, now - CLOCK_SKEW)
            break
        position = max(first, end)
    if run.hold is not None:  # never past a record skipped for a reason that may pass (never before the start)
        position = min(position, run.hold)
    run.position = position
    await _save_position(services, position, checkpoint, run, now)
    run.notified = await sweep_unnotified(services)
    log.info(
        "supervisor scan (%s): %d expired, %d recovered, %d escalated, %d restarted, %d held, %.2f RU, "
        "%d queries, %d documents, %d point reads, %d stale index entries, position %s",
        t.scan_mode if run.reads == t.scan_mode else f"{t.scan_mode}, reading {run.reads}",
        run.scanned,
        len(run.recovered),
        len(run.escalated),
        len(run.restarted),
        len(run.held),
        run.request_charge,
        run.cost.queries,
        run.cost.documents,
        run.cost.point_reads,
        run.cost.stale,
        format_utc(position),
    )
    telemetry.record_supervisor_scan(run.request_charge, len(run.recovered), len(run.escalated))
    return run


async def _scan_window(
    source: ExpiredSource,
    services: Services,
    run: SupervisorRun,
    start: datetime,
    end: datetime,
    durable: DurableStarts | None,
) -> bool:
    """Recover the expired records of one window. True when the window is drained.

    The pages are read first (bounded by the result budget) and recovered after, so that records leaving the result
    set during the scan cannot shift a continuation token past others.
    """
    t = services.tunables
    budget = t.max_results - run.handled
    found: list[OrderStateRecord] = []
    continuation: str | None = None
    while len(found) < budget:
        page = await source.query_expired(start, end, min(t.page_size, budget - len(found)), continuation)
        run.request_charge += page.request_charge
        found.extend(rec for rec, _etag in page.items)
        continuation = page.continuation
        if continuation is None:
            break
    for rec in found[:budget]:
        run.scanned += 1
        await _recover_one(services, run, rec, durable)
    return continuation is None and len(found) <= budget


async def _recover_one(
    services: Services, run: SupervisorRun, seen: OrderStateRecord, durable: DurableStarts | None
) -> None:
    t = services.tunables
    expired_by = seen.locked_by
    if expired_by is None:
        run.skipped += 1
        return
    now = services.clock.now()
    if (
        durable is not None
        and seen.restarts < t.failure_threshold
        and await _restarted(services, run, seen, expired_by, durable)
    ):
        return
    try:
        rec, _ = await update_indexed(  # the expired entry is superseded: removed after the write
            services.state,
            services.index,
            seen.order_id,
            lambda r: recover(r, expired_by, now, t.failure_threshold, t.backoff),
        )
    except (Fenced, IllegalTransition, NotFound, PreconditionFailed):
        run.skipped += 1  # another Supervisor or the Scheduler got there first
        return
    except Exception as exc:
        if not is_transient(exc):
            raise
        log.warning("recovery of %s failed transiently (%s); it is looked at again next run", seen.order_id, exc)
        run.hold_for(seen)
        return
    try:
        if seen.process_state is ProcessState.PROCESSING:  # out of Processing: its admission slot is free
            await admission.exited(services, now)
    except Exception:
        log.exception("admission slot of %s not freed; the next refresh corrects it", rec.order_id)
    if rec.process_state in TERMINAL_STATES:
        run.escalated.append(rec.order_id)
        try:
            await entered_end(services, rec)
        except Exception:  # the record is terminal with notifiedAt null: the sweep sends it on a later run
            log.exception("escalation notice for %s failed; the sweep will send it", rec.order_id)
    else:
        run.recovered.append(rec.order_id)


async def _restarted(
    services: Services, run: SupervisorRun, seen: OrderStateRecord, expired_by: str, durable: DurableStarts
) -> bool:
    """Start the expired attempt again when its orchestration was never started. False: it exists, recover it."""
    try:
        status = await durable.get_status(expired_by)
    except Exception:  # the Durable API is unreachable: spend nothing, look again next run
        log.exception("orchestration status of %s unknown; it is looked at again next run", expired_by)
        run.hold_for(seen)
        return True
    if not never_started(status):
        return False
    now = services.clock.now()
    lease_until = now + services.tunables.claim_lease
    try:
        ahead = await index_deadline(services.index, seen.order_id, lease_until, expired_by)
        rec, _ = await update_indexed(
            services.state, services.index, seen.order_id, lambda r: restart(r, expired_by, lease_until, now), ahead
        )
    except (Fenced, IllegalTransition, NotFound, PreconditionFailed):
        run.skipped += 1  # started meanwhile (its Scheduler moved CompleteBy), or another Supervisor won
        return True
    except Exception as exc:
        if not is_transient(exc):
            raise
        log.warning("restart of %s failed transiently (%s); it is looked at again next run", expired_by, exc)
        run.hold_for(seen)
        return True
    log.warning("attempt %s was claimed but never started; starting it again (restart %d)", expired_by, rec.restarts)
    await start_attempt(durable.start_new, workflow_input(services, rec), StarterRun())
    run.restarted.append(rec.order_id)
    return True
