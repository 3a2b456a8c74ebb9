"""Orchestration versions on devhost, as the Durable extension (3.1+) and the Python SDK do them.

Sources (each test names the one it copies):
- SDK (azure-functions-durable 1.x in .venv): models/DurableOrchestrationClient.py `start_new(..., version=)` and
  `_get_start_new_url` (`?version=<quoted>` when version is not None); models/DurableOrchestrationContext.py
  `version` / `_extract_version_from_history` (ExecutionStarted's `Version`), `call_sub_orchestrator(version=)`
  (azure-functions-durable-python PRs #557, #582).
- Extension (Azure/azure-functions-durable-extension): PR #3072 (defaultVersion, context version), PR #3095
  (versionMatchStrategy / versionFailureStrategy), PR #3213 (version on the start URL and on sub-orchestrations),
  issue #3279 (defaultVersion is not `%Setting%`-expanded), test/Common/OrchestrationVersionTests.cs,
  test/e2e/Tests/Tests/VersioningTests.cs.
- DurableTask.Core (Azure/durabletask): src/DurableTask.Core/TaskOrchestrationDispatcher.cs (the version check,
  Reject = abandon, Fail = FailureDetails("VersionMismatch", ...), ContinueAsNew keeps the version),
  src/DurableTask.Core/Settings/VersioningSettings.cs (CompareVersions).
- learn.microsoft.com "Orchestration versioning in Durable Functions": defaults CurrentOrOlder and Reject.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
from azure.durable_functions.models.history import HistoryEventType as T

from devhost.config import ConfigError, HostConfig
from devhost.durable import VersioningPolicy, compare_versions, versioning_policy
from devhost.durable.versioning import MISMATCH_OUTPUT
from tests.host.durable import stepped_app
from tests.host.durable.harness import WAIT, Hub, HubFactory
from tests.host.durable.versioned_app import FUNCTIONS


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def versioned_hub(hubs: HubFactory, policy: VersioningPolicy | None = None) -> Hub:
    return await hubs.start(functions=FUNCTIONS, versioning=policy)


def started_event(hub: Hub, instance_id: str) -> dict:
    return next(e for e in hub.engine.store.history(instance_id) if e["EventType"] == T.EXECUTION_STARTED)


def policy_from_host_json(tmp_path: Path, durable_task: dict) -> VersioningPolicy:
    app_dir = tmp_path / "app"
    app_dir.mkdir(exist_ok=True)
    (app_dir / "host.json").write_text(json.dumps({"version": "2.0", "extensions": {"durableTask": durable_task}}))
    return versioning_policy(HostConfig.load(app_dir).durable_options())  # what DevHost.start hands the engine


async def waiting_for_go(hub: Hub, instance_id: str) -> None:
    """Until the instance has recorded its wait for Go (its first episode after the activities is committed)."""
    await hub.engine.wait_for_status(instance_id, {"Running"}, WAIT)
    await hub.engine.wait_for_history(
        instance_id, lambda h: sum(e["EventType"] == T.ORCHESTRATOR_COMPLETED for e in h) >= 2, WAIT
    )


# ---- 1. a start with a version --------------------------------------------------------------------------------
async def test_start_new_with_version_is_context_version(hubs: HubFactory) -> None:
    # SDK DurableOrchestrationClient.start_new(version=) sends `?version=` (_get_start_new_url); the extension uses it
    # instead of defaultVersion (PR #3213); the orchestrator's context.version is ExecutionStarted.Version
    # (DurableOrchestrationContext._extract_version_from_history).
    hub = await versioned_hub(hubs, VersioningPolicy(default_version="2.0"))
    instance_id = await hub.client.start_new("report_version", new_id("v"), None, version="1.0")
    status = await hub.wait(instance_id)
    assert status["runtimeStatus"] == "Completed", status
    assert status["output"] == {"version": "1.0"}
    assert started_event(hub, instance_id)["Version"] == "1.0"


async def test_start_new_with_an_empty_version_keeps_it(hubs: HubFactory) -> None:
    # e2e VersioningTests.TestVersionedOrchestration_OKWithMatchingVersion: an explicit "" is the instance's version
    # ("Version: ''"), not the defaultVersion; the SDK sends `?version=` for "" (it checks `is not None`).
    hub = await versioned_hub(hubs, VersioningPolicy(default_version="2.0"))
    instance_id = await hub.client.start_new("report_version", new_id("v"), None, version="")
    assert (await hub.wait(instance_id))["output"] == {"version": ""}


async def test_http_api_start_reads_the_version_query_parameter(hubs: HubFactory) -> None:
    # HttpApiHandler's start route takes `version` from the query string (PR #3213); without it, defaultVersion.
    hub = await versioned_hub(hubs, VersioningPolicy(default_version="2.0"))
    outputs = []
    for query in ("?version=1.5%2Bbuild%201", ""):
        async with hub.http.post(f"{hub.base}/orchestrators/report_version{query}") as response:
            assert response.status == 202
            payload = await response.json()
        outputs.append((await hub.wait(payload["id"]))["output"])
    assert outputs == [{"version": "1.5+build 1"}, {"version": "2.0"}]


# ---- 2. defaultVersion from host.json -------------------------------------------------------------------------
async def test_default_version_from_host_json_applies_to_a_start_without_version(
    hubs: HubFactory, tmp_path: Path
) -> None:
    # PR #3072 / e2e VersioningTests (host.json defaultVersion "2.0" -> "Version: '2.0'" for a start without one).
    policy = policy_from_host_json(tmp_path, {"defaultVersion": "2.0"})
    assert policy == VersioningPolicy(default_version="2.0", match_strategy="CurrentOrOlder", failure_strategy="Reject")
    hub = await versioned_hub(hubs, policy)
    instance_id = await hub.client.start_new("report_version", new_id("v"))
    assert (await hub.wait(instance_id))["output"] == {"version": "2.0"}


async def test_without_default_version_context_version_is_none(hubs: HubFactory, tmp_path: Path) -> None:
    # OrchestrationVersionTests.OrchestrationVersionIsDeterminedByHostAppVersion: DefaultVersion null -> the context
    # version is null (the out-of-proc history JSON carries "Version": null, so the SDK returns None); the docs:
    # `"defaultVersion": null` is the same as not setting it. DefaultVersion "" gives "" (InlineData("", "''")).
    for durable_task in ({}, {"defaultVersion": None}):
        assert policy_from_host_json(tmp_path, durable_task).default_version is None
    hub = await versioned_hub(hubs, policy_from_host_json(tmp_path, {}))
    instance_id = await hub.client.start_new("report_version", new_id("v"))
    assert (await hub.wait(instance_id))["output"] == {"version": None}
    assert started_event(hub, instance_id)["Version"] is None

    empty = await versioned_hub(hubs, policy_from_host_json(tmp_path, {"defaultVersion": ""}))
    instance_id = await empty.client.start_new("report_version", new_id("v"))
    assert (await empty.wait(instance_id))["output"] == {"version": ""}


async def test_default_version_is_taken_literally_without_setting_expansion(
    hubs: HubFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Azure/azure-functions-durable-extension #3279: defaultVersion "%VERSION%" with VERSION set reaches the
    # orchestrator as "%VERSION%" (hubName, by contrast, is resolved).
    monkeypatch.setenv("APP_VERSION", "7.0")
    monkeypatch.setenv("VERSIONING_HUB", "resolvedhub")
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    host_json = {"extensions": {"durableTask": {"hubName": "%VERSIONING_HUB%", "defaultVersion": "%APP_VERSION%"}}}
    (app_dir / "host.json").write_text(json.dumps(host_json))
    options = HostConfig.load(app_dir).durable_options()
    assert options.hub_name == "resolvedhub"
    assert options.default_version == "%APP_VERSION%"
    hub = await versioned_hub(hubs, versioning_policy(options))
    instance_id = await hub.client.start_new("report_version", new_id("v"))
    assert (await hub.wait(instance_id))["output"] == {"version": "%APP_VERSION%"}


def test_host_json_versioning_keys_are_read_as_the_configuration_binder_reads_them(tmp_path: Path) -> None:
    # .NET configuration: keys case-insensitive; enums by Enum.Parse ignoring case (or by number); a value it cannot
    # bind stops the host. Defaults CurrentOrOlder / Reject (docs, "Advanced usage").
    assert policy_from_host_json(tmp_path, {}) == VersioningPolicy(None, "CurrentOrOlder", "Reject")
    policy = policy_from_host_json(
        tmp_path, {"DefaultVersion": "3", "VERSIONMATCHSTRATEGY": " strict ", "versionFailureStrategy": "fail"}
    )
    assert policy == VersioningPolicy("3", "Strict", "Fail")
    assert policy_from_host_json(tmp_path, {"versionMatchStrategy": "0"}).match_strategy == "None"
    for bad in ({"versionMatchStrategy": "Newest"}, {"versionFailureStrategy": ""}, {"defaultVersion": 2.0}):
        with pytest.raises(ConfigError):
            policy_from_host_json(tmp_path, bad)


# ---- 3. version matching --------------------------------------------------------------------------------------
def test_compare_versions_follows_durabletask_core() -> None:
    # VersioningSettings.CompareVersions: empty/white-space equal and older; System.Version when both parse (2-4
    # components, absent parts -1); otherwise ordinal ignore-case text.
    assert compare_versions(None, "") == 0 and compare_versions(" ", None) == 0
    assert compare_versions(None, "1") == -1 and compare_versions("1", "") == 1
    assert compare_versions("1.0", "1.0.0") == -1
    assert compare_versions("1.9", "1.10") == -1
    assert compare_versions(" 2.0", "2.0") == 0
    assert compare_versions("1", "2") == -1
    assert compare_versions("9", "10") == 1  # single numbers are not System.Version: compared as text
    assert compare_versions("v1.0-Release", "V1.0-RELEASE") == 0
    assert compare_versions("2025-01-02", "2025-01-10") == -1


async def test_an_older_instance_completes_after_a_restart_with_a_newer_default_version(
    hubs: HubFactory, tmp_path: Path
) -> None:
    # The upgrade in flight. CurrentOrOlder (the default) accepts an instance whose version is <= the worker's
    # (TaskOrchestrationDispatcher: CompareVersions(runtimeState.Version, settings.Version) > 0 fails); the
    # instance keeps its version (OrchestrationVersionTests.ExistingOrchestrationVersionIsImmutable: started on 1.0,
    # resumed on 2.0, context version still 1.0), so its version-1 branch replays deterministically.
    first = await versioned_hub(hubs, VersioningPolicy(default_version="1"))
    old_id = await first.client.start_new("versioned_waiter", new_id("old"))
    await waiting_for_go(first, old_id)
    await hubs.stop(first)

    # devhost restarted on the same state with host.json defaultVersion "2" and the default strategies
    second = await versioned_hub(hubs, policy_from_host_json(tmp_path, {"defaultVersion": "2"}))
    fresh_id = await second.client.start_new("versioned_waiter", new_id("new"))
    await waiting_for_go(second, fresh_id)
    for instance_id in (old_id, fresh_id):
        await second.client.raise_event(instance_id, "Go", "go")
    old, new = await second.wait(old_id), await second.wait(fresh_id)
    assert old["runtimeStatus"] == "Completed", old
    assert old["output"] == {"version": "1", "steps": ["v1", "after-go"]}
    assert new["output"] == {"version": "2", "steps": ["v2-a", "v2-b", "after-go"]}


async def test_a_newer_instance_is_rejected_until_a_host_with_that_version_starts(hubs: HubFactory) -> None:
    # Reject (the default): DurableTask.Core abandons the work item, "the orchestration instance remains in its
    # current state and can be retried later when a compatible worker becomes available" (docs).
    first = await versioned_hub(hubs, VersioningPolicy(default_version="2.0"))
    instance_id = await first.client.start_new("report_version", new_id("newer"), None, version="3.0")
    assert await first.engine._step(instance_id) is False  # not run: nothing committed
    status = await first.client.get_status(instance_id)
    assert status.runtime_status.value == "Pending"
    assert first.engine.store.history(instance_id) == []
    assert first.engine.store.inbox(instance_id, first.engine.store.instance(instance_id).execution_id)
    await hubs.stop(first)

    second = await versioned_hub(hubs, VersioningPolicy(default_version="3.0"))
    assert (await second.wait(instance_id))["output"] == {"version": "3.0"}


async def test_strict_rejects_an_older_instance_and_none_accepts_it(hubs: HubFactory) -> None:
    # Strict: `settings.Version != runtimeState.Version` fails; None: no check (TaskOrchestrationDispatcher).
    first = await versioned_hub(hubs, VersioningPolicy(default_version="1"))
    instance_id = await first.client.start_new("versioned_waiter", new_id("strict"))
    await waiting_for_go(first, instance_id)
    before = first.engine.store.history(instance_id)
    await hubs.stop(first)

    strict = await versioned_hub(hubs, VersioningPolicy("2", "Strict", "Reject"))
    await strict.client.raise_event(instance_id, "Go", "go")
    assert await strict.engine._step(instance_id) is False
    assert strict.engine.store.history(instance_id) == before  # the event was not processed...
    row = strict.engine.store.instance(instance_id)
    assert row is not None and row.status == "Running"
    inbox = strict.engine.store.inbox(instance_id, row.execution_id)
    assert [e["EventType"] for _, e in inbox] == [T.EVENT_RAISED]  # ...and waits in the inbox
    await hubs.stop(strict)

    anything = await versioned_hub(hubs, VersioningPolicy("0", "None", "Reject"))  # "1" is newer: no matter
    status = await anything.wait(instance_id)
    assert status["output"] == {"version": "1", "steps": ["v1", "after-go"]}


async def test_without_a_default_version_an_explicit_version_counts_as_newer(hubs: HubFactory) -> None:
    # CompareVersions("1.0", null) = 1 ("an empty or null version is considered older than any defined version"),
    # so under the default CurrentOrOlder a host with no defaultVersion rejects an instance started with one.
    hub = await versioned_hub(hubs)
    instance_id = await hub.client.start_new("report_version", new_id("nodefault"), None, version="1.0")
    assert await hub.engine._step(instance_id) is False
    assert (await hub.client.get_status(instance_id)).runtime_status.value == "Pending"
    assert hub.engine.store.history(instance_id) == []


async def test_fail_strategy_fails_the_instance_with_version_mismatch(hubs: HubFactory) -> None:
    # Fail: OrchestrationCompleteOrchestratorAction Failed with FailureDetails("VersionMismatch", "Orchestration
    # version did not comply with Worker Versioning"); Azure Storage stores FailureDetails.ToString() as the output
    # (AzureTableTrackingStore.UpdateStateAsync) and the HTTP API shows it as a string (DurableClient.ParseToJToken).
    # e2e VersioningTests.TestVersionedOrchestration_FailsWithNonMatchingVersion: version 3.0 on a 2.0 host -> Failed.
    hub = await versioned_hub(hubs, VersioningPolicy("2.0", "CurrentOrOlder", "Fail"))
    instance_id = await hub.client.start_new("report_version", new_id("fail"), None, version="3.0")
    status = await hub.wait(instance_id)
    assert status["runtimeStatus"] == "Failed"
    assert status["output"] == MISMATCH_OUTPUT
    assert MISMATCH_OUTPUT == "VersionMismatch: Orchestration version did not comply with Worker Versioning"
    kinds = [e["EventType"] for e in hub.engine.store.history(instance_id)]
    assert T.TASK_SCHEDULED not in kinds and kinds[-1] == T.EXECUTION_COMPLETED  # the orchestrator never ran


async def test_fail_strategy_on_a_sub_orchestration_fails_the_call_in_the_parent(hubs: HubFactory) -> None:
    # The parent gets SubOrchestrationInstanceFailed with the failure action's Result and Details, both null
    # (TaskOrchestrationDispatcher.ProcessWorkflowCompletedTaskDecision); the SDK raises
    # Exception(f"{event.Reason} \n {event.Details}") (TaskOrchestrationExecutor).
    hub = await versioned_hub(hubs, VersioningPolicy("2.0", "CurrentOrOlder", "Fail"))
    instance_id = await hub.client.start_new("versioned_parent_of_newer", new_id("parent"))
    status = await hub.wait(instance_id)
    assert status["output"] == {"failed": "None \n None"}
    child = next(r for r in hub.engine.store.instances() if r.parent_instance_id == instance_id)
    assert child.status == "Failed" and json.loads(child.output or "null") == MISMATCH_OUTPUT


# ---- 4. sub-orchestrations and continue-as-new ----------------------------------------------------------------
async def test_a_sub_orchestration_inherits_its_parents_version_even_after_an_upgrade(hubs: HubFactory) -> None:
    # OrchestrationVersionTests.ExistingOrchestrationVersionIsImmutable: a 1.0 instance resumed on a 2.0 host starts
    # its sub-orchestration at 1.0 ("this version is propagated to the sub-orchestration").
    first = await versioned_hub(hubs, VersioningPolicy(default_version="1.0"))
    instance_id = await first.client.start_new("versioned_parent", new_id("parent"), {"wait": True})
    await first.engine.wait_for_history(
        instance_id, lambda h: any(e["EventType"] == T.ORCHESTRATOR_COMPLETED for e in h), WAIT
    )
    await hubs.stop(first)
    second = await versioned_hub(hubs, VersioningPolicy(default_version="2.0"))
    await second.client.raise_event(instance_id, "Go", None)
    assert (await second.wait(instance_id))["output"] == {"parent": "1.0", "child": "1.0"}
    created = next(
        e for e in second.engine.store.history(instance_id) if e["EventType"] == T.SUB_ORCHESTRATION_INSTANCE_CREATED
    )
    assert created["Version"] == "1.0"


async def test_a_sub_orchestration_gets_the_version_it_is_called_with(hubs: HubFactory) -> None:
    # call_sub_orchestrator(version=) (azure-functions-durable-python #582 -> extension #3213); e2e
    # VersioningTests.TestVersionedSubOrchestration_OKWithMatchingVersion: "1.0" -> Sub Version '1.0', "" -> ''.
    hub = await versioned_hub(hubs, VersioningPolicy(default_version="2.0"))
    outputs = []
    for child_version in ("1.0", ""):
        instance_id = await hub.client.start_new("versioned_parent", new_id("p"), {"child_version": child_version})
        outputs.append((await hub.wait(instance_id))["output"])
    assert outputs == [{"parent": "2.0", "child": "1.0"}, {"parent": "2.0", "child": ""}]


async def test_continue_as_new_keeps_the_instance_version(hubs: HubFactory) -> None:
    # The SDK's ContinueAsNewAction carries no version, and DurableTask.Core starts the next generation with
    # `Version = completeOrchestratorAction.NewVersion ?? runtimeState.Version` (TaskOrchestrationDispatcher).
    hub = await versioned_hub(hubs, VersioningPolicy(default_version="2.0"))
    instance_id = await hub.client.start_new("versioned_countdown", new_id("can"), {"n": 2, "seen": []}, "1.2")
    assert (await hub.wait(instance_id))["output"] == ["1.2", "1.2", "1.2"]


# ---- what the status API shows ---------------------------------------------------------------------------------
async def test_status_and_history_do_not_report_the_version(hubs: HubFactory) -> None:
    # The HTTP API's status payload has no version field, and its history removes `Version` from ExecutionStarted
    # and SubOrchestrationInstanceCreated (DurableClient.GetStatusAsync history conversion, historyItem.Remove).
    hub = await versioned_hub(hubs, VersioningPolicy(default_version="2.0"))
    instance_id = await hub.client.start_new("versioned_parent", new_id("st"), {})
    await hub.wait(instance_id)
    async with hub.http.get(f"{hub.base}/instances/{instance_id}?showHistory=true") as response:
        status = await response.json()
    assert not any("version" in key.lower() for key in status)
    assert all("Version" not in entry for entry in status["historyEvents"])


# ---- 6. adding a step (README, "Versioning") ------------------------------------------------------------------
async def waiting_for(hub: Hub, instance_id: str, step: str) -> None:
    """Until the instance waits for `step`'s reply (its custom status names the step)."""
    for _ in range(int(WAIT * 20)):
        if (await hub.client.get_status(instance_id)).custom_status == step:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{instance_id} never waited for {step}")


