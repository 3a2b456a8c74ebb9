"""ADVANCE_ORDER (workflow version 3) through the real activity, on the embedded store and broker: one fenced state
write per decision point, the Agent request after it, the terminal notification at the end, and nothing written or
sent twice when the activity runs again (Durable activities are at-least-once).
"""

from __future__ import annotations

from typing import Any

import pytest
from azure.servicebus.exceptions import ServiceBusServerBusyError
from support.integration_support import Pipeline, claim_orders, count_state_writes, state_activity, state_of

import activities.state
from orderflow import function_names as fn
from orderflow.messages import AgentRequest, OrderStatus
from orderflow.records import ProcessState, StepStatus, format_utc
from orderflow.state_machine import recover
from orderflow.workflow import WORKFLOW_VERSION

ORDER = "o-1"
FIRST = f"{ORDER}:1"
RESERVE, CHARGE, SHIP = "reserve-inventory", "charge-payment", "arrange-shipping"


async def advance(
    p: Pipeline, result: dict[str, Any] | None = None, *, instance: str = FIRST, cancel: bool = False
) -> Any:
    complete_by = p.clock.now() + p.services.tunables.step_timeout
    return await state_activity(fn.ADVANCE_ORDER)(
        {
            "orderId": ORDER,
            "instanceId": instance,
            "attempt": 1,
            "workflowVersion": WORKFLOW_VERSION,
            "agentRetries": 4,
            "completeBy": format_utc(complete_by),
            "result": result,
            "cancel": cancel,
        }
    )


async def requests(p: Pipeline) -> list[AgentRequest]:
    """The Agent requests on agent-requests (peeked, left in place)."""
    async with p.services.bus.get_queue_receiver(
        p.services.tunables.agent_requests_queue, session_id=ORDER
    ) as receiver:
        peeked = await receiver.peek_messages(max_message_count=50)
    return [AgentRequest.model_validate_json(b"".join(m.body)) for m in peeked]


def ok(step: str) -> dict[str, Any]:
    return {"step": step, "status": "succeeded", "error": None}


async def test_the_happy_path_is_one_write_per_decision_and_one_request_per_step(p: Pipeline) -> None:
    await claim_orders(p, ORDER)
    writes = count_state_writes(p)
    assert await advance(p) == {"send": RESERVE}
    assert await advance(p, ok(RESERVE)) == {"send": CHARGE}
    assert await advance(p, ok(CHARGE)) == {"send": SHIP}
    assert writes.count("replace") == 3
    sent = await requests(p)
    assert [(r.step.value, r.instance_id, r.idempotency_key, r.max_retries) for r in sent] == [
        (s, FIRST, f"{ORDER}:{s}", 4) for s in (RESERVE, CHARGE, SHIP)
    ]
    rec = await state_of(p, ORDER)
    assert sent[-1].deadline == rec.complete_by and rec.step(SHIP).status is StepStatus.RUNNING
    assert sent[0].payload["orderId"] == ORDER and sent[0].payload["items"]
    assert await advance(p, ok(SHIP)) == {"done": "Processed"}
    rec = await state_of(p, ORDER)
    assert rec.process_state is ProcessState.PROCESSED and rec.notified_at is not None
    assert [s.state for s in await p.statuses(ORDER)][-1] is OrderStatus.COMPLETED
    # Processed, then marked notified: the four decisions wrote the record five times in all.
    assert writes.count("replace") == 5


async def test_a_repeated_decision_writes_nothing_and_sends_nothing_new(p: Pipeline) -> None:
    await claim_orders(p, ORDER)
    assert await advance(p) == {"send": RESERVE}
    assert await advance(p, ok(RESERVE)) == {"send": CHARGE}
    writes = count_state_writes(p)
    assert await advance(p, ok(RESERVE)) == {"send": CHARGE}  # the activity ran again (at-least-once)
    assert writes == []
    assert [r.step.value for r in await requests(p)] == [RESERVE, CHARGE]  # duplicate detection took the resend


async def test_a_repeated_final_decision_sends_the_status_once(p: Pipeline) -> None:
    await claim_orders(p, ORDER)
    await advance(p)
    for step, following in ((RESERVE, CHARGE), (CHARGE, SHIP)):
        assert await advance(p, ok(step)) == {"send": following}
    assert await advance(p, ok(SHIP)) == {"done": "Processed"}
    writes = count_state_writes(p)
    assert await advance(p, ok(SHIP)) == {"done": "Processed"}
    assert writes == []
    assert [s.state for s in await p.statuses(ORDER)].count(OrderStatus.COMPLETED) == 1


async def test_a_superseded_attempt_is_answered_none_and_writes_nothing(p: Pipeline) -> None:
    await claim_orders(p, ORDER)
    assert await advance(p) == {"send": RESERVE}
    p.clock.advance(p.services.tunables.step_timeout.total_seconds() + 1)
    await p.services.state.update_with_retry(
        ORDER, lambda r: recover(r, FIRST, p.clock.now(), 3, lambda n: p.services.tunables.step_timeout)
    )
    writes = count_state_writes(p)
    assert await advance(p, ok(RESERVE)) is None
    assert writes == []
    assert (await state_of(p, ORDER)).step(RESERVE).status is StepStatus.RUNNING  # the late success is not recorded


async def test_a_permanent_failure_dispatches_the_compensation_in_the_same_write(p: Pipeline) -> None:
    await claim_orders(p, ORDER)
    await advance(p)
    await advance(p, ok(RESERVE))
    writes = count_state_writes(p)
    failed = {"step": CHARGE, "status": "failed", "error": "declined", "cause": "charge-payment: Declined: declined"}
    assert await advance(p, failed) == {"send": "release-inventory"}
    assert writes.count("replace") == 1
    rec = await state_of(p, ORDER)
    assert rec.process_state is ProcessState.COMPENSATING and rec.last_error == failed["cause"]
    assert [r.step.value for r in await requests(p)][-1] == "release-inventory"
    done = await advance(p, {"step": "release-inventory", "status": "succeeded", "error": None, "undone": True})
    assert done == {"done": "Compensated"}
    assert [s.state for s in await p.statuses(ORDER)][-1] is OrderStatus.COMPENSATED


async def test_a_bus_outage_before_the_step_deadline_is_waited_out_in_the_activity(
    p: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24 (the bus-outage drill): the request refused by a busy bus is sent again in place until the step's
    CompleteBy. Before, the activity raised: retried 3 times 1 s apart, then the attempt ended for the Supervisor to
    count as a failure (FailureThreshold of them end the order)."""
    waits: list[float] = []

    async def sleep(seconds: float) -> None:  # the clock moves as the wait would
        waits.append(seconds)
        p.clock.advance(seconds)

    monkeypatch.setattr(p.clock, "sleep", sleep, raising=False)
    send, refusals = activities.state.send_agent_request, [ServiceBusServerBusyError(message="busy")] * 2

    async def busy_then_up(*args: Any) -> None:
        if refusals:
            raise refusals.pop()
        await send(*args)

    monkeypatch.setattr(activities.state, "send_agent_request", busy_then_up)
    await claim_orders(p, ORDER)
    assert await advance(p) == {"send": RESERVE}
    assert waits == [0.5, 1.0]
    assert [r.step.value for r in await requests(p)] == [RESERVE]
