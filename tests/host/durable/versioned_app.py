"""A small Durable Functions app for the versioning tests: orchestrators that report `context.version`.

Its own DFApp, handed to the engine with `hubs.start(functions=FUNCTIONS)`, so tests/host/sample_app stays as it is.
"""

from __future__ import annotations

from typing import Any

import azure.durable_functions as df
import azure.functions as func

app = df.DFApp(http_auth_level=func.AuthLevel.ANONYMOUS)


@app.activity_trigger(input_name="step")
def record_step(step: str) -> str:
    return step


@app.orchestration_trigger(context_name="context")
def report_version(context: df.DurableOrchestrationContext):  # type: ignore[no-untyped-def]
    """Returns `context.version` (None, "" or the version)."""
    return {"version": context.version}
    yield  # a generator, as orchestrators are


@app.orchestration_trigger(context_name="context")
def versioned_waiter(context: df.DurableOrchestrationContext):  # type: ignore[no-untyped-def]
    """Branches on its version as the docs' "Replacing an activity in the sequence" example does, around a wait.

    Version "1" runs step "v1" before the wait; any other version runs "v2-a" and "v2-b". Replaying a "1" instance
    on a host whose defaultVersion is "2" therefore needs `context.version` to still be "1".
    """
    steps = []
    if context.version == "1":
        steps.append((yield context.call_activity("record_step", "v1")))
    else:
        steps.append((yield context.call_activity("record_step", "v2-a")))
        steps.append((yield context.call_activity("record_step", "v2-b")))
    yield context.wait_for_external_event("Go")
    steps.append((yield context.call_activity("record_step", "after-go")))
    return {"version": context.version, "steps": steps}


@app.orchestration_trigger(context_name="context")
def versioned_parent(context: df.DurableOrchestrationContext):  # type: ignore[no-untyped-def]
    """Waits for Go (unless told not to), then calls report_version as a sub-orchestration, with the version given in
    its input when there is one."""
    spec: dict[str, Any] = context.get_input() or {}
    if spec.get("wait"):
        yield context.wait_for_external_event("Go")
    if "child_version" in spec:
        child = yield context.call_sub_orchestrator("report_version", None, version=spec["child_version"])
    else:
        child = yield context.call_sub_orchestrator("report_version")
    return {"parent": context.version, "child": child["version"]}


@app.orchestration_trigger(context_name="context")
def versioned_parent_of_newer(context: df.DurableOrchestrationContext):  # type: ignore[no-untyped-def]
    """Calls report_version at version "9.0"; catches its failure and returns the message."""
    try:
        child = yield context.call_sub_orchestrator("report_version", None, version="9.0")
    except Exception as exc:  # noqa: BLE001  (what the SDK raises for a failed sub-orchestration)
        return {"failed": str(exc)}
    return {"child": child["version"]}


@app.orchestration_trigger(context_name="context")
def versioned_countdown(context: df.DurableOrchestrationContext):  # type: ignore[no-untyped-def]
    """Continues as new `n` times, collecting `context.version` of every generation."""
    spec = context.get_input()
    seen = [*spec["seen"], context.version]
    if spec["n"] > 0:
        context.continue_as_new({"n": spec["n"] - 1, "seen": seen})
        return None
    return seen
    yield


FUNCTIONS = app.get_functions()
