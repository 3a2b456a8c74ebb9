"""The simulator's compensations: undo once, replay, no-op tombstone, refusal of a late forward call, faults on
compensations, the /effects report, atomicity across connections, and the Agent request/reply path."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.agent_fakes import REPLIES, REQUESTS, FakeBus, agent_config, make_request, request_message

from agent.errors import Classification, classify
from agent.remote import HttpRemoteCaller
from agent.worker import AgentWorker
from lab.simulator import FaultConfig, Simulator
from lab.simulator_ledger import AlreadyCompensated, EffectStore
from orderflow.messages import STEPS, AgentReply, CompensationName, StepName, idempotency_key

CHARGE, REFUND = StepName.CHARGE_PAYMENT.value, CompensationName.REFUND_PAYMENT.value


def call(order_id: str, name: str, key: str | None = None) -> dict[str, Any]:
    return {"orderId": order_id, "idempotencyKey": key or idempotency_key(order_id, name), "payload": {}}


async def post(
    http: aiohttp.ClientSession, sim: Simulator, order_id: str, name: str, key: str | None = None
) -> tuple[int, dict[str, Any]]:
    async with http.post(f"{sim.url}/steps/{name}", json=call(order_id, name, key)) as r:
        return r.status, await r.json()


async def effects(http: aiohttp.ClientSession, sim: Simulator) -> dict[str, Any]:
    async with http.get(f"{sim.url}/effects") as r:
        return await r.json()


@pytest.fixture
async def http() -> Any:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_compensation_undoes_an_applied_effect_once(simulator: Simulator, http: aiohttp.ClientSession) -> None:
    assert (await post(http, simulator, "o-1", CHARGE))[0] == 200
    status, body = await post(http, simulator, "o-1", REFUND)
    report = await effects(http, simulator)
    assert status == 200
    assert body["idempotencyKey"] == "o-1:refund-payment" and body["replayed"] is False
    assert (body["undone"], body["noop"]) == (True, False)
    assert (body["step"], body["compensates"], body["orderId"]) == (REFUND, CHARGE, "o-1")
    assert body["confirmation"].startswith("refund-payment-")
    assert report["effects"] == [{"orderId": "o-1", "step": CHARGE, "applied": 1}]  # it was applied: still counted
    assert report["undone"] == [{"orderId": "o-1", "step": CHARGE, "compensation": REFUND}]
    assert report["compensations"] == [{"orderId": "o-1", "compensation": REFUND, "step": CHARGE, "applied": 1}]
    assert report["tombstones"] == [] and report["duplicates"] == 0


async def test_a_repeated_compensation_is_a_replay(simulator: Simulator, http: aiohttp.ClientSession) -> None:
    await post(http, simulator, "o-1", CHARGE)
    first = (await post(http, simulator, "o-1", REFUND))[1]
    repeats = await asyncio.gather(*(post(http, simulator, "o-1", REFUND) for _ in range(10)))
    report = await effects(http, simulator)
    assert {status for status, _ in repeats} == {200}
    assert all(body == {**first, "replayed": True} for _, body in repeats)
    assert report["compensations"][0]["applied"] == 1 and report["totalCompensations"] == 1
    assert report["duplicates"] == 0


async def test_concurrent_first_calls_of_a_compensation_undo_once(
    simulator: Simulator, http: aiohttp.ClientSession
) -> None:
    await post(http, simulator, "o-1", CHARGE)
    answers = await asyncio.gather(*(post(http, simulator, "o-1", REFUND) for _ in range(20)))
    report = await effects(http, simulator)
    assert [body["replayed"] for _, body in answers].count(False) == 1
    assert all(body["undone"] for _, body in answers)
    assert report["totalCompensations"] == 1 and report["duplicates"] == 0


async def test_compensation_of_a_never_applied_effect_is_a_noop(
    simulator: Simulator, http: aiohttp.ClientSession
) -> None:
    status, body = await post(http, simulator, "o-1", REFUND)
    again = (await post(http, simulator, "o-1", REFUND))[1]
    report = await effects(http, simulator)
    assert status == 200 and body["replayed"] is False
    assert (body["undone"], body["noop"], body["reason"]) == (False, True, "never-applied")
    assert again == {**body, "replayed": True}
    assert report["compensations"] == [] and report["totalCompensations"] == 0  # no effect counted
    assert report["undone"] == [] and report["effects"] == []
    assert report["tombstones"] == [{"orderId": "o-1", "step": CHARGE, "compensation": REFUND}]


async def test_a_forward_call_after_its_compensation_is_refused(
    simulator: Simulator, http: aiohttp.ClientSession
) -> None:
    await post(http, simulator, "o-1", REFUND)  # tombstone: the charge never happened
    status, body = await post(http, simulator, "o-1", CHARGE)
    report = await effects(http, simulator)
    assert status == 409 and body["errorCode"] == "AlreadyCompensated"
    assert (body["compensation"], body["undone"]) == (REFUND, False)
    assert classify(status) is Classification.PERMANENT  # the Agent does not retry it
    assert report["effects"] == [] and report["totalApplied"] == 0  # nothing applied


async def test_after_an_undo_the_forward_key_replays_and_a_new_key_is_refused(
    simulator: Simulator, http: aiohttp.ClientSession
) -> None:
    applied = (await post(http, simulator, "o-1", CHARGE))[1]
    await post(http, simulator, "o-1", REFUND)
    replay_status, replay = await post(http, simulator, "o-1", CHARGE)
    other_status, other = await post(http, simulator, "o-1", CHARGE, key="o-1:charge-payment:again")
    report = await effects(http, simulator)
    assert replay_status == 200 and replay == {**applied, "replayed": True}  # unchanged: the stored result
    assert other_status == 409 and (other["errorCode"], other["undone"]) == ("AlreadyCompensated", True)
    assert report["effects"] == [{"orderId": "o-1", "step": CHARGE, "applied": 1}]


async def test_a_second_compensation_key_after_an_undo_is_a_noop(
    simulator: Simulator, http: aiohttp.ClientSession
) -> None:
    await post(http, simulator, "o-1", CHARGE)
    await post(http, simulator, "o-1", REFUND)
    status, body = await post(http, simulator, "o-1", REFUND, key="o-1:refund-payment:again")
    report = await effects(http, simulator)
    assert status == 200 and (body["undone"], body["noop"], body["reason"]) == (False, True, "already-compensated")
    assert report["totalCompensations"] == 1 and report["duplicates"] == 0


async def test_a_compensation_key_reused_elsewhere_is_a_conflict(
    simulator: Simulator, http: aiohttp.ClientSession
) -> None:
    await post(http, simulator, "o-1", REFUND)
    status, body = await post(http, simulator, "o-2", REFUND, key="o-1:refund-payment")
    assert status == 409 and body["errorCode"] == "IdempotencyKeyReuse"


async def test_scripted_faults_on_a_compensation(simulator: Simulator, http: aiohttp.ClientSession) -> None:
    async with http.post(
        f"{simulator.url}/script", json={"o-1:refund-payment": ["permanent"], "o-2:refund-payment": ["transient", "ok"]}
    ) as r:
        assert r.status == 200
    for order_id in ("o-1", "o-2"):
        await post(http, simulator, order_id, CHARGE)
    rejected = await post(http, simulator, "o-1", REFUND)
    transient = await post(http, simulator, "o-2", REFUND)
    retried = await post(http, simulator, "o-2", REFUND)
    report = await effects(http, simulator)
    assert rejected[0] == 422 and rejected[1]["errorCode"] == "RefundRefused"
    assert transient[0] in (429, 503) and transient[1]["errorCode"] in ("Throttled", "ServiceUnavailable")
    assert retried[0] == 200 and retried[1]["undone"] is True
    assert report["undone"] == [{"orderId": "o-2", "step": CHARGE, "compensation": REFUND}]  # o-1: refused, intact
    assert report["callsByKey"]["o-1:refund-payment"] == 1 and report["callsByKey"]["o-2:refund-payment"] == 2


async def test_a_refused_compensation_does_not_block_the_step(
    simulator: Simulator, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{simulator.url}/script", json={"o-1:refund-payment": ["permanent"]}):
        pass
    assert (await post(http, simulator, "o-1", REFUND))[0] == 422
    assert (await post(http, simulator, "o-1", CHARGE))[0] == 200  # no tombstone from a refusal


@pytest.mark.parametrize(
    ("compensation", "code"),
    [
        ("release-inventory", "ReleaseRefused"),
        ("refund-payment", "RefundRefused"),
        ("cancel-shipment", "CancellationRefused"),
    ],
)
async def test_seeded_permanent_failures_spare_compensations_and_a_script_still_fails_them(
    tmp_path: Path, http: aiohttp.ClientSession, compensation: str, code: str
) -> None:
    """A compensation is designed to succeed: the seeded permanent-failure rate does not refuse it (the demo's
    declined cards must not strand undo work); a scripted permanent fault does, with its own error code."""
    async with Simulator(FaultConfig(seed=1, permanent_failure_rate=1.0), tmp_path / "db") as sim:
        status, body = await post(http, sim, "o-1", compensation)
        assert status == 200 and body["noop"] is True
        async with http.post(f"{sim.url}/script", json={"o-2": ["permanent"]}):
            pass
        status, body = await post(http, sim, "o-2", compensation)
    assert (status, body["errorCode"]) == (422, code)


async def test_a_compensation_during_an_outage_records_nothing(
    simulator: Simulator, http: aiohttp.ClientSession
) -> None:
    simulator.set_down(True)
    status, body = await post(http, simulator, "o-1", REFUND)
    simulator.set_down(False)
    assert status == 503 and body["errorCode"] == "ServiceUnavailable"
    assert (await post(http, simulator, "o-1", CHARGE))[0] == 200


async def test_effects_report_of_compensated_and_happy_orders(
    simulator: Simulator, http: aiohttp.ClientSession
) -> None:
    for step in STEPS:  # "happy": every step once, nothing compensated
        await post(http, simulator, "happy", step.value)
    await post(http, simulator, "rolled-back", StepName.RESERVE_INVENTORY.value)
    await post(http, simulator, "rolled-back", StepName.CHARGE_PAYMENT.value)
    for compensation in CompensationName:  # arrange-shipping never happened: its cancellation is a no-op
        await post(http, simulator, "rolled-back", compensation.value)
    report = await effects(http, simulator)

    def per_order(order_id: str) -> dict[str, int]:  # what tests/product/e2e compare to {step: 1}
        return {e["step"]: e["applied"] for e in report["effects"] if e["orderId"] == order_id}

    assert per_order("happy") == {s.value: 1 for s in STEPS}
    assert per_order("rolled-back") == {"reserve-inventory": 1, "charge-payment": 1}
    assert report["totalApplied"] == 5 and report["totalCompensations"] == 2 and report["duplicates"] == 0
    assert report["compensations"] == [
        {"orderId": "rolled-back", "compensation": "refund-payment", "step": "charge-payment", "applied": 1},
        {"orderId": "rolled-back", "compensation": "release-inventory", "step": "reserve-inventory", "applied": 1},
    ]
    assert report["undone"] == [
        {"orderId": "rolled-back", "step": "charge-payment", "compensation": "refund-payment"},
        {"orderId": "rolled-back", "step": "reserve-inventory", "compensation": "release-inventory"},
    ]
    assert report["tombstones"] == [
        {"orderId": "rolled-back", "step": "arrange-shipping", "compensation": "cancel-shipment"}
    ]
    assert set(report) == {
        "effects",
        "totalApplied",
        "duplicates",
        "compensations",
        "totalCompensations",
        "undone",
        "tombstones",
        "calls",
        "callsByKey",
        "callsWhileDown",
        "callsWhileDownByKey",
    }


def test_duplicates_count_a_compensation_effect_applied_twice(tmp_path: Path) -> None:
    store = EffectStore(tmp_path / "db")
    try:
        store.apply("o-1:charge-payment", "o-1", CHARGE)
        store.compensate("o-1:refund-payment", "o-1", CompensationName.REFUND_PAYMENT)
        assert store.report()["duplicates"] == 0
        # what a broken ledger would hold: the refund applied a second time
        store._db.execute("UPDATE applied_effects SET count = 2 WHERE step = 'refund-payment'")
        report = store.report()
    finally:
        store.close()
    assert report["duplicates"] == 1 and report["totalApplied"] == 1 and report["totalCompensations"] == 2


def test_forward_and_compensation_race_across_connections(tmp_path: Path) -> None:
    """Per order, a forward call and its compensation released together on two connections (as two simulator
    processes): every order ends applied-then-undone or refused, never applied and not undone."""
    db = tmp_path / "db"
    EffectStore(db).close()
    orders = [f"o-{i}" for i in range(150)]
    barriers = {o: threading.Barrier(2, timeout=10) for o in orders}

    def forward(order_id: str) -> str:
        store = EffectStore(db)
        try:
            barriers[order_id].wait()
            store.apply(idempotency_key(order_id, CHARGE), order_id, CHARGE)
            return "applied"
        except AlreadyCompensated:
            return "refused"
        finally:
            store.close()

    def compensate(order_id: str) -> bool:
        store = EffectStore(db)
        try:
            barriers[order_id].wait()
            return bool(
                store.compensate(idempotency_key(order_id, REFUND), order_id, CompensationName.REFUND_PAYMENT)[0][
                    "undone"
                ]
            )
        finally:
            store.close()

    with ThreadPoolExecutor(max_workers=8) as pool:  # even: the two calls of an order run side by side
        futures = {o: (pool.submit(forward, o), pool.submit(compensate, o)) for o in orders}
        outcomes = {o: (f.result(), c.result()) for o, (f, c) in futures.items()}
    store = EffectStore(db)
    report = store.report()
    store.close()
    assert set(outcomes.values()) <= {("applied", True), ("refused", False)}
    applied = {e["orderId"] for e in report["effects"]}
    assert applied == {e["orderId"] for e in report["undone"]}  # every applied effect was undone
    assert applied == {o for o, (f, _) in outcomes.items() if f == "applied"}
    assert {e["orderId"] for e in report["tombstones"]} == {o for o, (f, _) in outcomes.items() if f == "refused"}
    assert report["duplicates"] == 0


def interleave(db: Path, first: Any, second: Any) -> list[str]:
    """Run `first(store)` on one connection and, at each statement it starts once its transaction has begun, try
    `second(store)` on another connection (50 ms busy timeout), until one try gets through. Returns what each try
    did: "locked" (the first call held the write lock), or "ran" / the exception's name."""
    EffectStore(db).close()
    store, other = EffectStore(db), EffectStore(db)
    other._db.execute("PRAGMA busy_timeout = 50")
    tries: list[str] = []
    began = False

    def on_statement(sql: str) -> None:
        nonlocal began
        if not began:
            began = sql.startswith("BEGIN")
            return
        if "ran" in tries or "AlreadyCompensated" in tries:
            return
        try:
            second(other)
            tries.append("ran")
        except sqlite3.OperationalError:
            tries.append("locked")
        except AlreadyCompensated:
            tries.append("AlreadyCompensated")

    store._db.set_trace_callback(on_statement)
    try:
        first(store)
    finally:
        store._db.set_trace_callback(None)
        store.close()
        other.close()
    return tries


