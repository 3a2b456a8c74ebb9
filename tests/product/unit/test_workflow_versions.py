"""An instance started under workflow version 1 or 2 resumes under the current code without a non-determinism
failure.

tests/product/fixtures/histories/v1.json holds the replay transcripts of the Scheduler as it was before versioning
(commit 230c614, tests/product/fixtures/histories/record.py): for each scenario, the history the extension would have
stored and, per episode, the actions the orchestrator answered. Each episode is replayed here through today's
`order_workflow`, which must branch to its version-1 path (ExecutionStarted.Version "", no workflowVersion in the input)
and answer exactly the same actions, done flag and output. That is what the Durable extension requires of an in-flight
instance after a deployment: a replay whose actions differ from the recorded TaskScheduled/TimerCreated events fails the
orchestration with a non-determinism error (seed 004, orchestrator code constraints; DurableTask.Core
TaskOrchestrationExecutor).

tests/product/fixtures/histories/v2.json does the same for version 2 (recorded at commit 17a0ced, the last to start
version-2 instances: ExecutionStarted.Version and the input's workflowVersion "2.0"), with its compensation and cancel
scenarios: version 3 replaced its five activities by ADVANCE_ORDER, and a version-2 instance must still finish on
the version-2 path.

tests/product/fixtures/histories/v3.json does the same for version 3 (recorded at commit 59fe65e, the last to start
version-3 instances; ReplaySchema V3 as the extension offers it): version 4 changed the race after an ignored reply
(orchestrators/scheduling.py `race`), and a version-3 instance must still finish on the version-3 path.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from azure.durable_functions.models.history.HistoryEventType import HistoryEventType as H
from support.product_app import user_function

from orderflow import function_names as fn

HISTORIES = Path(__file__).resolve().parents[1] / "fixtures" / "histories"
FIXTURE = json.loads((HISTORIES / "v1.json").read_text())
FIXTURE_V2 = json.loads((HISTORIES / "v2.json").read_text())
FIXTURE_V3 = json.loads((HISTORIES / "v3.json").read_text())
# Events the extension appends after an episode ran (its new actions, then the end of the episode).
AFTER_THE_EPISODE = {int(H.TASK_SCHEDULED), int(H.TIMER_CREATED), int(H.ORCHESTRATOR_COMPLETED)}


@pytest.fixture(scope="module")
def handle() -> Any:
    return user_function(fn.ORDER_WORKFLOW)


def episodes(scenario: dict[str, Any]) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """Each episode's input history (played flags as the extension sets them) and what it recorded."""
    history, out, previous = scenario["history"], [], 0
    for episode in scenario["episodes"]:
        segment = history[previous : episode["historyLength"]]
        ran = next(i for i, e in enumerate(segment) if i > 0 and e["EventType"] in AFTER_THE_EPISODE)
        events = copy.deepcopy(history[: previous + ran])
        for i, event in enumerate(events):
            event["IsPlayed"] = i < previous
        out.append((events, episode))
        previous = episode["historyLength"]
    return out


def replays_identically(handle: Any, fixture: dict[str, Any], name: str, shortest: int = 5) -> None:
    scenario = fixture["scenarios"][name]
    replayed = episodes(scenario)
    assert len(replayed) == len(scenario["episodes"]) >= shortest
    for number, (history, recorded) in enumerate(replayed):
        context = {
            "history": history,
            "input": json.dumps(fixture["input"]),
            "instanceId": fixture["instanceId"],
            "isReplaying": False,
            "parentInstanceId": None,
            "upperSchemaVersion": fixture.get("upperSchemaVersion", 0),
        }
        state = json.loads(handle(json.dumps(context)))
        assert state["actions"] == recorded["actions"], (name, number)
        assert (bool(state.get("isDone")), state.get("output")) == (recorded["isDone"], recorded["output"]), (
            name,
            number,
        )
    assert replayed[-1][1]["isDone"]


@pytest.mark.parametrize("name", sorted(FIXTURE["scenarios"]))
def test_a_version_1_history_replays_to_the_same_actions_under_the_current_code(handle: Any, name: str) -> None:
    replays_identically(handle, FIXTURE, name)


@pytest.mark.parametrize("name", sorted(FIXTURE_V2["scenarios"]))
def test_a_version_2_history_replays_to_the_same_actions_under_the_current_code(handle: Any, name: str) -> None:
    replays_identically(handle, FIXTURE_V2, name)


@pytest.mark.parametrize("name", sorted(FIXTURE_V3["scenarios"]))
def test_a_version_3_history_replays_to_the_same_actions_under_the_current_code(handle: Any, name: str) -> None:
    replays_identically(handle, FIXTURE_V3, name, shortest=3)


def test_the_version_3_fixture_is_a_version_3_instance_with_advance_order() -> None:
    for scenario in FIXTURE_V3["scenarios"].values():
        started = [e for e in scenario["history"] if e["EventType"] == int(H.EXECUTION_STARTED)]
        assert [e["Version"] for e in started] == ["3.0"]
    assert FIXTURE_V3["input"]["workflowVersion"] == "3.0" and FIXTURE_V3["upperSchemaVersion"] == 2
    assert "ignored_reply" in FIXTURE_V3["scenarios"] and "cancelled_in_step_2" in FIXTURE_V3["scenarios"]
    called = {
        e["Name"]
        for s in FIXTURE_V3["scenarios"].values()
        for e in s["history"]
        if e["EventType"] == int(H.TASK_SCHEDULED)
    }
    assert called == {fn.ADVANCE_ORDER, fn.DEFER_ORDER}


def test_the_version_2_fixture_is_a_version_2_instance_with_its_five_activities() -> None:
    for scenario in FIXTURE_V2["scenarios"].values():
        started = [e for e in scenario["history"] if e["EventType"] == int(H.EXECUTION_STARTED)]
        assert [e["Version"] for e in started] == ["2.0"]
    assert FIXTURE_V2["input"]["workflowVersion"] == "2.0"
    called = {
        e["Name"]
        for s in FIXTURE_V2["scenarios"].values()
        for e in s["history"]
        if e["EventType"] == int(H.TASK_SCHEDULED)
    }
    assert {
        fn.LOAD_ORDER,
        fn.SET_STEP_DEADLINE,
        fn.SEND_AGENT_REQUEST,
        fn.RECORD_STEP_RESULT,
        fn.FINISH_ORDER,
        fn.BEGIN_COMPENSATION,
    } <= called
    assert fn.ADVANCE_ORDER not in called


def test_the_fixture_is_a_version_1_instance() -> None:
    """No version anywhere: ExecutionStarted.Version "" and an input without workflowVersion."""
    for scenario in FIXTURE["scenarios"].values():
        started = [e for e in scenario["history"] if e["EventType"] == int(H.EXECUTION_STARTED)]
        assert [e["Version"] for e in started] == [""]
    assert "workflowVersion" not in FIXTURE["input"]
