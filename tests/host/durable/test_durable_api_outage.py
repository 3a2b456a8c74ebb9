"""devhost's fault switch on the Durable HTTP API (devhost/durable/http_api.py `OutageSwitch`, the
`durable-api-outage` drill's): off by default; with DEVHOST_DURABLE_API_OUTAGE_FILE set, the start and status routes
answer 503 while the file exists, do nothing, and write one ledger line per refusal; the other routes are untouched.

What the real client makes of a 503 (azure-functions-durable 1.x, azure/durable_functions/models/
DurableOrchestrationClient.py): `get_status` raises Exception("... unexpected status code 503") (its status switch
takes 200/202/400/404/500 only) and `start_new` raises Exception(<body>) (its catch-all after 400).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from devhost.durable.http_api import OUTAGE_SETTING, ledger_of
from tests.host.durable.harness import HubFactory


async def test_with_the_switch_on_start_and_status_answer_503_and_nothing_is_started(
    hubs: HubFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    down = tmp_path / "durable-api.down"
    monkeypatch.setenv(OUTAGE_SETTING, str(down))
    hub = await hubs.start()
    running = await hub.client.start_new("approval", f"up-{uuid.uuid4().hex[:6]}", {"timeout": 30})
    await hub.wait(running, "Running")

    down.touch()
    async with hub.http.get(f"{hub.base}/instances/{running}") as response:
        assert response.status == 503 and response.headers["Retry-After"] == "1"
        assert "unavailable" in (await response.json())["Message"]
    with pytest.raises(Exception, match="unexpected status code 503"):
        await hub.client.get_status(running)
    refused = f"down-{uuid.uuid4().hex[:6]}"
    with pytest.raises(Exception, match="unavailable"):
        await hub.client.start_new("approval", refused, {"timeout": 30})
    assert hub.engine.store.instance(refused) is None  # refused before anything was done
    async with hub.http.post(f"{hub.base}/instances/{running}/raiseEvent/approved", json=True) as response:
        assert response.status == 202  # the other routes are not switched

    down.unlink()
    assert (await hub.client.get_status(running)).runtime_status is not None
    lines = [json.loads(line) for line in ledger_of(down).read_text().splitlines()]
    assert [(line["route"], line["instanceId"]) for line in lines] == [
        ("status", running),
        ("status", running),
        ("start", refused),
    ]


async def test_without_the_setting_there_is_no_switch(
    hubs: HubFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(OUTAGE_SETTING, raising=False)
    (tmp_path / "durable-api.down").touch()  # a file of that name means nothing without the setting
    hub = await hubs.start()
    instance = await hub.client.start_new("approval", None, {"timeout": 30})
    assert (await hub.client.get_status(instance)).runtime_status is not None