def _forward(store: EffectStore) -> Any:
    return store.apply("o-1:charge-payment", "o-1", CHARGE)


def _refund(store: EffectStore) -> Any:
    return store.compensate("o-1:refund-payment", "o-1", CompensationName.REFUND_PAYMENT)


def test_a_forward_call_cannot_slip_inside_a_compensation(tmp_path: Path) -> None:
    tries = interleave(tmp_path / "db", _refund, _forward)
    store = EffectStore(tmp_path / "db")
    try:
        with pytest.raises(AlreadyCompensated):
            _forward(store)  # after the compensation answered: refused
        report = store.report()
    finally:
        store.close()
    assert tries and set(tries) == {"locked"}  # never ran between the compensation's check and its tombstone
    assert report["effects"] == [] and report["tombstones"] == [
        {"orderId": "o-1", "step": CHARGE, "compensation": REFUND}
    ]


def test_a_compensation_cannot_slip_inside_a_forward_call(tmp_path: Path) -> None:
    tries = interleave(tmp_path / "db", _forward, _refund)
    store = EffectStore(tmp_path / "db")
    try:
        undone = _refund(store)[0]["undone"]  # after the forward call answered: it is undone
        report = store.report()
    finally:
        store.close()
    assert tries and set(tries) == {"locked"}
    assert undone is True and report["undone"] == [{"orderId": "o-1", "step": CHARGE, "compensation": REFUND}]