async def reply_to_each_step(hub: Hub, instance_id: str, steps: list[str]) -> None:
    for step in steps:
        await waiting_for(hub, instance_id, step)
        await hub.client.raise_event(instance_id, f"Reply:{step}", "ok")


async def test_an_in_flight_three_step_instance_finishes_its_steps_after_a_fourth_is_added(
    hubs: HubFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The live Scheduler walks the record's own steps (orderflow/advance.py), so a deployment that adds a step does
    # not reach an order already in flight: its replay schedules what it scheduled, and it ends after its three.
    monkeypatch.setenv(stepped_app.RECORDS_SETTING, str(tmp_path))
    three = stepped_app.STEPS
    assert len(three) == 3
    first = await hubs.start(functions=stepped_app.FUNCTIONS)
    old_id = await first.client.start_new("stepped_workflow", new_id("old"), {"orderId": "old"})
    await reply_to_each_step(first, old_id, [three[0]])
    await waiting_for(first, old_id, three[1])  # in flight: the first step done, waiting for the second
    await hubs.stop(first)

    monkeypatch.setattr(stepped_app, "STEPS", (*three, "gift-wrap"))  # the deployment adds a fourth step
    second = await hubs.start(functions=stepped_app.FUNCTIONS)
    new_id_ = await second.client.start_new("stepped_workflow", new_id("new"), {"orderId": "new"})
    await reply_to_each_step(second, old_id, list(three[1:]))
    await reply_to_each_step(second, new_id_, [*three, "gift-wrap"])
    old, new = await second.wait(old_id), await second.wait(new_id_)
    assert old["runtimeStatus"] == "Completed", old
    assert old["output"] == {"steps": list(three), "sent": list(three)}
    assert new["output"] == {"steps": [*three, "gift-wrap"], "sent": [*three, "gift-wrap"]}
