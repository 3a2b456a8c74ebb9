"""The Starter: claim Pending, unlocked, due records with a conditional (etag) update, then start the Scheduler.

The claim moves the record to Processing with LockedBy = `<orderId>:<attempt>` and CompleteBy = a claim lease,
before `start_new`. Two starters racing for one record: the second If-Match write fails with 412 and that starter
skips the record, so an attempt is scheduled once. A crash after the claim and before `start_new` leaves a Processing
record whose lease expires: the Supervisor finds that attempt's orchestration missing and starts it (same attempt,
no FailureCount; orderflow/supervisor.py), so a crash there delays the order and costs it nothing.

Tracing: the claim and the start are spans of the order's trace, whose context the submission stored on the record
(`traceparent`); the start hands its own span to the Scheduler in the input, and the Scheduler to each activity.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from orderflow import admission, tracing
from orderflow import function_names as fn
from orderflow.breaker import BreakerConfig, SharedBreaker
from orderflow.errors import PreconditionFailed
from orderflow.records import CLAIMABLE_STATES, OrderStateRecord, ProcessState, instance_id
from orderflow.recovery_index import index_deadline, superseded
from orderflow.runtime import Services
from orderflow.state_machine import IllegalTransition, claim
from orderflow.workflow import WORKFLOW_VERSION, WorkflowInput

log = logging.getLogger("orderflow.starter")

StartNew = Callable[[str, str, Any], Awaitable[Any]]  # (orchestrator name, instance id, input)
GetStatus = Callable[[str], Awaitable[Any]]  # DurableOrchestrationClient.get_status(instance id)


@dataclass(frozen=True)
class DurableStarts:
    """The two Durable client calls the Supervisor needs to start a claim whose orchestration never started."""

    start_new: StartNew
    get_status: GetStatus


def never_started(status: Any) -> bool:
    """Whether a `get_status` answer means "no instance with that id".

    The extension answers 404 with no body for an unknown instance (HttpApiHandler.HandleGetStatusRequestAsync), and
    DurableOrchestrationClient.get_status (azure-functions-durable 1.x) turns a 404 into
    DurableOrchestrationStatus.from_json("") — a status whose runtime_status is None. Every existing instance,
    Pending included, has a runtime status."""
    return getattr(status, "runtime_status", None) is None


@dataclass
class StarterRun:
    claimed: list[str] = field(default_factory=list)
    lost_race: int = 0
    start_failed: list[str] = field(default_factory=list)
    already_running: list[str] = field(default_factory=list)  # start_new found this attempt's instance running
    not_admitted: int = 0  # claims not made, or given back, because MaxOrdersInProcessing was reached
    breaker_limit: int | None = None  # claims the remote service's circuit breaker allowed (None: closed)


async def try_claim(services: Services, rec: OrderStateRecord, etag: str) -> WorkflowInput | None:
    """Claim one record for its next attempt; None when another starter won or the record is not claimable."""
    now = services.clock.now()
    instance = instance_id(rec.order_id, rec.attempt + 1)
    with tracing.span(
        "orderflow.starter.claim", parent=rec.traceparent, attributes=tracing.order_attributes(rec.order_id, instance)
    ) as span:
        try:
            claimed = claim(rec, instance, now + services.tunables.claim_lease, now)
            ahead = await index_deadline(services.index, rec.order_id, claimed.complete_by or now, instance)
            await services.state.replace(claimed, etag)
        except (PreconditionFailed, IllegalTransition):
            span.set_attribute("orderflow.claimed", False)
            return None  # a lost race leaves its entry ahead stale: removing it blindly could remove the winner's
        await superseded(services.index, rec, claimed, ahead)  # a compensation's earlier entry, if it had one
    return workflow_input(services, claimed)


def workflow_input(services: Services, rec: OrderStateRecord) -> WorkflowInput:
    """The Scheduler's input for the record's current attempt."""
    return WorkflowInput(
        order_id=rec.order_id,
        attempt=rec.attempt,
        step_timeout_seconds=int(services.tunables.step_timeout.total_seconds()),
        agent_retries=services.tunables.agent_retries,
        workflow_version=WORKFLOW_VERSION,
        traceparent=rec.traceparent,
    )


async def start_claimed(start_new: StartNew, inp: WorkflowInput) -> None:
    await start_new(fn.ORDER_WORKFLOW, instance_id(inp.order_id, inp.attempt), inp.to_dict())


async def claims_allowed(services: Services) -> int | None:
    """Claims the remote service's circuit breaker allows now: None = no limit (closed), 0 while open, the probes
    left while half-open. A breaker that cannot be read does not stop claiming (it fails open)."""
    if services.breakers is None:
        return None
    try:
        breaker = SharedBreaker(
            services.breakers, services.tunables.remote_service, BreakerConfig.from_env(), services.clock
        )
        if not breaker.config.enabled:
            return None  # CircuitBreakerFailureThreshold 0: the breaker is off
        view = await breaker.view()
    except Exception:
        log.exception("circuit breaker unreadable; claiming as if it were closed")
        return None
    return view.claims_allowed() if view else None


async def run_starter(services: Services, start_new: StartNew, *, limit: int | None = None) -> StarterRun:
    """One Starter pass: refresh the admission figures, then claim due records (at most `StarterBatchSize`, at most
    what the circuit breaker allows, none past MaxOrdersInProcessing) and start their Scheduler."""
    result = StarterRun()
    figures = await admission.refresh(services)
    result.breaker_limit = await claims_allowed(services)
    room = max(0, services.tunables.max_in_processing - figures.processing)
    size = limit or services.tunables.starter_batch
    allowed = result.breaker_limit if result.breaker_limit is not None else size
    wanted = min(size, allowed)
    if wanted <= 0:
        return result
    # Ask for the room left only; a compensation needs no Processing slot, so while Processing is full the run asks
    # for compensations alone (they never wait behind new orders).
    if room > 0:
        batch = await due_fairly(services, min(wanted, room), turn=figures.turn)
    else:
        batch = await due_fairly(services, wanted, (ProcessState.COMPENSATING,), turn=figures.turn)
    await _claim_within_the_bound(services, start_new, batch, result)
    return result


async def due_fairly(
    services: Services, limit: int, states: tuple[ProcessState, ...] = CLAIMABLE_STATES, *, turn: int = 0
) -> list[tuple[OrderStateRecord, str]]:
    """At most `limit` claimable records, shared among the submitting apps with due work: round-robin, each round
    taking every app's next record (each app's in the store's own order), the rounds starting from app `turn` (mod
    the number of apps; the Starter passes its run count, so that the first slot goes to each app in turn even when
    only one slot is free). With one app, the store's order. So an app's flood of Pending orders takes its share of
    MaxOrdersInProcessing, never another app's."""
    now, apps = services.clock.now(), services.tunables.apps
    if len(apps.names) == 1:
        return await services.state.query_claimable(now, limit, states)
    names = [apps.names[(turn + i) % len(apps.names)] for i in range(len(apps.names))]
    queues = [await services.state.query_claimable(now, limit, states, keys=apps.keys_of(a)) for a in names]
    rounds = itertools.zip_longest(*queues)
    return [v for round_ in rounds for v in round_ if v is not None][:limit]


