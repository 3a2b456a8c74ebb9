"""Activities, sub-orchestrations, continue-as-new, custom status and the durableClient binding."""

from __future__ import annotations

import uuid

from orderflow.starter import never_started
from tests.host.durable.harness import Hub


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def test_sequence_of_sync_and_async_activities_completes_with_output(hub: Hub) -> None:
    instance_id = await hub.client.start_new("hello_sequence", new_id("seq"), ["Tokyo", "Lima"])
    status = await hub.wait(instance_id)
    assert status["runtimeStatus"] == "Completed", status
    assert status["output"] == ["Hello Tokyo!", "Hello Lima!", "DONE"]
    assert status["customStatus"] == {"greeted": 2}
    sdk_status = await hub.client.get_status(instance_id)
    assert sdk_status.output == ["Hello Tokyo!", "Hello Lima!", "DONE"]
    assert sdk_status.runtime_status.value == "Completed"


async def test_sub_orchestrations_complete_and_their_failure_reaches_the_parent(hub: Hub) -> None:
    instance_id = await hub.client.start_new("parent", new_id("parent"))
    status = await hub.wait(instance_id)
    assert status["runtimeStatus"] == "Completed", status
    assert status["output"]["child"] == ["Hello Oslo!", "DONE"]
    assert "boom: the order is invalid" in status["output"]["error"]
    child = await hub.engine.get_status(f"{instance_id}-bad")
    assert child is not None and child["runtimeStatus"] == "Failed"


async def test_continue_as_new_restarts_with_fresh_history_until_done(hub: Hub) -> None:
    instance_id = await hub.client.start_new("countdown", new_id("count"), 3)
    status = await hub.wait(instance_id)
    assert status["output"] == "liftoff"
    history = hub.engine.store.history(instance_id)
    started = [e for e in history if e["EventType"] == 0]
    assert len(started) == 1 and started[0]["Input"] == "0"  # only the last generation's history is kept


async def test_activities_run_concurrently_up_to_the_limit(hubs) -> None:  # type: ignore[no-untyped-def]
    from tests.host.sample_app.function_app import PROBE

    hub = await hubs.start(max_concurrent_activities=3)
    PROBE.update(active=0, peak=0, calls=0)
    instance_id = await hub.client.start_new("fan_out", new_id("fan"), {"count": 9, "seconds": 0.15})
    status = await hub.wait(instance_id)
    assert status["output"] == 9
    assert PROBE["calls"] == 9
    assert 1 < PROBE["peak"] <= 3


async def test_durable_client_binding_is_injected_by_the_invoker(hub: Hub) -> None:
    import azure.functions as func

    from tests.host.durable.harness import function

    request = func.HttpRequest(
        "POST",
        "http://localhost/api/start/hello_sequence",
        body=b'["Rome"]',
        route_params={"name": "hello_sequence"},
    )
    response = await hub.invoker.call(function("http_start"), {"req": request})
    assert response.status_code == 202
    import json

    payload = json.loads(response.get_body())
    assert response.headers["Location"] == payload["statusQueryGetUri"]
    status = await hub.wait(payload["id"])
    assert status["output"] == ["Hello Rome!", "DONE"]


async def test_entities_are_reported_as_not_supported(hub: Hub) -> None:
    instance_id = await hub.client.start_new("uses_entity", new_id("entity"))
    status = await hub.wait(instance_id)
    assert status["runtimeStatus"] == "Failed"
    assert "Durable entities are not supported by devhost" in status["output"]
    async with hub.http.get(f"{hub.base}/entities/counter_entity/k") as response:
        assert response.status == 501
        assert "not supported by devhost" in (await response.json())["Message"]


async def test_the_sdk_status_of_an_unknown_instance_has_no_runtime_status(hub: Hub) -> None:
    """Conformance: the extension answers GET .../instances/{id} of an unknown id with 404 and no body
    (HttpApiHandler.HandleGetStatusRequestAsync), which DurableOrchestrationClient.get_status turns into
    DurableOrchestrationStatus.from_json("") (azure-functions-durable 1.x). The Supervisor's restart of a claim whose
    orchestration never started (orderflow.starter.never_started) rests on this."""
    assert never_started(await hub.client.get_status(new_id("never")))
    instance_id = await hub.client.start_new("hello_sequence", new_id("seq"), ["Oslo"])
    assert not never_started(await hub.client.get_status(instance_id))  # Pending or Running: it exists
    await hub.wait(instance_id)
    assert not never_started(await hub.client.get_status(instance_id))
