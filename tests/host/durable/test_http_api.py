"""The extension's HTTP API on devhost, with raw HTTP and with the real DurableOrchestrationClient.

Conformance source: Azure/azure-functions-durable-extension
src/WebJobs.Extensions.DurableTask/HttpApiHandler.cs
(HandleStartOrchestratorRequestAsync 202/400, 500 on a running id, HandleGetStatusRequestAsync 200/202/404, raise event
400/404/410,
terminate 202/404/410, purge 200/404/412, x-ms-continuation-token) and the "HTTP API reference" docs page;
the client's expectations: azure/durable_functions/models/DurableOrchestrationClient.py.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest
from azure.durable_functions import OrchestrationRuntimeStatus
from yarl import URL

from devhost.durable import InstanceAlreadyExists, InvalidInstanceId
from tests.host.durable.harness import Hub


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def start_http(hub: Hub, name: str, instance_id: str | None = None, body: str = "") -> tuple[int, dict, dict]:
    path = f"{hub.base}/orchestrators/{name}" + (f"/{quote(instance_id, safe='')}" if instance_id else "")
    url = URL(path, encoded=True)
    async with hub.http.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
        return response.status, dict(response.headers), await response.json(content_type=None)


async def test_start_returns_202_with_management_payload_and_location(hub: Hub) -> None:
    status, headers, payload = await start_http(hub, "hello_sequence", body='["Kyiv"]')
    assert status == 202
    assert headers["Location"] == payload["statusQueryGetUri"]
    assert payload["statusQueryGetUri"].startswith(f"{hub.base}/instances/{payload['id']}?")
    assert (await hub.wait(payload["id"]))["output"] == ["Hello Kyiv!", "DONE"]


@pytest.mark.parametrize("bad_id", ["", "@entity", "a/b", "a#b", "a?b", "x" * 101, "tab\there", "bell\x07"])
async def test_invalid_instance_ids_are_rejected(hub: Hub, bad_id: str) -> None:
    with pytest.raises(InvalidInstanceId):
        await hub.engine.start_new("hello_sequence", bad_id)
    if bad_id and "/" not in bad_id:  # an empty or slashed id is another route
        status, _, body = await start_http(hub, "hello_sequence", bad_id)
        assert status == 400 and body["ExceptionMessage"]


async def test_unknown_orchestrator_is_400_and_a_clean_client_exception(hub: Hub) -> None:
    status, _, body = await start_http(hub, "no_such_orchestrator")
    assert status == 400
    with pytest.raises(Exception, match="no_such_orchestrator"):
        await hub.client.start_new("no_such_orchestrator")


async def test_start_on_a_running_id_is_500_and_a_terminal_id_is_reusable(hub: Hub) -> None:
    # Conformance: Azure/azure-functions-durable-extension DurableClient.StartNewAsync passes the default
    # OverridableExistingInstanceStates.NonRunningStates as dedupe statuses; Azure/durabletask
    # AzureStorageOrchestrationService.CreateTaskOrchestrationAsync throws OrchestrationAlreadyExistsException
    # ("An Orchestration instance with the status Running already exists.", an InvalidOperationException);
    # HttpApiHandler.HandleStartOrchestratorRequestAsync does not catch it, so HttpApiHandler.HandleRequestAsync's
    # generic catch answers 500 with HttpRequestMessageExtensions.CreateErrorResponse's body. No 409.
    instance_id = new_id("dup")
    await hub.client.start_new("approval", instance_id, {"timeout": 30})
    await hub.wait(instance_id, "Running")
    status, headers, body = await start_http(hub, "approval", instance_id, '{"timeout": 30}')
    assert status == 500 and headers["Content-Type"].startswith("application/json")
    assert body == {
        "Message": "Something went wrong while processing your request",
        "ExceptionMessage": "An Orchestration instance with the status Running already exists.",
        "ExceptionType": "DurableTask.Core.Exceptions.OrchestrationAlreadyExistsException",
        "StackTrace": body["StackTrace"],
    }
    with pytest.raises(InstanceAlreadyExists):
        await hub.engine.start_new("approval", instance_id, {"timeout": 30})
    # DurableOrchestrationClient.start_new: neither 2xx nor 400, so it raises Exception(<the response body>).
    with pytest.raises(Exception) as raised:  # the client raises a bare Exception
        await hub.client.start_new("approval", instance_id, {"timeout": 30})
    assert type(raised.value) is Exception and raised.value.args == (body,)
    await hub.client.terminate(instance_id, "make room")
    assert (await hub.wait(instance_id))["runtimeStatus"] == "Terminated"
    await hub.client.start_new("hello_sequence", instance_id, ["Again"])  # fresh history under the same id
    status_after = await hub.wait(instance_id, "Completed")
    assert status_after["output"] == ["Hello Again!", "DONE"]


async def test_starter_treats_a_running_instance_as_started_not_as_a_failure(hub: Hub) -> None:
    # What the real Python client raises for a running id (above) must not make the Starter report a failed start:
    # the instance is this attempt's own orchestration (the id is `<orderId>:<attempt>`), and it runs.
    from orderflow.starter import StarterRun, is_already_running, start_attempt
    from orderflow.workflow import WorkflowInput

    inp = WorkflowInput(order_id=new_id("o"), attempt=1, step_timeout_seconds=30, agent_retries=1)
    instance_id = f"{inp.order_id}:1"

    async def start_new(name: str, iid: str, client_input: object) -> str:
        return await hub.client.start_new("approval", iid, {"timeout": 30})

    first, second = StarterRun(), StarterRun()
    await start_attempt(start_new, inp, first)
    await hub.wait(instance_id, "Running")
    await start_attempt(start_new, inp, second)
    assert first.claimed == [instance_id] and second.claimed == []
    assert second.already_running == [instance_id] and second.start_failed == []
    assert not is_already_running(ConnectionError("host unreachable"))
    assert not is_already_running(Exception({"Message": "Something went wrong", "ExceptionMessage": "boom"}))
    await hub.client.terminate(instance_id, "done")


async def test_status_codes_follow_the_runtime_status(hub: Hub) -> None:
    async with hub.http.get(f"{hub.base}/instances/nobody") as response:
        assert response.status == 404
    instance_id = await hub.client.start_new("approval", new_id("st"), {"timeout": 30})
    async with hub.http.get(f"{hub.base}/instances/{instance_id}") as response:
        assert response.status == 202 and "Location" in response.headers
    await hub.client.raise_event(instance_id, "Approval", 1)
    await hub.wait(instance_id)
    async with hub.http.get(f"{hub.base}/instances/{instance_id}?showHistory=true&showHistoryOutput=true") as resp:
        body = await resp.json()
        assert resp.status == 200 and body["runtimeStatus"] == "Completed"
        kinds = [e["EventType"] for e in body["historyEvents"]]
        assert kinds[0] == "ExecutionStarted" and "EventRaised" in kinds and kinds[-1] == "ExecutionCompleted"
    async with hub.http.get(f"{hub.base}/instances/{instance_id}?showInput=false") as response:
        assert (await response.json())["input"] is None


async def test_failed_status_can_be_500_on_request(hub: Hub) -> None:
    instance_id = await hub.client.start_new("exploding", new_id("f"))
    await hub.wait(instance_id)
    async with hub.http.get(f"{hub.base}/instances/{instance_id}?returnInternalServerErrorOnFailure=true") as resp:
        assert resp.status == 500


async def test_query_filters_and_pages_with_a_continuation_token(hub: Hub) -> None:
    prefix = new_id("q")
    ids = [await hub.client.start_new("hello_sequence", f"{prefix}-{i}", ["x"]) for i in range(3)]
    for instance_id in ids:
        await hub.wait(instance_id)
    running = await hub.client.start_new("approval", f"{prefix}-run", {"timeout": 30})
    await hub.wait(running, "Running")
    seen: list[str] = []
    token = None
    while True:
        headers = {"x-ms-continuation-token": token} if token else {}
        async with hub.http.get(
            f"{hub.base}/instances?runtimeStatus=Completed&instanceIdPrefix={prefix}&top=2", headers=headers
        ) as response:
            assert response.status == 200
            seen += [s["instanceId"] for s in await response.json()]
            token = response.headers.get("x-ms-continuation-token")
        if not token:
            break
    assert sorted(seen) == sorted(ids)
    by_client = await hub.client.get_status_by(
        runtime_status=[OrchestrationRuntimeStatus.Running],
        created_time_from=datetime.now(UTC) - timedelta(minutes=5),
    )
    assert [s.instance_id for s in by_client if s.instance_id.startswith(prefix)] == [running]


async def test_raise_event_status_codes(hub: Hub) -> None:
    async with hub.http.post(f"{hub.base}/instances/ghost/raiseEvent/E", json=1) as response:
        assert response.status == 404
    with pytest.raises(Exception, match="No instance with ID ghost found"):
        await hub.client.raise_event("ghost", "E", 1)
    instance_id = await hub.client.start_new("approval", new_id("re"), {"timeout": 30})
    async with hub.http.post(
        f"{hub.base}/instances/{instance_id}/raiseEvent/Approval",
        data="x",
        headers={"Content-Type": "text/plain"},
    ) as response:
        assert response.status == 400


async def test_terminate_then_gone_and_purge_rules(hub: Hub) -> None:
    instance_id = await hub.client.start_new("approval", new_id("term"), {"timeout": 30})
    async with hub.http.delete(f"{hub.base}/instances/{instance_id}") as response:
        assert response.status == 412  # only terminal instances can be purged
    async with hub.http.post(f"{hub.base}/instances/{instance_id}/terminate?reason=stop%20it") as response:
        assert response.status == 202
    status = await hub.wait(instance_id)
    assert status["runtimeStatus"] == "Terminated" and status["output"] == "stop it"
    async with hub.http.post(f"{hub.base}/instances/{instance_id}/terminate") as response:
        assert response.status == 410
    async with hub.http.post(f"{hub.base}/instances/nobody/terminate") as response:
        assert response.status == 404
    result = await hub.client.purge_instance_history(instance_id)
    assert result.instances_deleted == 1
    assert (await hub.client.purge_instance_history(instance_id)).instances_deleted == 0
    assert await hub.engine.get_status(instance_id) is None


async def test_raise_event_on_a_finished_instance_answers_410_before_checking_the_content_type(hub: Hub) -> None:
    # Source: HttpApiHandler.HandleRaiseEventRequestAsync checks 404, then 410, then the content type.
    iid = f"done-{uuid.uuid4().hex[:6]}"
    await hub.client.start_new("hello_sequence", iid, None)
    await hub.wait(iid)
    url = f"{hub.base}/instances/{iid}/raiseEvent/late"
    async with hub.http.post(url, data="x", headers={"Content-Type": "text/plain"}) as response:
        assert response.status == 410
