"""The operator CLI against Azure's boundaries (issue 25). Its Durable HTTP API reads behind App Service authentication:
the deploy guards the whole function app with Entra ID (infra/app/function.bicep, no excluded path), so `orderflow
order` sends the operator's token when DurableTaskApiScope is set, and says what to set when the API answers 401
without one. And its wait on a reply-queue session keeps the session's lock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from aiohttp import web

from orderflow.cli._follow import _SessionKeeper
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


class _Session:
    """A held session as the SDK shows it: `locked_until_utc`, and `renew_lock()` that extends it by the span."""

    def __init__(self, span: float) -> None:
        self.span = span
        self.renewals = 0
        self.locked_until_utc = datetime.now(UTC) + timedelta(seconds=span)

    def renew_lock(self) -> None:
        self.renewals += 1
        self.locked_until_utc = datetime.now(UTC) + timedelta(seconds=self.span)


def test_the_cli_renews_the_reply_sessions_lock_once_half_of_it_has_passed() -> None:
    """`orderflow submit --wait 90` holds the order's session on the reply queue longer than its LockDuration (1 min
    on app-status; 5 s in the AMQP end-to-end test): unrenewed, the lock expires and the wait ends in
    SessionLockLostError. The keeper renews it once less than half the span is left, and not before."""
    session = _Session(span=60)
    keeper = _SessionKeeper(session)
    keeper.renew_when_due()
    assert session.renewals == 0
    session.locked_until_utc = datetime.now(UTC) + timedelta(seconds=20)  # 40 of its 60 s have passed
    keeper.renew_when_due()
    assert session.renewals == 1 and (session.locked_until_utc - datetime.now(UTC)).total_seconds() > 50
