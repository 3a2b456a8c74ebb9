"""The embedded store's fault switch (orderflow/embedded/store/ `StoreFaults`, `FaultInjector`), which the store
drills (lab/store_drills.py) turn on through the endpoint: `embedded://PATH?conflictRate=..&throttleRate=..`.

What it must do, each checked here without waiting (a fake sleep and clock):
- off by default: a plain endpoint has no injector at all;
- a 412 as a real concurrent writer causes it: another writer rewrites the item first (new etag, same content), the
  caller's If-Match write fails and changes nothing, and a fresh read lets the retry through;
- a 429 before anything is done, retried as azure-cosmos retries it (9 retries after x-ms-retry-after-ms, waits
  capped at 30 s), then a TransientStoreError(429);
- while the outage file exists, every operation answers 503, retried once after 500 ms as azure-cosmos does on a
  single-region account, nothing done; the file is looked at no more than every 100 ms;
- one ledger line per injected answer.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from orderflow.adapters import open_stores
from orderflow.embedded.store import (
    FaultInjector,
    SqliteFile,
    SqliteOrdersDb,
    SqliteStateStore,
    StoreFaults,
    split_endpoint_path,
)
from orderflow.errors import PreconditionFailed, TransientStoreError, is_transient
from orderflow.messages import SubmitOrder
from orderflow.records import OrderStateRecord, ProcessState

NOW = datetime(2025, 1, 1, tzinfo=UTC)
# azure-cosmos 4.17 defaults, which the embedded adapter copies: `_retry_options.RetryOptions` (9 throttle retries,
# 30 s of waits at most) and `_service_unavailable_retry_policy` (a 503 retried once on a single-region account,
# 500 ms later).
SDK_THROTTLE_RETRIES = 9
SDK_UNAVAILABLE_RETRY_AFTER_S = 0.5


def record(order_id: str = "o-1") -> OrderStateRecord:
    order = SubmitOrder(
        orderId=order_id,
        replyTo="app-status",
        customer={"id": "c", "name": "C"},
        items=[{"sku": "S", "quantity": 1, "unitPrice": Decimal("1.00")}],
        currency="EUR",
        submittedAt=NOW,
    )
    return OrderStateRecord.new(order, NOW)


class FakeTime:
    """The injector's sleep and clock: a sleep advances the clock and is remembered, nothing waits."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def monotonic(self) -> float:
        return self.now


def faulty_state(tmp_path: Path, query: str, time: FakeTime | None = None) -> tuple[SqliteStateStore, SqliteFile]:
    """A state store on `tmp_path/store.db` with the faults of `query`, its waits and clock faked."""
    path, faults = split_endpoint_path(f"{tmp_path / 'store.db'}?{query}")
    assert faults is not None
    db = SqliteFile(path, faults)
    time = time or FakeTime()
    db.faults = FaultInjector(faults, path, sleep=time.sleep, monotonic=time.monotonic)
    return SqliteStateStore(db), db


def ledger(tmp_path: Path) -> list[dict[str, object]]:
    path = tmp_path / "store.db.faults.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# --- the switch -------------------------------------------------------------------------------------------------


def test_options_parse_and_a_plain_path_has_no_faults(tmp_path: Path) -> None:
    path, faults = split_endpoint_path(
        f"{tmp_path}/s.db?conflictRate=0.25&throttleRate=0.5&seed=7"
        f"&throttleRetryAfterMs=3&outageFile={tmp_path}/s.db.down"
    )
    assert path == tmp_path / "s.db"
    assert faults == StoreFaults(
        conflict_rate=0.25,
        throttle_rate=0.5,
        throttle_retry_after_ms=3,
        seed=7,
        outage_file=tmp_path / "s.db.down",
        ledger=tmp_path / "s.db.faults.jsonl",
    )
    assert split_endpoint_path(f"{tmp_path}/s.db") == (tmp_path / "s.db", None)
    assert split_endpoint_path(f"{tmp_path}/s.db?") == (tmp_path / "s.db", None)


