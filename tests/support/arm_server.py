"""A local stand-in for Azure Resource Manager's Service Bus `Queues - Get`, on 127.0.0.1 (aiohttp).

It answers as the REST reference documents (https://learn.microsoft.com/rest/api/servicebus/controlplane-stable/
queues/get, api-version 2024-01-01): 200 with an SBQueue whose `properties.countDetails` is a MessageCountDetails
(activeMessageCount, deadLetterMessageCount, scheduledMessageCount, transferMessageCount,
transferDeadLetterMessageCount; the schema: Azure/azure-rest-api-specs specification/servicebus/resource-manager/
Microsoft.ServiceBus/stable/2024-01-01/Queue.json), else an ErrorResponse `{"error": {"code", "message"}}`: 403
AuthorizationFailed for a queue in `refused` (no Reader there), the status `failing` names, no answer
(until the server stops) for a queue in `stalled`, 404 for a queue it does not hold, 401 without the expected bearer
token, 400 without api-version 2024-01-01. Every request is logged.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

SUBSCRIPTION, GROUP, NAMESPACE = "00000000-0000-0000-0000-000000000001", "rg-orderflow", "sb-orderflow"
NAMESPACE_ID = (
    f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/Microsoft.ServiceBus/namespaces/{NAMESPACE}"
)
TOKEN = "arm-token-for-tests"


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    api_version: str | None
    authorization: str | None


@dataclass
class FakeArm:
    dead_letters: dict[str, int]  # queue → deadLetterMessageCount; the queues the namespace holds
    refused: set[str] = field(default_factory=set)
    failing: dict[str, int] = field(default_factory=dict)  # queue → a 5xx (or 429) it always answers
    stalled: set[str] = field(default_factory=set)  # queues it never answers (until the server stops)
    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    released: asyncio.Event = field(default_factory=asyncio.Event)  # set when the server stops

    def queues_read(self) -> list[str]:
        return [s.path.rsplit("/", 1)[-1] for s in self.seen]

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(
            Seen(request.method, request.path, request.query.get("api-version"), request.headers.get("Authorization"))
        )
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return _error(401, "InvalidAuthenticationToken", "The access token is invalid.")
        if request.query.get("api-version") != "2024-01-01":
            return _error(400, "InvalidApiVersionParameter", "The api-version is invalid.")
        queue = request.match_info["queue"]
        if queue in self.stalled:
            await self.released.wait()
            return _error(503, "ServiceUnavailable", "Stopping.")
        if queue in self.failing:
            return _error(self.failing[queue], "ServiceUnavailable", "The server is busy.")
        if queue in self.refused:
            return _error(
                403,
                "AuthorizationFailed",
                "The client does not have authorization to perform action "
                "'Microsoft.ServiceBus/namespaces/queues/read'.",
            )
        if queue not in self.dead_letters:
            return _error(404, "NotFound", f"The messaging entity '{queue}' could not be found.")
        return web.json_response(sb_queue(queue, self.dead_letters[queue]))


def sb_queue(queue: str, dead_lettered: int) -> dict[str, Any]:
    """An SBQueue as Queues - Get answers it (the fields the reference lists; readOnly counts included)."""
    return {
        "id": f"{NAMESPACE_ID}/queues/{queue}",
        "name": queue,
        "type": "Microsoft.ServiceBus/Namespaces/Queues",
        "properties": {
            "countDetails": {
                "activeMessageCount": 7,
                "deadLetterMessageCount": dead_lettered,
                "scheduledMessageCount": 0,
                "transferMessageCount": 0,
                "transferDeadLetterMessageCount": 0,
            },
            "messageCount": 7 + dead_lettered,
            "sizeInBytes": 0,
            "status": "Active",
            "maxDeliveryCount": 10,
            "lockDuration": "PT1M",
            "createdAt": "2024-01-01T00:00:00Z",
            "updatedAt": "2024-01-01T00:00:00Z",
            "accessedAt": "2024-01-01T00:00:00Z",
        },
    }


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


class FakeCredential:
    """An azure-identity async credential's surface: one fixed token, for the scope the client asks."""

    def __init__(self) -> None:
        self.scopes: list[tuple[str, ...]] = []

    async def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        self.scopes.append(scopes)
        return AccessToken(TOKEN, 2**31)


@asynccontextmanager
async def run_fake_arm(
    dead_letters: dict[str, int],
    refused: set[str] | None = None,
    failing: dict[str, int] | None = None,
    stalled: set[str] | None = None,
) -> AsyncIterator[FakeArm]:
    arm = FakeArm(dict(dead_letters), set(refused or ()), dict(failing or {}), set(stalled or ()))
    app = web.Application()
    app.router.add_get(f"{NAMESPACE_ID}/queues/{{queue}}", arm.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    arm.url = f"http://127.0.0.1:{port}"
    try:
        yield arm
    finally:
        arm.released.set()
        await runner.cleanup()
