"""Each queue's dead-letter depth from Azure Resource Manager (the control plane), read with a right that reveals no
message and no key.

`GET https://management.azure.com{namespace resource id}/queues/{queue}?api-version=2024-01-01` answers the queue
(SBQueue) with its runtime counts in `properties.countDetails`; an error is an ErrorResponse `{"error": {"code",
"message"}}`. The call needs Microsoft.ServiceBus/namespaces/queues/read, which the built-in role Reader grants.
The token is the app identity's, for `https://management.azure.com/.default`. Every request is bounded
(`TIMEOUT_SECONDS`); a 429, a 5xx or a connection failure is tried `ATTEMPTS` times at most; a queue that cannot be
read gets an `{"error"}` entry and never hides the others. Sources and the role's limits: docs/modules-product.md."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp

from orderflow import settings
from orderflow.text import first_line

ARM_ENDPOINT = "https://management.azure.com"
ARM_SCOPE = "https://management.azure.com/.default"
API_VERSION = "2024-01-01"
TIMEOUT_SECONDS = 10.0
ATTEMPTS = 2
RESOURCE_ID_SETTING = "ServiceBusNamespaceResourceId"


class TokenSource(Protocol):
    """An azure-identity async credential (`get_token(*scopes)` returning an AccessToken)."""

    async def get_token(self, *scopes: str, **kwargs: Any) -> Any: ...


class Unreadable(Exception):
    """One queue's counts could not be read; the message says why, in one line."""


@dataclass
class ArmQueueCounts:
    """Reads queue runtime counts of one Service Bus namespace (`namespace_id`, its ARM resource id)."""

    namespace_id: str
    credential: TokenSource
    endpoint: str = ARM_ENDPOINT

    def url(self, queue: str) -> str:
        return f"{self.endpoint.rstrip('/')}{self.namespace_id.rstrip('/')}/queues/{quote(queue, safe='')}"

    async def dead_letter_depths(self, queues: Sequence[str]) -> dict[str, dict[str, Any]]:
        """queue → `{"count", "capped": false}` (the exact count) or `{"error"}`, one request per queue."""
        try:
            token = (await self.credential.get_token(ARM_SCOPE)).token
        except Exception as exc:  # noqa: BLE001 - every queue says why, none is counted
            reason = f"not read: no token for Azure Resource Manager ({type(exc).__name__}: {first_line(exc)})"
            return {q: {"error": reason} for q in queues}
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS), headers=headers
        ) as session:
            found = await asyncio.gather(*(self._one(session, q) for q in queues))
        return dict(zip(queues, found, strict=True))

    async def _one(self, session: aiohttp.ClientSession, queue: str) -> dict[str, Any]:
        try:
            return {"count": dead_letter_count(await self._get(session, queue), queue), "capped": False}
        except Unreadable as exc:
            return {"error": str(exc)}

    async def _get(self, session: aiohttp.ClientSession, queue: str) -> Any:
        failure = ""
        for _ in range(ATTEMPTS):
            try:
                async with session.get(self.url(queue), params={"api-version": API_VERSION}) as response:
                    status, body = response.status, await _json(response)
            except (TimeoutError, aiohttp.ClientError) as exc:
                failure = f"no answer from Azure Resource Manager within {TIMEOUT_SECONDS:g} s ({type(exc).__name__})"
                continue
            if status == 200:
                return body
            failure = _refusal(status, body, queue)
            if status != 429 and status < 500:
                break
        raise Unreadable(failure)


def dead_letter_count(body: Any, queue: str) -> int:
    """`properties.countDetails.deadLetterMessageCount` of an SBQueue, or Unreadable."""
    details = body.get("properties", {}).get("countDetails", {}) if isinstance(body, dict) else {}
    count = details.get("deadLetterMessageCount") if isinstance(details, dict) else None
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise Unreadable(
            f"not read: Azure Resource Manager answered queue {queue} without "
            "properties.countDetails.deadLetterMessageCount"
        )
    return count


def _refusal(status: int, body: Any, queue: str) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    said = f"{status}{' ' + str(code) if code else ''}"
    if status == 403:
        return (
            f"not read: Azure Resource Manager refused ({said}): this identity needs Reader on queue {queue} "
            "(Microsoft.ServiceBus/namespaces/queues/read; infra/app/rbac.bicep)"
        )
    if status == 404:
        return f"not read: no queue {queue} in the namespace {RESOURCE_ID_SETTING} names ({said})"
    if status == 401:
        return f"not read: Azure Resource Manager did not accept the token ({said})"
    return f"not read: Azure Resource Manager answered {said}"


async def _json(response: aiohttp.ClientResponse) -> Any:
    try:
        return await response.json(content_type=None)
    except ValueError:
        return None


def from_settings(env: Mapping[str, str]) -> ArmQueueCounts | None:
    """The counts of the namespace `ServiceBusNamespaceResourceId` names, with the app identity (`AZURE_CLIENT_ID`);
    None when the setting is not set (locally: the depths are read from the broker)."""
    namespace_id = settings.get(RESOURCE_ID_SETTING, env)
    if namespace_id is None:
        return None
    from azure.identity.aio import DefaultAzureCredential  # Azure only

    credential = DefaultAzureCredential(managed_identity_client_id=settings.get("AZURE_CLIENT_ID", env))
    return ArmQueueCounts(namespace_id, credential)
