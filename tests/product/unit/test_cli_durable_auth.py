"""The operator CLI's Durable HTTP API reads behind App Service authentication (issue 25): the deploy guards the
whole function app with Entra ID (infra/app/function.bicep, no excluded path), so `orderflow order` sends the
operator's token when DurableTaskApiScope is set, and says what to set when the API answers 401 without one."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from orderflow.cli.common import CliError, DurableHttpStatuses


@pytest.fixture
async def guarded() -> AsyncIterator[str]:
    """A Durable API that answers only a request with the bearer token `t` (as Easy Auth's Return401 would)."""

    async def instance(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer t":
            return web.Response(status=401)
        return web.json_response({"instanceId": request.match_info["id"], "runtimeStatus": "Running"})

    app = web.Application()
    app.router.add_get("/runtime/webhooks/durabletask/instances/{id}", instance)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}/runtime/webhooks/durabletask"
    await runner.cleanup()


async def test_without_a_scope_a_401_names_the_setting_to_set(guarded: str) -> None:
    with pytest.raises(CliError, match="DurableTaskApiScope"):
        await DurableHttpStatuses(guarded, key="k").status("partner.X1:1")


async def test_with_a_scope_the_operators_token_is_sent(guarded: str) -> None:
    statuses = DurableHttpStatuses(guarded, key="k", scope="api://client/user_impersonation")
    statuses._token = "t"  # what DefaultAzureCredential.get_token(scope) returned (no Entra ID here)
    found = await statuses.status("partner.X1:1")
    assert found is not None and found["instanceId"] == "partner.X1:1"