# --- through the real Agent path: AgentRequest → POST /steps/{compensation} → AgentReply ---------------------


def far_future() -> datetime:
    return datetime.now(UTC) + timedelta(minutes=5)


async def test_agent_sends_a_compensation_and_replies_with_its_name(
    bus: FakeBus, simulator: Simulator, http: aiohttp.ClientSession
) -> None:
    sent = [
        make_request("o-1", StepName.CHARGE_PAYMENT, deadline=far_future()),
        make_request("o-1", CompensationName.REFUND_PAYMENT, deadline=far_future()),  # type: ignore[arg-type]
        make_request("o-2", CompensationName.REFUND_PAYMENT, deadline=far_future()),  # type: ignore[arg-type]
        make_request("o-2", StepName.CHARGE_PAYMENT, deadline=far_future()),  # late: after its compensation
    ]
    for request in sent:
        await bus.send(REQUESTS, request_message(request))
    worker = AgentWorker(bus, HttpRemoteCaller(http, simulator.url), agent_config())
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await bus.wait_for(lambda: len(bus.queue(REPLIES).active) == 4)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    replies = {m.message_id: AgentReply.model_validate_json(m.raw) for m in bus.queue(REPLIES).active}
    report = simulator.store.report()

    refund = replies["o-1:1:refund-payment:reply"]
    assert refund.step == CompensationName.REFUND_PAYMENT and refund.outcome == "succeeded"
    assert refund.result["undone"] is True and refund.result["step"] == "refund-payment"
    noop = replies["o-2:1:refund-payment:reply"]
    assert noop.outcome == "succeeded" and noop.result["noop"] is True
    late = replies["o-2:1:charge-payment:reply"]
    assert late.outcome == "failed" and late.permanent and late.error_code == "AlreadyCompensated"
    assert report["callsByKey"]["o-1:refund-payment"] == 1  # reached POST /steps/refund-payment, not retried
    assert report["callsByKey"]["o-2:charge-payment"] == 1  # 409 is permanent: no retry
    assert report["effects"] == [{"orderId": "o-1", "step": CHARGE, "applied": 1}]
    assert report["undone"] == [{"orderId": "o-1", "step": CHARGE, "compensation": REFUND}]
