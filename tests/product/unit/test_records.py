"""Unit tests of the stored records (orderflow.records) and the clock (orderflow.clock): JSON shape, the
sortable UTC datetime format, round trips, and time handling."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from orderflow.clock import Clock, FakeClock, SystemClock, ensure_utc
from orderflow.messages import STEPS, SubmitOrder
from orderflow.records import (
    OrderRecord,
    OrderStateRecord,
    ProcessState,
    StepStatus,
    format_utc,
    instance_id,
    parse_utc,
)

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def order(quantity: int = 1) -> SubmitOrder:
    return SubmitOrder.model_validate(
        {
            "orderId": "o-1",
            "replyTo": "app-status",
            "customer": {"id": "c", "name": "n"},
            "items": [{"sku": "s", "quantity": quantity, "unitPrice": "1.50"}],
            "currency": "EUR",
            "submittedAt": "2024-05-01T14:00:00+02:00",
        }
    )


# --- datetime format ------------------------------------------------------------------------------


def test_format_is_fixed_utc_with_microseconds_and_z() -> None:
    assert format_utc(datetime(2024, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))) == "2024-05-01T12:00:00.000000Z"
    assert format_utc(datetime(2024, 5, 1, 12, 0, 0, 7, tzinfo=UTC)) == "2024-05-01T12:00:00.000007Z"


aware = st.datetimes(
    min_value=datetime(1000, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]),
)


@given(aware, aware)
def test_string_order_is_time_order(a: datetime, b: datetime) -> None:
    assert (format_utc(a) < format_utc(b)) == (a < b)
    assert len(format_utc(a)) == 27


@given(aware)
def test_parse_inverts_format(a: datetime) -> None:
    assert parse_utc(format_utc(a)) == a and parse_utc(format_utc(a)).tzinfo == UTC


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError):
        format_utc(datetime(2024, 5, 1))
    with pytest.raises(ValidationError):
        OrderStateRecord.model_validate(
            {**OrderStateRecord.new(order(), NOW).to_doc(), "createdAt": "2024-05-01T12:00:00"}
        )


# --- OrderStateRecord -----------------------------------------------------------------------------


def test_new_state_record_is_pending_unlocked_with_every_step_pending() -> None:
    rec = OrderStateRecord.new(order(), NOW)
    assert (rec.id, rec.order_id, rec.process_state, rec.locked_by, rec.failure_count, rec.attempt) == (
        "o-1",
        "o-1",
        ProcessState.PENDING,
        None,
        0,
        0,
    )
    assert [s.name for s in rec.steps] == list(STEPS)
    assert all(s.status is StepStatus.PENDING for s in rec.steps)
    assert rec.order_hash == order().immutable_hash() and rec.reply_to == "app-status"


def test_state_document_is_camel_case_with_sortable_dates() -> None:
    rec = OrderStateRecord.new(order(), NOW).model_copy(update={"retry_at": NOW + timedelta(seconds=2)})
    doc = rec.to_doc()
    assert set(doc) == {
        "id",
        "orderId",
        "app",
        "processState",
        "lockedBy",
        "completeBy",
        "failureCount",
        "attempt",
        "replyTo",
        "steps",
        "lastError",
        "previousErrors",
        "retryAt",
        "deferrals",
        "restarts",
        "compensationCause",
        "compensations",
        "compensationFailures",
        "cancelRequestedAt",
        "cancelReason",
        "workflowVersion",
        "orderHash",
        "schemaVersion",
        "createdAt",
        "updatedAt",
        "notifiedAt",
        "resubmissions",
        "resubmissionsDropped",
        "previousErrorsDropped",
        "kept",
        "traceparent",
    }
    assert "ttl" not in doc  # no ttl while the record has none: the container's default (never) applies
    assert doc["processState"] == "Pending" and doc["lockedBy"] is None
    assert doc["retryAt"] == "2024-05-01T12:00:02.000000Z" and doc["createdAt"] == "2024-05-01T12:00:00.000000Z"
    assert set(doc["steps"][0]) == {"name", "status", "attempt", "startedAt", "completedAt"}
    assert doc["steps"][0]["name"] == "reserve-inventory"


def test_round_trip_drops_store_system_properties_and_keeps_unknown_fields() -> None:
    rec = OrderStateRecord.new(order(), NOW)
    stored = {**rec.to_doc(), "_etag": '"x"', "_rid": "r", "_ts": 1, "addedByNewerVersion": {"a": 1}}
    back = OrderStateRecord.from_doc(stored)
    assert back.to_doc() == {**rec.to_doc(), "addedByNewerVersion": {"a": 1}}
    assert "_etag" not in back.to_doc()


def test_previous_errors_default_empty_and_round_trip() -> None:
    """A record written before `previousErrors` existed reads as no history; the history survives a round trip."""
    doc = OrderStateRecord.new(order(), NOW).to_doc()
    del doc["previousErrors"]
    assert OrderStateRecord.from_doc(doc).previous_errors == ()
    rec = OrderStateRecord.new(order(), NOW).model_copy(update={"previous_errors": ("attempt 1 expired",)})
    assert rec.to_doc()["previousErrors"] == ["attempt 1 expired"]
    assert OrderStateRecord.from_doc(rec.to_doc()).previous_errors == ("attempt 1 expired",)


def test_records_are_immutable() -> None:
    rec = OrderStateRecord.new(order(), NOW)
    with pytest.raises(ValidationError):
        rec.locked_by = "o-1:1"  # type: ignore[misc]


# --- OrderRecord ----------------------------------------------------------------------------------


def test_order_record_keeps_the_order_and_its_hash() -> None:
    rec = OrderRecord.from_order(order(), NOW)
    assert (rec.id, rec.order_id, rec.order_hash) == ("o-1", "o-1", order().immutable_hash())
    assert rec.submit_order() == order()
    assert OrderRecord.from_doc(rec.to_doc()) == rec
    assert rec.order_hash != OrderRecord.from_order(order(quantity=2), NOW).order_hash


# --- instance id ----------------------------------------------------------------------------------


def test_instance_id_is_order_and_attempt() -> None:
    assert instance_id("o-1", 3) == "o-1:3"
    for bad in (0, 100_000):
        with pytest.raises(ValueError):
            instance_id("o-1", bad)


# --- clock ----------------------------------------------------------------------------------------


def test_system_clock_is_aware_utc() -> None:
    now = SystemClock().now()
    assert now.tzinfo == UTC and isinstance(SystemClock(), Clock)


def test_fake_clock_moves_only_when_told() -> None:
    clock = FakeClock(NOW)
    assert clock.now() == NOW == clock.now()
    assert clock.advance(1.5) == NOW + timedelta(seconds=1.5)
    assert clock.advance(timedelta(minutes=1)) == clock.now() == NOW + timedelta(seconds=61.5)
    clock.set(NOW)
    assert clock.now() == NOW and isinstance(clock, Clock)
    with pytest.raises(ValueError):
        clock.advance(-1)
    with pytest.raises(ValueError):
        clock.set(datetime(2024, 1, 1))


def test_ensure_utc_converts_offsets() -> None:
    assert ensure_utc(datetime(2024, 5, 1, 14, tzinfo=timezone(timedelta(hours=2)))) == NOW
