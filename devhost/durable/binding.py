"""The durableClient binding and the tokens of the extension's HTTP API, as the SDK's client sees and sends them."""

from __future__ import annotations

import json

WEBHOOK_PREFIX = "/runtime/webhooks/durabletask"


def token_to_serialized(token_text: str | None) -> str | None:
    """The serialized orchestration input that `get_input` reads, from a start request's posted JSON body.

    The Python client posts `json.dumps(value)` as a JSON string, and `get_input` sees the value (the orchestration
    input works in Azure), so a string token that is itself JSON is taken as already serialized; any other token (a
    curl body such as {"a": 1} or "approved") is serialized as is. Raised events are NOT treated this way: see
    `event_token_to_serialized`.
    """
    if token_text is None or token_text == "":
        return None
    token = json.loads(token_text)
    if isinstance(token, str):
        try:
            json.loads(token)
            return token
        except ValueError:
            return json.dumps(token)
    return json.dumps(token)


def event_token_to_serialized(token_text: str | None) -> str | None:
    """A raised event's data as the extension stores it: the posted JSON token, as it is.

    HttpApiHandler.HandleRaiseEventRequestAsync parses the body with `JToken.Parse` and passes the token to
    `RaiseEventAsync`; nothing unwraps a string token. The Python client posts `json.dumps(data)` through aiohttp's
    `json=`, a JSON string, so `wait_for_external_event` yields a `str` (azure-functions-durable-python #295, open).
    An object body (curl, another language's client) stays an object.
    """
    if token_text is None or token_text == "":
        return None
    return json.dumps(json.loads(token_text))


def client_binding_json(base_url: str, task_hub: str) -> str:
    """What a durableClient parameter receives (DurableOrchestrationBindings JSON) from the host at `base_url`: the
    engine's own bindings, and a process of its own racing the host's Starter or Supervisor (lab/racers.py)."""
    base = f"{base_url}{WEBHOOK_PREFIX}"
    query = f"taskHub={task_hub}&connection=Storage"
    instance = f"{base}/instances/INSTANCEID"
    create = f"{base}/orchestrators/{{functionName}}[/{{instanceId}}]"
    return json.dumps(
        {
            "taskHubName": task_hub,
            "creationUrls": {
                "createNewInstancePostUri": f"{create}?{query}",
                "createAndWaitOnNewInstancePostUri": f"{create}?timeout={{timeoutInSeconds}}"
                f"&pollingInterval={{intervalInSeconds}}&{query}",
            },
            "managementUrls": {
                "id": "INSTANCEID",
                "statusQueryGetUri": f"{instance}?{query}",
                "sendEventPostUri": f"{instance}/raiseEvent/{{eventName}}?{query}",
                "terminatePostUri": f"{instance}/terminate?reason={{text}}&{query}",
                "rewindPostUri": f"{instance}/rewind?reason={{text}}&{query}",
                "purgeHistoryDeleteUri": f"{instance}?{query}",
                "restartPostUri": f"{instance}/restart?{query}",
                "suspendPostUri": f"{instance}/suspend?reason={{text}}&{query}",
                "resumePostUri": f"{instance}/resume?reason={{text}}&{query}",
            },
            "rpcBaseUrl": f"{base_url}{WEBHOOK_PREFIX}/",
            "requiredQueryStringParameters": query,
        }
    )