async def start_one(services: Services, start_new: StartNew, order_id: str) -> StarterRun:
    """The fast path: claim and start one order right after its submission (the timer poll is the safety net),
    within the circuit breaker and the Processing bound like any claim."""
    result = StarterRun()
    result.breaker_limit = await claims_allowed(services)
    if result.breaker_limit is not None:
        return result  # open or half-open: only the Starter's timer claims, at most the probes left
    current = await services.state.get(order_id)
    if current is not None:
        await _claim_within_the_bound(services, start_new, [current], result)
    return result


async def _claim_within_the_bound(
    services: Services, start_new: StartNew, batch: list[tuple[OrderStateRecord, str]], result: StarterRun
) -> None:
    """Reserve Processing slots first (orderflow/admission.py), claim at most that many records, give back the slots
    of records another Starter won, then start the Scheduler of each claim. Every claim lands before the first
    `start_new`, well inside admission.RESERVATION_GRACE of its slot."""
    if not batch:
        return
    # A compensation (CompensationInProgress) needs no slot: it undoes work and left Processing already.
    forward = [(rec, etag) for rec, etag in batch if rec.process_state is ProcessState.PENDING]
    undo = [(rec, etag) for rec, etag in batch if rec.process_state is not ProcessState.PENDING]
    owners = [services.tunables.apps.owner_of(rec.order_id, rec.app, rec.reply_to) for rec, _ in forward]
    slots = await admission.reserve(services, len(forward), owners) if forward else 0
    result.not_admitted += len(forward) - slots
    claimed: list[WorkflowInput] = []
    won = 0
    for rec, etag in [*forward[:slots], *undo]:
        inp = await try_claim(services, rec, etag)
        if inp is None:
            result.lost_race += 1
            continue
        claimed.append(inp)
        won += rec.process_state is ProcessState.PENDING
    await admission.release(services, slots - won)
    for inp in claimed:
        await start_attempt(start_new, inp, result)


def is_already_running(exc: BaseException) -> bool:
    """Whether start_new failed because an instance with that id is still Pending/Running/ContinuedAsNew/Suspended.

    The extension answers such a start with HTTP 500 and the body of HttpRequestMessageExtensions.CreateErrorResponse
    (HttpApiHandler.HandleRequestAsync's generic catch of OrchestrationAlreadyExistsException, whose message is
    "An Orchestration instance with the status <status> already exists."), and the Python client's
    DurableOrchestrationClient.start_new raises Exception(<that body as a dict>).
    """
    body = exc.args[0] if exc.args else None
    message = body.get("ExceptionMessage") if isinstance(body, dict) else None
    return (
        isinstance(message, str)
        and message.startswith("An Orchestration instance with the status")
        and message.rstrip().endswith("already exists.")
    )


async def start_attempt(start_new: StartNew, inp: WorkflowInput, result: StarterRun) -> None:
    instance = instance_id(inp.order_id, inp.attempt)
    with tracing.span(
        "orderflow.starter.start", parent=inp.traceparent, attributes=tracing.order_attributes(inp.order_id, instance)
    ):
        traceparent = tracing.current_traceparent()  # this span: the parent of the attempt's activities
        await _start(
            start_new,
            inp if traceparent == inp.traceparent else inp.model_copy(update={"traceparent": traceparent}),
            instance,
            result,
        )


async def _start(start_new: StartNew, inp: WorkflowInput, instance: str, result: StarterRun) -> None:
    try:
        await start_claimed(start_new, inp)
        result.claimed.append(instance)
    except Exception as exc:
        if is_already_running(exc):
            # This attempt's orchestration exists and runs (an earlier start_new reached the host although its
            # caller saw an error): it drives the record; nothing to recover.
            log.info("start_new for %s: the instance is already running; leaving it to run", instance)
            result.already_running.append(instance)
            return
        # The claim stands; its lease expires and the Supervisor recovers it.
        log.exception("start_new failed for %s after the claim; the Supervisor will recover it", instance)
        result.start_failed.append(instance)
