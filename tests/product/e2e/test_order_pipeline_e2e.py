"""End to end on devhost: the whole order pipeline as OS processes (devhost running function_app.py, the
Agent, the remote-service simulator) over the embedded broker and store, driven as a client app would
drive it.

Spec: seed 000/001 "Interactions" and the "Example" sections (Submission, Scheduling, Execution,
Supervision, Status reporting). Faults are injected on purpose with the simulator's scripted faults (per
idempotency key or orderId, per call number). One system per module, fresh order ids per test, short
settings (e2e_support).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusAuthorizationError
from support.e2e_support import Client, make_order, new_order_id
from support.hosted import wait_until

from lab.system import ROOT
from orderflow.adapters import bus_from_connection_string, open_stores
from orderflow.embedded.connection import connection_identity, store_identity
from orderflow.embedded.rights import AGENT, FUNCTION_APP
from orderflow.errors import StoreError
from orderflow.messages import (
    STEPS,
    AgentOutcome,
    AgentReply,
    AlertKind,
    OrderStatus,
    StepName,
    idempotency_key,
    reply_event_name,
)
from orderflow.records import ProcessState, StepStatus

RESERVE, CHARGE, SHIP = (step.value for step in STEPS)
ONE_EFFECT_PER_STEP = {RESERVE: 1, CHARGE: 1, SHIP: 1}
RECOVERY_TIMEOUT = 45.0


def assert_processed_by(client: Client, order_id: str, attempt: int, failure_count: int) -> None:
    rec = client.state(order_id)
    assert rec is not None
    assert (rec.process_state, rec.locked_by, rec.attempt, rec.failure_count) == (
        ProcessState.PROCESSED,
        f"{order_id}:{attempt}",
        attempt,
        failure_count,
    )
    assert [s.status for s in rec.steps] == [StepStatus.SUCCEEDED] * 3
    assert client.effects(order_id) == ONE_EFFECT_PER_STEP


def test_happy_path_received_then_completed_with_one_side_effect_per_step(client: Client) -> None:
    """Submission → Scheduling → Execution → Status reporting: `received`, then `completed` on app-status."""
    order_id = new_order_id("happy")
    client.submit(make_order(order_id))

    completed = client.wait_status(order_id, OrderStatus.COMPLETED)

    assert [s.state for s in client.statuses(order_id)] == [OrderStatus.RECEIVED, OrderStatus.COMPLETED]
    assert completed.attempt == 1
    assert_processed_by(client, order_id, attempt=1, failure_count=0)
    assert client.alerts(order_id) == []


def test_transient_failures_are_absorbed_by_the_agent_within_attempt_1(client: Client) -> None:
    """Execution: the Agent retries inside CompleteBy with a stable idempotency key; no Supervisor at all."""
    order_id = new_order_id("transient")
    client.script({order_id: ["transient", "transient"]})  # every step: two 429/503 answers, then the seeded ok
    client.submit(make_order(order_id))

    client.wait_status(order_id, OrderStatus.COMPLETED)

    assert_processed_by(client, order_id, attempt=1, failure_count=0)
    assert [client.calls(idempotency_key(order_id, s)) for s in (RESERVE, CHARGE, SHIP)] == [3, 3, 3]


def test_a_hang_past_complete_by_is_recovered_by_attempt_2_and_the_late_reply_is_ignored(
    client: Client,
) -> None:
    """Execution/Supervision: the step hangs (effect applied, no answer), the durable timer wins, the
    Supervisor recovers the expired record and the Starter runs attempt 2; "the Scheduler must ignore late
    replies" (seed 000/001 "Interactions").

    Attempt 1's own DeadlineExceeded reply races its durable timer (both fire at CompleteBy), so which one
    ends attempt 1 is timing; the late reply asserted on is therefore one sent for attempt 1 after it
    completed, as a redelivered or slow Agent would send it."""
    order_id = new_order_id("hang")
    client.script({idempotency_key(order_id, RESERVE): ["hang"]})
    client.submit(make_order(order_id))

    completed = client.wait_status(order_id, OrderStatus.COMPLETED, timeout=RECOVERY_TIMEOUT)

    assert completed.attempt == 2
    assert_processed_by(client, order_id, attempt=2, failure_count=1)  # the hung effect was not applied twice
    first = client.wait_ended(f"{order_id}:1")
    assert first["runtimeStatus"] == "Completed" and first["output"]["outcome"] == "timedOut"
    second = client.wait_ended(f"{order_id}:2")
    assert second["runtimeStatus"] == "Completed" and second["output"] == {"outcome": "completed"}
    # Attempt 1's Agent reply arriving now (a redelivered or slow Agent) is logged as late, changes nothing.
    before = client.state(order_id)
    late = AgentReply(
        instanceId=f"{order_id}:1",
        orderId=order_id,
        attempt=1,
        step=StepName.ARRANGE_SHIPPING,
        outcome=AgentOutcome.SUCCEEDED,
        completedAt=datetime.now(UTC),
    )
    client.send_agent_reply(late)
    wait_until(
        lambda: f"late reply for {f'{order_id}:1'!r} ({reply_event_name(SHIP)}) ignored" in client.devhost_log(),
        15,
        "late-reply log",
    )
    assert client.state(order_id) == before
    assert [s.state for s in client.statuses(order_id)].count(OrderStatus.COMPLETED) == 1


def test_permanent_failure_compensates_the_steps_done_with_alert_and_compensated_status(client: Client) -> None:
    """Execution + compensation (seed 001): a non-transient failure after a successful step undoes that step through
    the Agent; the order ends Compensated with an operator alert, and `compensated` names the cause and the effects
    applied and undone."""
    order_id = new_order_id("permanent")
    client.script({idempotency_key(order_id, CHARGE): ["permanent"]})
    client.submit(make_order(order_id))

    done = client.wait_status(order_id, OrderStatus.COMPENSATED)

    assert "PaymentDeclined" in done.reason and CHARGE in done.reason
    assert done.effects is not None and (done.effects.applied, done.effects.undone) == ([RESERVE], [RESERVE])
    rec = client.state(order_id)
    assert rec is not None and rec.process_state is ProcessState.COMPENSATED
    assert [s.status for s in rec.steps] == [StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.PENDING]
    assert [(c.name.value, c.status, c.undone) for c in rec.compensations] == [
        ("release-inventory", StepStatus.SUCCEEDED, True)
    ]
    [alert] = wait_until(lambda: client.alerts(order_id), 10, "alert")
    assert alert.kind is AlertKind.ORDER_FAILED and "PaymentDeclined" in alert.reason
    assert (alert.details["applied"], alert.details["undone"]) == ([RESERVE], [RESERVE])
    assert client.effects(order_id) == {RESERVE: 1}  # nothing after the rejected step
    assert client.undone(order_id) == [RESERVE] and client.compensations(order_id) == {"release-inventory": 1}


def test_every_attempt_hangs_until_the_threshold_then_the_applied_step_is_compensated(client: Client) -> None:
    """Supervision: FailureCount reaches the threshold (3) → the step the remote applied (while its record said
    running) is undone → Compensated + FailureThresholdReached alert + `compensated` with applied and undone."""
    order_id = new_order_id("threshold")
    client.script({idempotency_key(order_id, RESERVE): ["hang"] * 10})
    client.submit(make_order(order_id))

    done = client.wait_status(order_id, OrderStatus.COMPENSATED, timeout=60)

    assert done.attempt == 4 and "FailureThresholdReached" in done.reason
    assert done.effects is not None and (done.effects.applied, done.effects.undone) == ([RESERVE], [RESERVE])
    rec = client.state(order_id)
    assert rec is not None
    assert (rec.process_state, rec.failure_count, rec.attempt) == (ProcessState.COMPENSATED, 3, 4)
    [alert] = wait_until(lambda: client.alerts(order_id), 10, "alert")
    assert alert.kind is AlertKind.FAILURE_THRESHOLD and alert.details["failureCount"] == 3
    assert alert.details["undone"] == [RESERVE]
    assert client.effects(order_id) == {RESERVE: 1}  # three attempts, one effect, undone once
    assert client.undone(order_id) == [RESERVE]


def test_duplicate_submission_makes_one_order_and_conflicting_one_is_dead_lettered(client: Client) -> None:
    """Submission: the same data again (another MessageId) is accepted once; other data under the same orderId
    is dead-lettered with reason OrderConflict and an operator alert, the original untouched."""
    order_id = new_order_id("dup")
    client.submit(make_order(order_id), message_id=f"{order_id}:first")
    client.submit(make_order(order_id), message_id=f"{order_id}:client-retry")
    client.wait_status(order_id, OrderStatus.COMPLETED)
    client.wait_notified(order_id)  # the status goes out before the stored order gets its TTL
    original = client.order(order_id)
    assert original is not None and original.ttl is not None  # retention began: nothing more writes it

    client.submit(make_order(order_id, quantity=9), message_id=f"{order_id}:conflict")
    dead = client.wait_dead_letter(f"{order_id}:conflict")

    assert dead.reason == "OrderConflict" and order_id in (dead.description or "")
    assert client.dead_letter(f"{order_id}:first") is None and client.dead_letter(f"{order_id}:client-retry") is None
    assert client.order(order_id) == original
    assert_processed_by(client, order_id, attempt=1, failure_count=0)
    assert [s.state for s in client.statuses(order_id)] == [OrderStatus.RECEIVED, OrderStatus.COMPLETED]
    assert [a.kind for a in wait_until(lambda: client.alerts(order_id), 10, "alert")] == [AlertKind.ORDER_CONFLICT]


def test_invalid_inputs_are_dead_lettered_with_their_reason(client: Client) -> None:
    """Submission: validate at the edge; a poison message is dead-lettered with a reason naming the field."""
    good = json.loads(make_order("placeholder").to_json())
    cases = {
        "not-json": (b"{not json", None, "InvalidJson"),
        "ill-typed": (
            {**good, "items": [{**good["items"][0], "quantity": "two"}]},
            None,
            "InvalidField:items.0.quantity",
        ),
        "unknown-type": ({**good, "type": "RefundOrder"}, None, "UnknownType"),
        "session-mismatch": (good, "someone-else", "InvalidField:sessionId"),
        "internal-reply-queue": ({**good, "replyTo": "agent-requests"}, None, "InvalidField:replyTo"),
    }
    sent: dict[str, str] = {}
    for kind, (body, session, _) in cases.items():
        order_id = new_order_id(kind)
        payload = body if isinstance(body, bytes) else json.dumps({**body, "orderId": order_id})
        client.send(payload, message_id=f"{order_id}:bad", session_id=session or order_id)
        sent[kind] = order_id

    for kind, (_, _, reason) in cases.items():
        dead = client.wait_dead_letter(f"{sent[kind]}:bad")
        assert dead.reason == reason, kind
        assert client.state(sent[kind]) is None and client.order(sent[kind]) is None


def test_agent_replies_reach_the_scheduler_as_json_strings_and_the_order_completes(client: Client) -> None:
    """The `agent_replies` trigger raises each reply through the real `DurableOrchestrationClient.raise_event`,
    which posts `json.dumps(data)` through aiohttp's `json=`: the body is a JSON *string*, the extension stores
    that token as it is (HttpApiHandler.HandleRaiseEventRequestAsync: `JToken.Parse(body)`), and the SDK hands the
    orchestrator `df_loads(EventRaised.Input)` (TaskOrchestrationExecutor, EVENT_RAISED): a `str`
    (azure-functions-durable-python #295). The Scheduler copes (AgentReply.from_event). If devhost unwrapped the
    string, the inputs below would decode to dicts and this test would fail."""
    from azure.durable_functions.models.history import HistoryEventType
    from azure.durable_functions.models.utils.df_serialization import df_loads

    from devhost.durable.store import Store

    order_id = new_order_id("strreply")
    client.submit(make_order(order_id))
    client.wait_status(order_id, OrderStatus.COMPLETED)
    assert_processed_by(client, order_id, attempt=1, failure_count=0)

    store = Store(client.system.config.work_dir / "devhost" / "durable.db")
    try:
        history = store.history(f"{order_id}:1")
    finally:
        store.close()
    received = [df_loads(e["Input"]) for e in history if e["EventType"] == HistoryEventType.EVENT_RAISED]
    assert len(received) == len(STEPS)
    assert all(isinstance(value, str) for value in received), [type(v).__name__ for v in received]
    replies = [AgentReply.from_event(value) for value in received]
    assert [(r.instance_id, r.step, r.outcome) for r in replies] == [
        (f"{order_id}:1", step, AgentOutcome.SUCCEEDED) for step in STEPS
    ]


# --- the operator CLI on this running system (orderflow/cli; every command and error in-process:
# tests/product/integration/test_operator_cli.py). What needs the real host: a finished attempt's Durable status and
# history.


def _orderflow(client: Client, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    assert client.system.devhost is not None and client.system.devhost.url
    env = {
        **client.system.env(),
        "COLUMNS": "200",
        "DurableTaskApiUrl": f"{client.system.devhost.url}/runtime/webhooks/durabletask",
    }
    return subprocess.run(
        [sys.executable, "-m", "orderflow", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_an_order_submitted_by_the_cli_is_shown_with_its_orchestration_and_counted(client: Client) -> None:
    order_id = new_order_id("cli-op")
    # As the submitting application (its identity of infra/); `order` and `summary` act as the operators.
    connection = client.system.bus_connection_for(client.system.submitter)
    sent = _orderflow(client, "submit", "--order-id", order_id, "--wait", "45", "--connection", connection)
    assert sent.returncode == 0 and "completed" in sent.stdout, sent.stdout + sent.stderr
    client.wait_ended(f"{order_id}:1")
    shown = _orderflow(client, "order", order_id, "--json")
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert view["state"]["processState"] == "Processed" and view["order"]["orderId"] == order_id
    [attempt] = view["attempts"]
    orchestration = attempt["orchestration"]
    assert attempt["instanceId"] == f"{order_id}:1" and orchestration["runtimeStatus"] == "Completed"
    events = [e["EventType"] for e in orchestration["historyEvents"]]
    assert events[0] == "ExecutionStarted" and events[-1] == "ExecutionCompleted"
    assert events.count("TaskCompleted") >= 4  # the version-3 Scheduler's activities
    text = _orderflow(client, "order", order_id)
    assert text.returncode == 0 and f"attempt 1: {order_id}:1: Completed" in text.stdout, text.stdout
    summary = json.loads(_orderflow(client, "summary", "--json").stdout)
    assert summary["states"]["Processed"] >= 1 and summary["supervisor"]["lastRun"] is not None


# --- rights (orderflow/embedded/rights): every process acts as the identity infra/ gives it, and the orders above
# went through with nothing but those rights.


def test_every_process_acts_as_its_identity_of_infra_and_no_more(client: Client) -> None:
    """The Agent's and devhost's own connections name their identities; with exactly those connections the
    stand-ins refuse what infra/app/rbac.bicep does not grant: the Agent may not send to agent-requests, the function
    app may not send to orders-inbound (the operator cancel route's old bug), nor the Agent read the state store."""
    system = client.system
    assert system.agent is not None and system.devhost is not None
    agent, host = system.agent.env, system.devhost.env
    assert connection_identity(agent["ServiceBusConnection"]) == AGENT
    assert store_identity(agent["CosmosDb__accountEndpoint"]) == AGENT
    assert connection_identity(host["ServiceBusConnection"]) == FUNCTION_APP
    assert store_identity(host["CosmosDb__accountEndpoint"]) == FUNCTION_APP
    for env, queue in ((agent, "agent-requests"), (host, "orders-inbound")):
        with bus_from_connection_string(env["ServiceBusConnection"]) as bus:
            with pytest.raises(ServiceBusAuthorizationError, match="'Send' claim"):
                with bus.get_queue_sender(queue) as sender:
                    sender.send_messages(ServiceBusMessage("refused", message_id="refused", session_id="refused"))

    async def read_state_as_the_agent() -> None:
        async with open_stores(agent) as stores:
            await stores.state.get("anything")

    with pytest.raises(StoreError, match="does not have required RBAC permissions"):
        asyncio.run(read_state_as_the_agent())
