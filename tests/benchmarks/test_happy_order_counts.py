"""One happy order's operation counts, pinned (issue 27): a change that adds a Service Bus operation, a store write or
an orchestrator episode to the happy path fails here.

The counts come from the product running for real, counted the way `python -m benchmarks azure_cost` counts them
(benchmarks/_azure_cost_run.MeteredRun): the local system (devhost with function_app.py, the Agent, the simulator, one
embedded broker and store) with the meter inside devhost and the Agent. One warm-up order, then ONE order submitted
alone, no faults; the window runs from its submission until its record is terminal, its orchestration finished, and a
quiet second after (MeteredRun.settle). Counted: devhost and the Agent (not the submitting client app, which is this
process and stays unmetered); the timer functions' work (starter_timer, supervisor: per tick, not per order) is left
out by its scope. Episodes and activities come from devhost's Durable history of the order. About 10 s in all.

When a pinned figure changes on purpose, update it here and the README's "Cost per order on Azure".
"""

from __future__ import annotations

import inspect
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks import compare_counts
from benchmarks._azure_cost_meter import STORE_OPERATIONS, TIMER_FUNCTIONS, split
from benchmarks._azure_cost_run import MeteredRun, _delta

# --- the pinned counts: one happy order, devhost + Agent -----------------------------------------------------------
# Cosmos DB operations by (container, operation), as the Cosmos adapters would send them (the meter's
# STORE_OPERATIONS). Exact: one order alone does the same calls every time.
COSMOS = {
    # orders DB: the order's create (submission trigger); in advance_order, 3 reads of the stored order, and set_ttl
    # when the order ends (issue 26, orderflow/retention.py: the retention TTL, a read and an If-Match replace).
    ("orders", "create"): 1,
    ("orders", "point_read"): 4,
    ("orders", "replace"): 1,
    # state store, the order's state record: the claimed create (submission trigger), then in advance_order 5
    # update_with_retry, a read and an If-Match replace each (the step decisions and notifiedAt).
    ("state", "create"): 1,
    ("state", "point_read"): 5,
    ("state", "replace"): 5,
    # the admission figures document (checkpoints container, orderflow/admission.py), in the submission trigger: the
    # fast-path slot's reservation, 2 reads and 1 If-Match write.
    ("checkpoints", "point_read"): 2,
    ("checkpoints", "replace"): 1,
}
STATE_STORE_WRITES = 6  # state create + replaces: the claimed create, 4 decisions, notifiedAt
ORDERS_DB_WRITES = 2  # the order's create + its TTL (set_ttl)
RECOVERY_INDEX_WRITES = 0  # SupervisorScanMode=query (the default): the index is not written (commit 546ff6e)
QUERIES = 0  # no query or count outside the timers' ticks
# The circuit breaker's document (circuitBreakers container) is read through a 1 s cache (orderflow/breaker.py
# CACHE_TTL) in devhost and in the Agent: how many reads fall in the order depends on how long it takes (2 on this
# machine). Bound: at most one per process per started second of the window, plus one.
BREAKER_CACHE_S = 1.0
BREAKER_PROCESSES = 2

# Service Bus calls that moved or settled a message, by operation (embedded broker API calls, meter's
# SERVICE_BUS_OPERATIONS). Exact. Queues: orders-inbound (the submission), agent-requests (3 step requests, devhost ->
# Agent), agent-replies (3 replies, Agent -> devhost), app-status (2 statuses to the client: accepted, completed).
SERVICE_BUS = {
    "send": 8,  # agent-requests 3, agent-replies 3, app-status 2 (one message each)
    "take": 7,  # receives that returned a message: orders-inbound 1, agent-requests 3, agent-replies 3
    "complete": 7,  # one per message received
    "accept_session": 3,  # accepts that found the order's session: one per session queue (orders-inbound,
    # agent-requests, agent-replies), held for the order's messages
    "release_session": 3,
}
MESSAGES_SENT = 8
MESSAGES_RECEIVED = 7
# Calls that found nothing. A waiting receive or accept is one call however long it waits (the meter counts the
# embedded client's `_wait_for` once, as Azure bills one call: benchmarks/_waits.py). Exact: each
# of the three session holds ends with one receive that waits sessionIdleTimeout (host.json, 1 s; the Agent's
# AGENT_RECEIVE_WAIT_MS) and finds nothing, as the Functions host's session processor does before it releases.
EMPTY_TAKES = 3
# Accepts that found no session: the waiting acceptors' waits ending (devhost's 64 trigger sessions wait 30 s,
# devhost/servicebus_trigger.py RECEIVE_WAIT_S; the Agent's acceptors 10 s). Not the order's: bounded by rate.
EMPTY_ACCEPTS_PER_S = 3.0

