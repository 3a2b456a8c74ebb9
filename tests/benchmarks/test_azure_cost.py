"""benchmarks/azure_cost.py: the arithmetic from counts to monthly figures (checked by hand below), and the counting it
adds (the meter's wrappers of the embedded store and broker, the background subtraction)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from benchmarks import azure_cost as ac
from orderflow.embedded.broker import EmbeddedBroker
from orderflow.embedded.message import Envelope
from orderflow.embedded.store import open_sqlite_documents, open_sqlite_recovery_index, open_sqlite_stores
from orderflow.messages import SubmitOrder
from orderflow.ports import ExpiredCursor, IndexEntry
from orderflow.records import OrderRecord, OrderStateRecord, ProcessState

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _order(order_id: str) -> SubmitOrder:
    return SubmitOrder.model_validate(
        {
            "orderId": order_id,
            "replyTo": "app-status",
            "customer": {"id": "c1", "name": "Ada"},
            "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": "9.99"}],
            "currency": "EUR",
            "submittedAt": "2026-11-30T12:00:00+00:00",
        }
    )


# --- arithmetic, hand-checked ----------------------------------------------------------------------------------
def test_ru_estimate_of_a_hand_checked_order() -> None:
    ops = {("state", "point_read"): 2, ("state", "replace"): 3, ("orders", "create"): 1, ("state", "query_cross"): 1}
    items = {("state", "query_cross"): 2}
    # state: 2 x 1 + 3 x 11 + (3 + 2 returned) = 40; orders: 5.5
    assert ac.cosmos_ru(ops, items) == {"orders": 5.5, "state": 40.0, "total": 45.5}
    # two physical partitions: the cross-partition query is charged twice (+3)
    assert ac.cosmos_ru(ops, items, partitions=2)["total"] == 48.5


def test_provisioned_throughput_rounding_and_prices() -> None:
    low = ac.cosmos_provisioned(45.5)  # below the 400 RU/s entry point, autoscale Tmax 1000 (bills >= 100)
    assert (low["manual_rus"], low["autoscale_tmax"], low["autoscale_billed_rus"]) == (400, 1000, 100)
    assert low["manual_usd"] == pytest.approx(400 / 100 * 0.008 * 730)  # $23.36
    assert low["autoscale_usd"] == pytest.approx(100 / 100 * 0.012 * 730)  # $8.76
    high = ac.cosmos_provisioned(4_550.0)
    assert (high["manual_rus"], high["autoscale_tmax"], high["autoscale_billed_rus"]) == (4_600, 5_000, 4_600)
    assert high["manual_usd"] == pytest.approx(46 * 0.008 * 730)  # $268.64


def test_tiered_operations_price() -> None:
    tiers = ((13e6, 0.0), (100e6, 5.21), (2_500e6, 3.20), (float("inf"), 1.27))
    assert ac.tiered(10e6, tiers) == 0.0
    assert ac.tiered(50e6, tiers) == pytest.approx(37 * 5.21)  # 37 M in the second tier
    assert ac.tiered(3_000e6, tiers) == pytest.approx(87 * 5.21 + 2_400 * 3.20 + 500 * 1.27)


def test_monthly_figures_at_ten_orders_per_second() -> None:
    order = {
        "cosmos": {"ru_by_container": {"orders": 5.5, "state": 40.0}, "ru_by_database": {"orders": 5.5, "state": 40.0}},
        "servicebus": {
            "operations": 50.0,
            "credits_messages": 15.0,
            "client": {"operations": 10.0, "credits_messages": 3.0},
        },
        "durable": {
            "episodes": 8.0,
            "activities": 4.0,
            "history_events": 32.0,
            "dts_actions": 12.0,
            "azure_storage_transactions_model": 60.0,
        },
        "functions": {"executions": 16.0},
    }
    background = {"cosmos_ru_per_s_by_database": {"state": 2.0}, "executions_per_s": 0.5}
    m = ac.monthly(order, background, 10)
    assert m["orders_per_month"] == 26_280_000  # 10/s x 2,628,000 s
    # RU/s: orders 55, state 400 + 2 = 402 -> RU/month = 457 x 2,628,000
    assert m["cosmos"]["ru_per_month"] == 457 * 2_628_000
    assert m["cosmos"]["serverless_usd"] == pytest.approx(457 * 2.628 * 0.25, abs=0.01)  # $300.25
    assert m["cosmos"]["provisioned_by_database"]["orders"]["manual_rus"] == 400
    assert m["cosmos"]["provisioned_by_database"]["state"]["manual_rus"] == 500
    assert m["cosmos"]["manual_usd"] == pytest.approx(9 * 0.008 * 730, abs=0.01)  # 900 RU/s: $52.56
    assert m["cosmos"]["busiest_container_ru_per_s"] == 400 and m["cosmos"]["serverless_fits_one_partition"]
    sb = m["servicebus"]
    assert sb["operations_per_month"] == 50 * 26_280_000
    assert (sb["credits_per_s_messages"], sb["credits_per_s_all_calls"]) == (180, 600)
    assert sb["fits_one_namespace"] and sb["usd"] is None  # no USD price found
    d = m["durable"]
    assert (d["dts_actions_per_s"], d["dts_dedicated_cus"], d["dts_consumption_fits"]) == (120, 1, True)
    assert m["functions"]["executions_per_month"] == 16 * 26_280_000 + 0.5 * 2_628_000
    # at 100 orders/s the same order needs 6,000 credits/s: more than one Standard namespace's 1,000
    assert not ac.monthly(order, background, 100)["servicebus"]["fits_one_namespace"]


def test_durable_task_scheduler_actions_and_storage_model_from_history() -> None:
    # the published example: an orchestration calling three activities uses 7 actions
    assert ac.dts_actions({"EXECUTION_STARTED": 1, "TASK_SCHEDULED": 3, "TASK_COMPLETED": 3}) == 7
    assert ac.dts_actions({"EXECUTION_STARTED": 1, "TASK_SCHEDULED": 4, "EVENT_RAISED": 3, "TIMER_FIRED": 1}) == 13
    assert (
        ac.storage_model({"EXECUTION_STARTED": 1, "ORCHESTRATOR_STARTED": 8, "TASK_SCHEDULED": 4, "EVENT_RAISED": 3})
        == 2 + 40 + 16 + 3
    )


def test_background_is_subtracted_per_tick_for_timers_and_per_second_otherwise() -> None:
    delta = {
        "cosmos|supervisor|state|query_cross": 12,
        "sb|-|agent-requests|take": 40,
        "cosmos|advance_order|state|get": 6,
    }
    idle = {"cosmos|supervisor|state|query_cross": 4, "sb|-|agent-requests|take": 10}
    # supervisor: 4 per 2 idle ticks = 2 per tick, 3 ticks in the window -> 12 - 6 = 6; polling: 10 per 10 s,
    # 5 s window -> 40 - 5 = 35; nothing idle under advance_order -> 6; all over 3 orders
    out = ac.per_order(delta, idle, 10.0, {"supervisor": 2}, 5.0, {"supervisor": 3}, 3)
    assert out == pytest.approx(
        {
            "cosmos|supervisor|state|query_cross": 2.0,
            "sb|-|agent-requests|take": 35 / 3,
            "cosmos|advance_order|state|get": 2.0,
        }
    )
    assert ac.per_order({"sb|-|q|take": 1}, {"sb|-|q|take": 10}, 1.0, {}, 1.0, {}, 1) == {}  # never below 0


def test_seconds_of_schedule() -> None:
    assert ac.seconds_of("*/15 * * * * *") == 15.0
    assert ac.seconds_of("0 */5 * * * *") is None


# --- the counting it adds ----------------------------------------------------------------------------------------
async def test_store_calls_count_as_cosmos_operations(tmp_path: Path) -> None:
    import orderflow.embedded.store as sqlite_store

    with ac.metered() as meter:
        meter.patch_store(sqlite_store)
        orders, state = open_sqlite_stores(tmp_path / "store.db")
        index = open_sqlite_recovery_index(tmp_path / "store.db", 60)
        breakers = open_sqlite_documents(tmp_path / "store.db", "circuitBreakers")
        order = _order("o-1")
        token = ac.SCOPE.set("submission")
        try:
            await orders.create_if_absent(OrderRecord.from_order(order, T0))
            await state.create_if_absent(OrderStateRecord.new(order, T0))
            _, created = await state.create_if_absent(OrderStateRecord.new(order, T0))  # 409: then a read
        finally:
            ac.SCOPE.reset(token)
        assert created is False
        rec, etag = await state.update_with_retry(
            "o-1", lambda r: r.model_copy(update={"process_state": ProcessState.PROCESSING, "complete_by": T0})
        )
        await state.query_expired(T0 - timedelta(hours=1), T0 + timedelta(hours=1), 10)
        etag = await state.put_checkpoint("supervisor", {"at": 1}, None)
        await state.put_checkpoint("supervisor", {"at": 2}, etag)
        await breakers.get("fulfilment")
        entry = IndexEntry("o-1", T0, "o-1:1")
        await index.add(entry)
        await index.page(T0, T0 - timedelta(hours=1), T0 + timedelta(hours=1), ExpiredCursor.start(T0, None), 10)
        await index.remove(entry)
        await state.aclose()
        counts = meter.snapshot()
    assert counts == {
        "cosmos|submission|orders|create": 1,
        "cosmos|submission|state|create": 2,
        "cosmos|submission|state|point_read": 1,
        "cosmos|-|state|point_read": 1,  # update_with_retry: a read, then an If-Match replace
        "cosmos|-|state|replace": 1,
        "cosmos|-|state|query_cross": 1,
        "cosmos_items|-|state|query_cross": 1,
        "cosmos|-|checkpoints|create": 1,
        "cosmos|-|checkpoints|replace": 1,
        "cosmos|-|circuitBreakers|point_read": 1,
        "cosmos|-|recoveryIndex|upsert": 1,
        "cosmos|-|recoveryIndex|query_single": 1,
        "cosmos_items|-|recoveryIndex|query_single": 1,
        "cosmos|-|recoveryIndex|delete": 1,
    }
    assert "__wrapped__" not in vars(sqlite_store.SqliteStateStore.get)  # metered() undid the patch


def test_broker_calls_count_by_queue_outermost_only(tmp_path: Path) -> None:
    import orderflow.embedded.broker as broker_module

    with ac.metered() as meter:
        meter.patch_broker(broker_module)
        broker = EmbeddedBroker(tmp_path / "bus.db")
        broker.declare_queue("q")  # set-up, not an operation
        broker.send("q", [Envelope(body=b"a", message_id="m-1"), Envelope(body=b"b", message_id="m-2")])
        got = broker.receive("q", 5)  # calls take: counted once, as receive
        for message in got:
            broker.complete("q", message.sequence_number, str(message.lock_token))
        assert broker.receive("q", 5) == []
        broker.close()
        counts = meter.snapshot()
    assert counts == {
        "sb|-|q|send": 1,
        "sb_msgs|-|q|sent": 2,
        "sb|-|q|receive": 2,
        "sb_msgs|-|q|received": 2,
        "sb_empty|-|q|receive": 1,
        "sb|-|q|complete": 2,
    }


def test_summary_of_counts_per_order() -> None:
    per_role = {
        "devhost": {
            "cosmos|advance_order|state|replace": 2.0,
            "cosmos|submission|orders|create": 1.0,
            "sb|-|agent-replies|receive": 3.0,
            "sb_msgs|-|agent-replies|received": 3.0,
            "fn|submission|submission|exec": 1.0,
            "fn|agent_replies|agent_replies|exec": 3.0,
            "fn|supervisor|supervisor|exec": 0.5,
        },
        "client": {"sb|-|app-status|receive": 4.0, "sb_empty|-|app-status|receive": 2.0},
    }
    durable = {
        "instances": 1.0,
        "activities": 4.0,
        "episodes": 8.0,
        "history_events": 32.0,
        "history_events_by_type": {"EXECUTION_STARTED": 1.0, "TASK_SCHEDULED": 4.0, "EVENT_RAISED": 3.0},
    }
    s = ac.summarize(per_role, durable)
    assert s["cosmos"]["ru"] == 27.5 and s["cosmos"]["ru_by_database"] == {"orders": 5.5, "state": 22.0}
    assert s["servicebus"]["operations"] == 3 and s["servicebus"]["client"]["operations"] == 4
    assert s["servicebus"]["credits_messages"] == 3 and s["servicebus"]["client"]["empty"] == {"receive": 2.0}
    assert s["functions"]["executions"] == 1 + 3 + 8 + 4  # timer ticks are background, not the order's
    assert s["durable"]["dts_actions"] == 12


def test_orders_per_second_one_namespace_carries() -> None:
    order = {
        "servicebus": {
            "operations": 50.0,
            "empty": {"take": 10.0},
            "credits_messages": 15.0,
            "client": {"operations": 10.0, "empty": {"accept_session": 4.0}, "credits_messages": 3.0},
        }
    }
    cap = ac.namespace_capacity(order)
    assert cap["credits_per_order"] == {"messages_only": 18, "calls_without_empty": 46, "all_calls": 60}
    # 1,000 credits/s: 1000/18, 1000/46, 1000/60
    assert cap["max_orders_per_s"] == {"messages_only": 55.6, "calls_without_empty": 21.7, "all_calls": 16.7}
