"""The ops summary's dead-letter depths from Azure Resource Manager (orderflow/azure/queue_counts.py), against a local
fake of `Queues - Get` that answers the documented shape (tests/support/arm_server.py cites the REST reference and the
2024-01-01 schema): the request (path, api-version, bearer token for the ARM scope), exact depths for every queue,
and a refused, missing or failing queue that gets its own error entry while the others still count."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.arm_server import NAMESPACE_ID, TOKEN, FakeArm, FakeCredential, run_fake_arm

from orderflow.adapters import aio_bus_from_connection_string
from orderflow.azure import queue_counts
from orderflow.azure.queue_counts import ArmQueueCounts
from orderflow.clock import FakeClock
from orderflow.embedded.store import open_sqlite_stores
from orderflow.openapi import Summary
from orderflow.operations import Operations
from orderflow.runtime import Services, Tunables

ROOT = Path(__file__).resolve().parents[3]
TUNABLES = Tunables.from_env({})
QUEUES = sorted(TUNABLES.internal_queues() | TUNABLES.allowed_reply_queues)
# More than the summary's default peek cap (1000): the ARM count is exact, never capped.
DEPTHS = {q: n for n, q in enumerate(QUEUES)} | {"agent-requests": 1500}


@pytest.fixture
async def services(tmp_path: Path) -> AsyncIterator[Services]:
    conn = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={ROOT / 'servicebus.config.json'}"
    orders, state = open_sqlite_stores(tmp_path / "store.db")
    services = Services(
        orders=orders, state=state, bus=aio_bus_from_connection_string(conn), tunables=TUNABLES, clock=FakeClock()
    )
    yield services
    await services.bus.close()
    await state.aclose()


def _with_arm(services: Services, arm: FakeArm, credential: FakeCredential) -> Operations:
    services.queue_counts = ArmQueueCounts(NAMESPACE_ID, credential, endpoint=arm.url)
    return Operations(services)


async def test_the_summary_shows_each_queues_exact_depth_from_its_runtime_counts(services: Services) -> None:
    credential = FakeCredential()
    async with run_fake_arm(DEPTHS) as arm:
        summary = await _with_arm(services, arm, credential).summary()
    assert summary["deadLetters"] == {q: {"count": DEPTHS[q], "capped": False} for q in QUEUES}
    Summary.model_validate(summary)  # the documented answer (orderflow/openapi.py)
    assert sorted(arm.queues_read()) == QUEUES
    for seen in arm.seen:
        assert seen.method == "GET" and seen.path == f"{NAMESPACE_ID}/queues/{seen.path.rsplit('/', 1)[-1]}"
        assert seen.api_version == "2024-01-01" and seen.authorization == f"Bearer {TOKEN}"
    assert credential.scopes == [("https://management.azure.com/.default",)]


async def test_a_refused_queue_gets_its_error_and_the_others_still_count(services: Services) -> None:
    async with run_fake_arm(DEPTHS, refused={"operator-alerts"}) as arm:
        depths = (await _with_arm(services, arm, FakeCredential()).summary())["deadLetters"]
    error = depths.pop("operator-alerts")["error"]
    assert "403 AuthorizationFailed" in error and "Reader on queue operator-alerts" in error
    assert depths == {q: {"count": DEPTHS[q], "capped": False} for q in QUEUES if q != "operator-alerts"}


async def test_a_missing_queue_and_a_failing_arm_are_each_one_error_entry(services: Services) -> None:
    present = {q: n for q, n in DEPTHS.items() if q != "app-status"}
    async with run_fake_arm(present) as arm:
        depths = (await _with_arm(services, arm, FakeCredential()).summary())["deadLetters"]
    assert "404 NotFound" in depths["app-status"]["error"] and "no queue app-status" in depths["app-status"]["error"]
    assert depths["agent-requests"] == {"count": 1500, "capped": False}

    async with run_fake_arm(DEPTHS, failing={"agent-requests": 503}) as arm:
        depths = (await _with_arm(services, arm, FakeCredential()).summary())["deadLetters"]
    assert depths["agent-requests"] == {"error": "not read: Azure Resource Manager answered 503 ServiceUnavailable"}
    assert arm.queues_read().count("agent-requests") == queue_counts.ATTEMPTS  # bounded: one retry, no loop
    assert depths["operator-alerts"] == {"count": DEPTHS["operator-alerts"], "capped": False}


async def test_a_queue_arm_does_not_answer_is_bounded_by_the_timeout(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queue_counts, "TIMEOUT_SECONDS", 0.3)
    async with run_fake_arm(DEPTHS, stalled={"app-status"}) as arm:
        depths = (await _with_arm(services, arm, FakeCredential()).summary())["deadLetters"]
    assert "no answer from Azure Resource Manager within 0.3 s" in depths["app-status"]["error"]
    assert depths["orders-inbound"] == {"count": DEPTHS["orders-inbound"], "capped": False}


async def test_no_token_is_an_error_entry_per_queue_not_a_failed_summary(services: Services) -> None:
    class NoToken:
        async def get_token(self, *scopes: str, **kwargs: object) -> object:
            raise RuntimeError("ManagedIdentityCredential authentication unavailable")

    services.queue_counts = ArmQueueCounts(NAMESPACE_ID, NoToken(), endpoint="http://127.0.0.1:9")
    depths = (await Operations(services).summary())["deadLetters"]
    assert set(depths) == set(QUEUES)
    assert all("no token for Azure Resource Manager" in d["error"] for d in depths.values())


async def test_the_setting_selects_the_source() -> None:
    assert queue_counts.from_settings({}) is None  # locally: the broker's count, as before
    counts = queue_counts.from_settings({"ServiceBusNamespaceResourceId": NAMESPACE_ID, "AZURE_CLIENT_ID": "cid"})
    assert counts is not None and counts.namespace_id == NAMESPACE_ID
    assert counts.url("a b") == f"https://management.azure.com{NAMESPACE_ID}/queues/a%20b"
    await counts.credential.close()  # type: ignore[attr-defined]  # DefaultAzureCredential (aio)