# Function executions in devhost (Invoker.call), timers left out: the submission trigger, the agent-replies
# trigger once per reply, the orchestrator once per episode, the activity once per step.
FUNCTIONS = {"submission": 1, "agent_replies": 3, "order_workflow": 8, "advance_order": 4}
# devhost's Durable history of the order (compare_counts.durable_counts): one instance, 4 activities (TaskScheduled),
# 8 episodes (OrchestratorStarted: one replay per new event: the start, 4 activity results, 3 replies raised).
DURABLE = {"instances": 1, "activities": 4, "episodes": 8, "history_events": 32}
HISTORY_EVENTS = {
    "EXECUTION_STARTED": 1,
    "ORCHESTRATOR_STARTED": 8,
    "ORCHESTRATOR_COMPLETED": 8,
    "TASK_SCHEDULED": 4,
    "TASK_COMPLETED": 4,
    "TIMER_CREATED": 3,  # the step timeouts, cancelled when the reply comes (never fired: no TIMER_FIRED)
    "EVENT_RAISED": 3,
    "EXECUTION_COMPLETED": 1,
}


class OneOrder:
    """The counts of one order's window: devhost + Agent, timer scopes left out."""

    def __init__(self, delta: dict[str, dict[str, int]], span_s: float, durable: dict[str, Any], answer: Any) -> None:
        self.span_s, self.durable, self.answer = span_s, durable, answer
        self.cosmos: Counter[tuple[str, str]] = Counter()
        self.sb: Counter[str] = Counter()
        self.empty: Counter[str] = Counter()
        self.messages: Counter[str] = Counter()
        self.functions: Counter[str] = Counter()
        self.timers: Counter[str] = Counter()
        for role in ("devhost", "agent"):
            for counter_key, n in delta.get(role, {}).items():
                kind, scope, a, b = split(counter_key)
                if scope in TIMER_FUNCTIONS:
                    self.timers[counter_key] += n
                elif kind == "cosmos":
                    self.cosmos[(a, b)] += n
                elif kind == "sb":
                    self.sb[b] += n
                elif kind == "sb_empty":
                    self.empty[b] += n
                elif kind == "sb_msgs":
                    self.messages[b] += n
                elif kind == "fn":
                    self.functions[scope] += n

    def moved(self) -> dict[str, int]:
        """Service Bus calls that moved or settled a message: every call less those that found nothing."""
        return {op: n - self.empty[op] for op, n in sorted(self.sb.items()) if n - self.empty[op]}


@pytest.fixture(scope="module")
def one_order(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OneOrder]:
    run = MeteredRun(tmp_path_factory.mktemp("one-order"), 1, lambda line: None, count_client=False)
    try:
        run.start()
        run.client.handle({"cmd": "sequential", "prefix": "warm", "n": 1})  # first-use costs (documents, sessions)
        run.settle("warm")
        before = run.snapshot()
        answer = run.client.handle({"cmd": "sequential", "prefix": "one", "n": 1})
        run.settle("one")
        after = run.snapshot()
        durable = compare_counts.durable_counts(run.config.work_dir / "devhost" / "durable.db", "one")
        yield OneOrder(_delta(after, before), after.at - before.at, durable, answer)
    finally:
        run.stop()