@pytest.mark.parametrize(
    "query", ["conflictrate=0.1", "throttleRate=1.5", "conflictRate=-0.1", "seed=x", "outageFile=", "throttleRate"]
)
def test_a_misspelt_or_bad_option_is_refused(tmp_path: Path, query: str) -> None:
    with pytest.raises(ValueError):
        split_endpoint_path(f"{tmp_path}/s.db?{query}")


async def test_off_by_default_and_on_through_the_endpoint_setting(tmp_path: Path) -> None:
    plain = open_stores({"CosmosDb__accountEndpoint": f"embedded://{tmp_path / 'a.db'}"})
    faulty = open_stores(
        {"CosmosDb__accountEndpoint": f"embedded://{tmp_path / 'b.db'}?throttleRate=1&throttleRetryAfterMs=0"}
    )
    try:
        assert isinstance(plain.state, SqliteStateStore) and plain.state._db.faults is None
        assert isinstance(faulty.orders, SqliteOrdersDb) and faulty.state._db.faults is not None  # type: ignore[union-attr]
        assert faulty.state._db.path == tmp_path / "b.db"  # type: ignore[union-attr]
        with pytest.raises(TransientStoreError):
            await faulty.state.get("o-1")
    finally:
        await plain.aclose()
        await faulty.aclose()


# --- 412: a concurrent writer -----------------------------------------------------------------------------------


async def test_a_conflict_is_a_rival_write_the_callers_write_fails_and_changes_nothing(tmp_path: Path) -> None:
    state, db = faulty_state(tmp_path, "conflictRate=1")
    rec, _ = await state.create_if_absent(record())  # a create is not an If-Match write: never a 412
    stored, etag = await state.get(rec.id) or (None, "")
    claimed = rec.model_copy(update={"process_state": ProcessState.PROCESSING, "locked_by": "o-1:1"})
    with pytest.raises(PreconditionFailed):
        await state.replace(claimed, etag)
    after, after_etag = await state.get(rec.id) or (None, "")
    assert after == stored  # the caller's write did not happen, and the rival changed no content
    assert after_etag != etag  # the rival wrote: the caller's etag is stale, as in a real race
    with pytest.raises(PreconditionFailed):  # every If-Match write at rate 1: the retry loop gives up
        await state.update_with_retry(rec.id, lambda r: claimed)
    assert [(e["op"], e["status"]) for e in ledger(tmp_path)][:1] == [("state.replace", 412)]
    assert len(ledger(tmp_path)) == 1 + 5  # one per If-Match write: update_with_retry tries 5 times
    await db.aclose()


async def test_after_a_conflict_a_fresh_read_lets_the_write_through(tmp_path: Path) -> None:
    state, db = faulty_state(tmp_path, "conflictRate=0.5&seed=3")
    rec, _ = await state.create_if_absent(record())
    for i in range(20):  # each update re-reads on 412 (UpdateWithRetry); at 0.5 some need it
        await state.update_with_retry(rec.id, lambda r, i=i: r.model_copy(update={"deferrals": i + 1}), attempts=50)
    final, _ = await state.get(rec.id) or (None, "")
    assert final is not None and final.deferrals == 20
    assert any(e["status"] == 412 for e in ledger(tmp_path))
    await db.aclose()


async def test_checkpoint_puts_conflict_too_but_their_creates_do_not(tmp_path: Path) -> None:
    state, db = faulty_state(tmp_path, "conflictRate=1")
    etag = await state.put_checkpoint("supervisor", {"position": 1}, None)
    with pytest.raises(PreconditionFailed):
        await state.put_checkpoint("supervisor", {"position": 2}, etag)
    data, _ = await state.get_checkpoint("supervisor") or ({}, "")
    assert data == {"position": 1}
    assert [(e["op"], e["status"]) for e in ledger(tmp_path)] == [("checkpoints.put", 412)]
    await db.aclose()


# --- 429: throttled ---------------------------------------------------------------------------------------------


