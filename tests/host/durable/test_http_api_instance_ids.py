"""Conformance: devhost's Durable HTTP API answers unknown, invalid and unroutable instance ids as the extension does.

Source: Azure/azure-functions-durable-extension, branch dev, commit a7c6d6944041b48267ed8409bb8ec8144ab9bab9:

- src/WebJobs.Extensions.DurableTask/HttpApiHandler.cs `HandleRequestAsync`: the path is matched against
  `orchestrators/{functionName}/{instanceId?}`, `entities/...`, `instances/{instanceId?}/{operation?}` and
  `instances/{instanceId?}/raiseEvent/{eventName}` (TemplateMatcher, one segment per parameter); a path none of them
  takes, a method a route does not serve, and a POST to `instances/{id}` with no or an unknown operation all end in
  `return request.CreateResponse(HttpStatusCode.NotFound)`. (Until #773, 2019, an unmatched path was a 400 "No such
  API"; the current source has no such text.)
- `HandleRaiseEventRequestAsync`: no status → `CreateResponse(NotFound)`; Completed/Failed/Terminated/Canceled →
  `CreateResponse(Gone)`; a media type other than application/json →
  `CreateErrorResponse(BadRequest, "Only application/json request content is supported")`; a JsonReaderException →
  `CreateErrorResponse(BadRequest, "Invalid JSON content", e)`.
- src/WebJobs.Extensions.DurableTask/HttpRequestMessageExtensions.cs: `CreateResponse(request, status)` sets no
  Content (an empty body); `CreateErrorResponse(request, status, message)` is `{"Message": message}`;
  `CreateErrorResponse(request, status, message, e)` adds ExceptionMessage, ExceptionType and StackTrace.

The client side: azure/durable_functions/models/utils/http_utils.py `post_async_request` reads every answer with
`response.json(content_type=None)`: an empty body is None, a non-JSON body raises `json.JSONDecodeError` before the
status is looked at. So an unroutable id must get the extension's empty 404 for `raise_event` to raise its "No
instance" Exception, as it does against Azure (issue 8: aiohttp's text "404: Not Found" made it a JSONDecodeError).

The client builds `<rpcBaseUrl>instances/<id>/raiseEvent/<event>` without quoting (models/DurableOrchestrationClient.py
`_get_raise_event_url`), so '/' adds a segment, '?' and '#' end the path, and yarl folds '..'.
"""

from __future__ import annotations

import json
import uuid

import pytest

from tests.host.durable.harness import Hub

# The ids of issue 8, each with where the client's URL takes it.
UNROUTABLE_IDS = {
    "": "instances//raiseEvent/E: no instance has an empty id",
    "x/y:1": "instances/x/y:1/raiseEvent/E: four segments, no route",
    "x?y": "POST instances/x (the rest is the query): no operation",
    "x#y": "POST instances/x (the rest is the fragment): no operation",
    "../x:1": "x:1/raiseEvent/E (yarl folds '..'): no route",
}


def raise_event_url(hub: Hub, instance_id: str, event: str = "E") -> str:
    """The URL exactly as DurableOrchestrationClient._get_raise_event_url builds it."""
    return f"{hub.client._orchestration_bindings.rpc_base_url}instances/{instance_id}/raiseEvent/{event}"


@pytest.mark.parametrize("instance_id", list(UNROUTABLE_IDS), ids=list(UNROUTABLE_IDS.values()))
async def test_an_unroutable_instance_id_answers_404_with_no_body(hub: Hub, instance_id: str) -> None:
    async with hub.http.post(
        raise_event_url(hub, instance_id), data=json.dumps("{}"), headers={"Content-Type": "application/json"}
    ) as response:
        assert response.status == 404
        assert await response.read() == b""


@pytest.mark.parametrize("instance_id", list(UNROUTABLE_IDS), ids=list(UNROUTABLE_IDS.values()))
async def test_the_real_client_reads_it_as_no_such_instance(hub: Hub, instance_id: str) -> None:
    # Not a JSONDecodeError: the client saw a 404 it could read.
    with pytest.raises(Exception) as raised:  # the client raises a bare Exception
        await hub.client.raise_event(instance_id, "E", {"a": 1})
    assert type(raised.value) is Exception
    assert str(raised.value) == f"No instance with ID {instance_id} found."


async def test_an_unknown_instance_answers_404_with_no_body(hub: Hub) -> None:
    async with hub.http.post(raise_event_url(hub, f"ghost-{uuid.uuid4().hex[:6]}:1"), json={"a": 1}) as response:
        assert (response.status, await response.read()) == (404, b"")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/instances/some-id"),  # an id with no operation
        ("PUT", "/instances/some-id"),
        ("POST", "/instances/some-id/unknownOperation"),  # the Post branch has no else: falls through to NotFound
        ("GET", "/instances/some-id/raiseEvent/E"),  # raiseEvent serves POST only
        ("POST", "/instances/a/b/c/d/e"),
        ("POST", "/nothing-here"),
        ("GET", "/orchestrators/hello_sequence"),  # start serves POST only
    ],
)
async def test_a_path_or_method_no_route_takes_answers_404_with_no_body(hub: Hub, method: str, path: str) -> None:
    async with hub.http.request(method, f"{hub.base}{path}") as response:
        assert (response.status, await response.read()) == (404, b"")


async def test_a_finished_instance_answers_410_with_no_body(hub: Hub) -> None:
    iid = f"done-{uuid.uuid4().hex[:6]}"
    await hub.client.start_new("hello_sequence", iid, None)
    await hub.wait(iid)
    async with hub.http.post(raise_event_url(hub, iid), json=1) as response:
        assert (response.status, await response.read()) == (410, b"")


async def test_raise_event_400_bodies(hub: Hub) -> None:
    iid = await hub.client.start_new("approval", f"re-{uuid.uuid4().hex[:6]}", {"timeout": 30})
    async with hub.http.post(
        raise_event_url(hub, iid, "Approval"), data="x", headers={"Content-Type": "text/plain"}
    ) as response:
        assert response.status == 400
        # CreateErrorResponse(BadRequest, message): no exception, so Message only.
        assert await response.json() == {"Message": "Only application/json request content is supported"}
    async with hub.http.post(
        raise_event_url(hub, iid, "Approval"), data="{not json", headers={"Content-Type": "application/json"}
    ) as response:
        assert response.status == 400
        body = await response.json()
        assert set(body) == {"Message", "ExceptionMessage", "ExceptionType", "StackTrace"}
        assert body["Message"] == "Invalid JSON content"
    await hub.client.terminate(iid, "done")