def test_the_order_completed(one_order: OneOrder) -> None:
    assert one_order.answer["outcomes"] == {"completed": 1}, one_order.answer


def test_cosmos_operations_of_one_order(one_order: OneOrder) -> None:
    breaker = one_order.cosmos.pop(("circuitBreakers", "point_read"), 0)
    assert dict(one_order.cosmos) == COSMOS
    writes: Counter[str] = Counter()
    for (container, op), n in one_order.cosmos.items():
        if op in ("create", "replace", "upsert", "delete"):
            writes[container] += n
    assert writes["state"] == STATE_STORE_WRITES
    assert writes["orders"] == ORDERS_DB_WRITES
    assert writes["recoveryIndex"] == RECOVERY_INDEX_WRITES
    assert sum(n for (_, op), n in one_order.cosmos.items() if op.startswith(("query", "count"))) == QUERIES
    assert breaker <= BREAKER_PROCESSES * (math.ceil(one_order.span_s / BREAKER_CACHE_S) + 1), (breaker, one_order)


def test_service_bus_operations_of_one_order(one_order: OneOrder) -> None:
    assert one_order.moved() == SERVICE_BUS
    assert one_order.messages["sent"] == MESSAGES_SENT
    assert one_order.messages["received"] == MESSAGES_RECEIVED
    assert one_order.empty["take"] == EMPTY_TAKES, dict(one_order.empty)
    accepts = one_order.empty["accept_session"]
    assert accepts <= 1 + EMPTY_ACCEPTS_PER_S * one_order.span_s, (dict(one_order.empty), one_order.span_s)
    assert set(one_order.empty) <= {"take", "accept_session"}, dict(one_order.empty)


def test_function_executions_and_episodes_of_one_order(one_order: OneOrder) -> None:
    assert dict(one_order.functions) == FUNCTIONS
    assert {k: one_order.durable[k] for k in DURABLE} == DURABLE
    assert one_order.durable["history_events_by_type"] == HISTORY_EVENTS


def test_every_store_method_is_metered() -> None:
    """A store method the meter does not know would be an uncounted Cosmos operation (as set_ttl was)."""
    import orderflow.embedded.store as store

    not_operations = {"aclose", "oldest_in_state"}  # closing; a query_in_state of one item (counted as that)
    for class_name, methods in STORE_OPERATIONS.items():
        cls = getattr(store, class_name)
        public = {
            name
            for klass in cls.__mro__
            if klass.__module__.startswith("orderflow.embedded")
            for name, value in vars(klass).items()
            if not name.startswith("_") and inspect.iscoroutinefunction(value)
        }
        assert public - not_operations - {"update_with_retry"} == set(methods), class_name


async def test_set_ttl_counts_a_read_and_a_replace(tmp_path: Path) -> None:
    from support.integration_support import order_body

    import orderflow.embedded.store as store
    from benchmarks import azure_cost as ac
    from orderflow.messages import SubmitOrder
    from orderflow.records import OrderRecord

    order = SubmitOrder.model_validate(order_body("o-1"))
    with ac.metered() as meter:
        meter.patch_store(store)
        orders, state = store.open_sqlite_stores(tmp_path / "store.db")
        await orders.create_if_absent(OrderRecord.from_order(order, order.submitted_at))
        await orders.set_ttl("o-1", 60)
        await state.aclose()
        counts = meter.snapshot()
    assert counts == {"cosmos|-|orders|create": 1, "cosmos|-|orders|point_read": 1, "cosmos|-|orders|replace": 1}