async def test_a_throttled_request_is_retried_as_azure_cosmos_does_then_surfaces(tmp_path: Path) -> None:
    time = FakeTime()
    state, db = faulty_state(tmp_path, "throttleRate=1&throttleRetryAfterMs=20", time)
    with pytest.raises(TransientStoreError) as raised:
        await state.create_if_absent(record())
    assert raised.value.status_code == 429 and is_transient(raised.value)
    assert time.sleeps == [0.02] * SDK_THROTTLE_RETRIES  # the retry-after the service answered, 9 times
    assert [e["retried"] for e in ledger(tmp_path)] == [True] * SDK_THROTTLE_RETRIES + [False]
    db.faults = None
    assert await state.get("o-1") is None  # 429 before anything is done: nothing was created
    await db.aclose()


async def test_throttle_retries_stop_once_the_waits_reach_30_seconds(tmp_path: Path) -> None:
    time = FakeTime()
    state, db = faulty_state(tmp_path, "throttleRate=1&throttleRetryAfterMs=10000", time)
    with pytest.raises(TransientStoreError):
        await state.get("o-1")
    assert time.sleeps == [10.0, 10.0, 10.0]  # ResourceThrottleRetryPolicy: retry while the waits so far < 30 s
    await db.aclose()


async def test_throttling_at_a_rate_is_absorbed_by_the_retries(tmp_path: Path) -> None:
    time = FakeTime()
    state, db = faulty_state(tmp_path, "throttleRate=0.3&seed=1", time)
    for i in range(30):
        await state.create_if_absent(record(f"o-{i}"))
        assert await state.get(f"o-{i}") is not None
    throttled = [e for e in ledger(tmp_path) if e["status"] == 429]
    assert throttled and all(e["retried"] for e in throttled)
    assert {e["op"] for e in throttled} >= {"state.create", "state.get"}  # reads and writes alike
    await db.aclose()


# --- 503: the outage switch -------------------------------------------------------------------------------------


async def test_while_the_outage_file_exists_every_operation_answers_503(tmp_path: Path) -> None:
    time = FakeTime()
    down = tmp_path / "store.db.down"
    state, db = faulty_state(tmp_path, f"outageFile={down}", time)
    await state.create_if_absent(record())
    down.touch()
    time.now += 1.0
    for operation in (
        lambda: state.get("o-1"),
        lambda: state.create_if_absent(record("o-2")),
        lambda: state.count_in_state(ProcessState.PENDING),
    ):
        with pytest.raises(TransientStoreError) as raised:
            await operation()
        assert raised.value.status_code == 503
    assert time.sleeps == [SDK_UNAVAILABLE_RETRY_AFTER_S] * 3  # one retry each, 500 ms after the first answer
    down.unlink()
    time.now += 1.0
    assert await state.get("o-2") is None  # the create during the outage did nothing
    assert await state.get("o-1") is not None  # and the store is back
    refused = [e for e in ledger(tmp_path) if e["status"] == 503 and not e["retried"]]
    assert [e["op"] for e in refused] == ["state.get", "state.create", "state.count_in_state"]
    await db.aclose()


async def test_the_outage_file_is_looked_at_at_most_every_100_ms(tmp_path: Path) -> None:
    time = FakeTime()
    down = tmp_path / "store.db.down"
    state, db = faulty_state(tmp_path, f"outageFile={down}", time)
    assert await state.get("o-1") is None  # looked at: up
    down.touch()
    time.now += 0.05
    assert await state.get("o-1") is None  # within 100 ms of the last look: still up
    time.now += 0.06
    with pytest.raises(TransientStoreError):
        await state.get("o-1")
    await db.aclose()


async def test_the_outage_reaches_every_process_on_the_file(tmp_path: Path) -> None:
    """Two handles, as two processes have: the switch is the file, not a handle's state."""
    down = tmp_path / "store.db.down"
    first, db1 = faulty_state(tmp_path, f"outageFile={down}")
    second, db2 = faulty_state(tmp_path, f"outageFile={down}")
    down.touch()
    for state in (first, second):
        with pytest.raises(TransientStoreError):
            await state.get("o-1")
    await db1.aclose()
    await db2.aclose()
