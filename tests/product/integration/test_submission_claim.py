"""The submission trigger's fast path creates a new order's state record already claimed (orderflow/submission.py
`submit(..., claim=True)`): Pending → Processing through the state machine's own `claim`, in one write instead of a
Pending create and a claim. Only when the circuit breaker is closed and admission control grants a slot; anything
else leaves a Pending record for the Starter, and a slot that was not used is given back.
"""

from __future__ import annotations

from dataclasses import replace

from support.integration_support import Pipeline, count_state_writes, encode, order_body, state_of

from orderflow import admission
from orderflow.records import ProcessState
from orderflow.submission import Accepted, submit

ORDER = "o-1"


async def processing_slots(p: Pipeline) -> int:
    """The stored Processing figure once this process's deferred exits are written (admission.exited)."""
    await admission.flush(p.services)
    return (await admission.read_figures(p.services))[0].processing


async def test_a_new_order_is_created_claimed_for_attempt_1_in_one_write(p: Pipeline) -> None:
    writes = count_state_writes(p, "create_if_absent", "replace")
    outcome = await submit(p.services, encode(order_body(ORDER)), ORDER, claim=True)
    assert isinstance(outcome, Accepted) and outcome.claimed is not None
    assert (outcome.claimed.order_id, outcome.claimed.attempt) == (ORDER, 1)
    rec = await state_of(p, ORDER)
    assert rec.process_state is ProcessState.PROCESSING and rec.locked_by == f"{ORDER}:1" and rec.attempt == 1
    assert rec.complete_by == p.clock.now() + p.services.tunables.claim_lease
    assert writes == ["create_if_absent"]
    assert await processing_slots(p) == 1


async def test_without_claim_the_record_is_pending_as_before(p: Pipeline) -> None:
    outcome = await submit(p.services, encode(order_body(ORDER)), ORDER)
    assert isinstance(outcome, Accepted) and outcome.claimed is None
    assert (await state_of(p, ORDER)).process_state is ProcessState.PENDING


async def test_a_duplicate_submission_claims_nothing_and_gives_its_slot_back(p: Pipeline) -> None:
    await submit(p.services, encode(order_body(ORDER)), ORDER, claim=True)
    writes = count_state_writes(p, "create_if_absent", "replace")
    again = await submit(p.services, encode(order_body(ORDER)), ORDER, claim=True)
    assert isinstance(again, Accepted) and again.claimed is None and not again.created
    assert writes == ["create_if_absent"]  # the create-if-absent found the record: nothing overwritten
    assert await processing_slots(p) == 1  # the first order's slot only


async def test_at_the_processing_bound_the_order_waits_pending_for_the_starter(p: Pipeline) -> None:
    p.services.tunables = replace(p.services.tunables, max_in_processing=0)
    outcome = await submit(p.services, encode(order_body(ORDER)), ORDER, claim=True)
    assert isinstance(outcome, Accepted) and outcome.claimed is None
    assert (await state_of(p, ORDER)).process_state is ProcessState.PENDING
    assert await processing_slots(p) == 0
