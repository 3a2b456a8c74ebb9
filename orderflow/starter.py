"""The Starter: claim Pending, unlocked, due records with a conditional (etag) update, then start the Scheduler.

The claim moves the record to Processing with LockedBy = `<orderId>:<attempt>` and CompleteBy = a claim lease,
before `start_new`. Two starters racing for one record: the second If-Match write fails with 412 and that starter
skips the record, so an attempt is scheduled once. A crash after the claim and before `start_new` leaves a Processing
record whose lease expires: the Supervisor recovers it like any expired attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from orderflow import function_names as fn
from orderflow.records import OrderStateRecord, instance_id
from orderflow.runtime import Services
from orderflow.state_machine import IllegalTransition, claim
from orderflow.store.errors import PreconditionFailed
from orderflow.workflow import WorkflowInput

log = logging.getLogger("orderflow.starter")

StartNew = Callable[[str, str, Any], Awaitable[Any]]  # (orchestrator name, instance id, input)


@dataclass
class StarterRun:
    claimed: list[str] = field(default_factory=list)
    lost_race: int = 0
    start_failed: list[str] = field(default_factory=list)
    already_running: list[str] = field(default_factory=list)  # start_new found this attempt's instance running


async def try_claim(services: Services, rec: OrderStateRecord, etag: str) -> WorkflowInput | None:
    """Claim one record for its next attempt; None when another starter won or the record is not claimable."""
    now = services.clock.now()
    instance = instance_id(rec.order_id, rec.attempt + 1)
    try:
        claimed = claim(rec, instance, now + services.tunables.claim_lease, now)
        await services.state.replace(claimed, etag)
    except (PreconditionFailed, IllegalTransition):
        return None
    return WorkflowInput(order_id=rec.order_id, attempt=claimed.attempt,
                         step_timeout_seconds=int(services.tunables.step_timeout.total_seconds()),
                         agent_retries=services.tunables.agent_retries)


async def start_claimed(start_new: StartNew, inp: WorkflowInput) -> None:
    await start_new(fn.ORDER_WORKFLOW, instance_id(inp.order_id, inp.attempt), inp.to_dict())


async def run_starter(services: Services, start_new: StartNew, *, limit: int | None = None) -> StarterRun:
    """One Starter pass over the claimable records (at most `StarterBatchSize`)."""
    result = StarterRun()
    batch = await services.state.query_claimable(services.clock.now(), limit or services.tunables.starter_batch)
    for rec, etag in batch:
        inp = await try_claim(services, rec, etag)
        if inp is None:
            result.lost_race += 1
            continue
        await _start(start_new, inp, result)
    return result


async def start_one(services: Services, start_new: StartNew, order_id: str) -> StarterRun:
    """The fast path: claim and start one order right after its submission (the timer poll is the safety net)."""
    result = StarterRun()
    current = await services.state.get(order_id)
    if current is None:
        return result
    inp = await try_claim(services, *current)
    if inp is None:
        result.lost_race += 1
    else:
        await _start(start_new, inp, result)
    return result


def is_already_running(exc: BaseException) -> bool:
    """Whether start_new failed because an instance with that id is still Pending/Running/ContinuedAsNew/Suspended.

    The extension answers such a start with HTTP 500 and the body of HttpRequestMessageExtensions.CreateErrorResponse
    (HttpApiHandler.HandleRequestAsync's generic catch of OrchestrationAlreadyExistsException, whose message is
    "An Orchestration instance with the status <status> already exists."), and the Python client's
    DurableOrchestrationClient.start_new raises Exception(<that body as a dict>).
    """
    body = exc.args[0] if exc.args else None
    message = body.get("ExceptionMessage") if isinstance(body, dict) else None
    return isinstance(message, str) and message.startswith("An Orchestration instance with the status") \
        and message.rstrip().endswith("already exists.")


async def _start(start_new: StartNew, inp: WorkflowInput, result: StarterRun) -> None:
    instance = instance_id(inp.order_id, inp.attempt)
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