def test_a_waiting_receive_is_one_call(tmp_path: Path) -> None:
    """Azure bills a receive or a session accept that waits as one call, whatever it found (azure-servicebus
    _servicebus_receiver.py `_receive`: one link credit, held until a message or max_wait_time); the embedded client
    looks again after each wake-up, and those looks are not calls (benchmarks/_waits.py)."""
    import threading

    from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage

    import orderflow.embedded.broker as broker_module
    import orderflow.embedded.client as client_module
    from benchmarks import azure_cost as ac

    with ac.metered() as meter:
        meter.patch_broker(broker_module)
        meter.patch_receivers(client_module)
        broker = broker_module.EmbeddedBroker(tmp_path / "bus.db")
        broker.declare_queue("plain")
        broker.declare_queue("sessions", requires_session=True)
        try:
            with client_module.ServiceBusClient(broker) as bus:
                with bus.get_queue_receiver("plain") as receiver:
                    assert receiver.receive_messages(max_wait_time=0.2) == []  # waits, finds nothing: one empty call
                    with bus.get_queue_sender("plain") as sender:  # sent while the next receive waits: woken once
                        later = threading.Timer(0.2, lambda: sender.send_messages(ServiceBusMessage("x")))
                        later.start()
                        got = receiver.receive_messages(max_wait_time=5)
                        later.join()
                    assert len(got) == 1
                    receiver.complete_message(got[0])
                with bus.get_queue_sender("sessions") as sender:
                    sender.send_messages(ServiceBusMessage("y", session_id="s1"))
                with bus.get_queue_receiver("sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5) as held:
                    assert [str(m) for m in held.receive_messages(max_wait_time=5)] == ["y"]
        finally:
            broker.close()
        counts = {k: v for k, v in meter.snapshot().items() if k.startswith(("sb|", "sb_empty|"))}
    assert counts == {
        "sb|-|plain|take": 2,
        "sb_empty|-|plain|take": 1,
        "sb|-|plain|send": 1,
        "sb|-|plain|complete": 1,
        "sb|-|sessions|send": 1,
        "sb|-|sessions|accept_session": 1,
        "sb|-|sessions|take": 1,
        "sb|-|sessions|release_session": 1,
    }


def test_each_floor_follows_the_runs_own_work() -> None:
    """azure_cost's floors (benchmarks/_azure_cost_floors.py) are computed from the run: messages, the order's and its
    record's writes, activities and events; a count above its floor says what it pays for."""
    from benchmarks.azure_cost import floors

    happy: dict[str, Any] = {
        "servicebus": {
            "operations": 31.0,
            "messages_sent": 8,
            "messages_received": 7,
            "empty": {"take": 3},
            "client": {"operations": 10.0, "messages_sent": 1, "messages_received": 2},
        },
        "cosmos": {
            "operations": 20.0,
            "ru": 97.0,
            "by_container": {
                "orders": {"create": 1, "point_read": 4, "replace": 1},
                "state": {"create": 1, "point_read": 5, "replace": 5},
                "checkpoints": {"point_read": 1, "replace": 1},  # the admission document: not the floor's
            },
        },
        "functions": {"executions": 16, "by_function": {"submission": 1, "agent_replies": 3}},
        "durable": {
            "instances": 1,
            "activities": 4,
            "episodes": 9,
            "dts_actions": 12,
            "history_events_by_type": {"EVENT_RAISED": 3},
        },
    }
    rows = {row["count"]: row for row in floors(happy)}
    assert rows["servicebus"]["floor"] == 8 + 2 * 7
    assert rows["servicebus_client"]["floor"] == 1 + 2 * 2
    assert rows["cosmos_ru"]["floor"] == 5.5 + 11 + 5.5 + 5 * 11  # creates and replaces of the order and its record
    assert rows["cosmos_operations"]["floor"] == 8
    assert rows["episodes"]["floor"] == 1 + 4 + 3  # the start, each activity result, each raised event
    assert rows["executions"]["floor"] == 1 + 3 + 8 + 4
    assert rows["dts_actions"]["floor"] == 1 + 2 * 4 + 3
    assert (rows["servicebus"]["target"], rows["cosmos_ru"]["target"]) == (30, 60)
    assert [rows[k]["meets_target"] for k in ("servicebus", "cosmos_ru", "episodes")] == [False, False, False]
    assert rows["episodes"]["measured"] > rows["episodes"]["floor"]  # the 9th episode is above the floor
