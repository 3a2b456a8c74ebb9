"""The crash budget (orderflow/session_locks.py) on every configuration the system ships: a consumer killed while it
holds an order's session on `agent-requests` or `agent-replies` must never cost that order an attempt, and the
attempts left after a lost one must outlast the locks a crash leaves.

Issue 8 measured it: killing devhost 10 times during 100 orders sent 35 healthy orders to Error with 60 s locks on
the Agent queues, and 0 with 5 s locks. The rule is read from what each configuration really runs with:
- Azure: the app settings' registry defaults (orderflow/settings.py, which the Bicep app settings equal), the queues'
  lockDuration in infra/app/servicebus.bicep, host.json;
- the demo (`devhost demo`, the e2e drills): devhost/system.py LOCAL_DEFAULTS over the registry defaults, the
  embedded broker's servicebus.config.json, host.json;
- the two local samples (devhost's with the embedded broker, `func start`'s with the Bicep-deployed queues).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import timedelta

import isodate
import pytest

from devhost.config import HostConfig
from devhost.system import LOCAL_DEFAULTS
from orderflow import settings
from orderflow.bus.config import load_config_file
from orderflow.session_locks import MIN_LOCK_DURATION, CrashBudget

from .bicep_tree import REPO, Scope, evaluate, main, module_scope

REQUESTS = settings.get("AgentRequestsQueueName", env={}) or ""
REPLIES = settings.get("AgentRepliesQueueName", env={}) or ""
SYMBOLS = {REQUESTS: "agentRequestsQueue", REPLIES: "agentRepliesQueue"}


def _bicep_locks() -> dict[str, timedelta]:
    scope = module_scope(Scope(main()), main().module("serviceBus"))
    locks = {}
    for name, symbol in SYMBOLS.items():
        properties = evaluate(scope.file.resource(symbol).get("properties"), scope)
        locks[name] = isodate.parse_duration(properties["lockDuration"])
    return locks


def _emulator_locks() -> dict[str, timedelta]:
    queues = load_config_file(REPO / "servicebus.config.json")
    return {name: queues[name].lock_duration for name in SYMBOLS}


def _sample(name: str) -> dict[str, str]:
    return {k: str(v) for k, v in json.loads((REPO / name).read_text())["Values"].items()}


def _max_auto_lock_renewal_s() -> float:
    return HostConfig(app_dir=REPO, host_json=json.loads((REPO / "host.json").read_text())) \
        .service_bus_options().max_auto_lock_renewal_s


def _budget(env: Mapping[str, str], locks: Mapping[str, timedelta]) -> CrashBudget:
    return CrashBudget.from_settings(env, requests_lock=locks[REQUESTS], replies_lock=locks[REPLIES])


CONFIGURATIONS = {
    "azure defaults": lambda: _budget({}, _bicep_locks()),
    "local defaults (demo)": lambda: _budget(LOCAL_DEFAULTS, _emulator_locks()),
    "local.settings.sample.json (devhost)": lambda: _budget(_sample("local.settings.sample.json"), _emulator_locks()),
    "local.settings.func.sample.json (func start)":
        lambda: _budget(_sample("local.settings.func.sample.json"), _bicep_locks()),
}


@pytest.mark.parametrize("configuration", sorted(CONFIGURATIONS))
def test_a_crash_never_costs_an_attempt_and_the_attempts_outlast_the_locks(configuration: str) -> None:
    budget = CONFIGURATIONS[configuration]()
    assert budget.violations(_max_auto_lock_renewal_s()) == []


def test_the_agent_queues_lock_for_the_service_bus_minimum_in_azure_and_locally() -> None:
    # 5 s: the Azure portal's minimum LockDuration (Azure/azure-service-bus#22) and the emulator's since 1.1.2
    # ("Added support for updating LockDuration to a minimum of 5 seconds", Service Bus emulator release notes;
    # Azure/azure-service-bus-emulator-installer#53). The embedded broker runs the emulator's Config.json format.
    assert _bicep_locks() == _emulator_locks() == {REQUESTS: MIN_LOCK_DURATION, REPLIES: MIN_LOCK_DURATION}


def test_the_old_one_minute_locks_break_the_budget() -> None:
    """Issue 8's failing configuration: 60 s locks, so a host crash's dead reply session outlasted the step."""
    minute = timedelta(minutes=1)
    broken = CrashBudget.from_settings({}, requests_lock=minute, replies_lock=minute).violations()
    assert len(broken) == 2 and "a crash can cost an attempt" in broken[0] and "125 s" in broken[0]
    assert "the attempts after a lost one" in broken[1] and "66 s <= 125 s" in broken[1]


def test_the_old_local_defaults_break_the_budget_even_with_short_locks() -> None:
    """Issue 8: the demo's 10 s step timeout broke the rule (10 s <= 5 s + 5 s + 5 s)."""
    old = {**LOCAL_DEFAULTS, "StepTimeoutSeconds": "10"}
    broken = _budget(old, _emulator_locks()).violations()
    assert broken == ["a crash can cost an attempt: StepTimeoutSeconds must exceed LockDuration(agent-requests) + "
                      "LockDuration(agent-replies) + headroom, but 10 s <= 15 s"]


def test_one_attempt_leaves_nothing_after_a_lost_one() -> None:
    budget = _budget({"FailureThreshold": "1"}, _emulator_locks())
    assert [v for v in budget.violations() if "attempts after a lost one" in v] == [
        "the attempts after a lost one end before the dead locks: (FailureThreshold - 1) x StepTimeoutSeconds + "
        "backoffs must exceed the locks + headroom, but 0 s <= 15 s"]


def test_lock_renewal_must_outlast_the_longest_hold() -> None:
    budget = _budget({}, _emulator_locks())
    assert budget.violations(max_auto_lock_renewal_s=59) == [
        "host.json maxAutoLockRenewalDuration must cover the longest a function holds a message "
        "(max(StepTimeoutSeconds, ClaimLeaseSeconds)), but 59 s < 60 s"]
    assert budget.violations(max_auto_lock_renewal_s=60) == []


def test_a_lock_below_the_service_bus_minimum_is_refused() -> None:
    budget = CrashBudget.from_settings({}, requests_lock=timedelta(seconds=1), replies_lock=MIN_LOCK_DURATION)
    assert budget.violations() == ["LockDuration of agent-requests is 1 s, below the Service Bus minimum of 5 s"]


def _failure_row(failure: str) -> str:
    readme = (REPO / "README.md").read_text()
    match = re.search(rf"^\| {re.escape(failure)} \|(.*)\|$", readme, re.MULTILINE)
    assert match, f"README's failure table has no row {failure!r}"
    return match.group(1)


@pytest.mark.parametrize("configuration", ["azure defaults", "local defaults (demo)"])
def test_the_readme_states_the_host_crash_rule_with_todays_arithmetic(configuration: str) -> None:
    budget = CONFIGURATIONS[configuration]()
    row = _failure_row("Host crash (kill -9)")
    assert "LockDuration" in row and "agent-replies" in row
    assert budget.step_rule() in row, budget.step_rule()
    assert budget.attempts_rule() in row, budget.attempts_rule()


def test_the_readme_agent_crash_row_names_the_short_lock() -> None:
    row = _failure_row("Agent crash (kill -9)")
    assert "agent-requests" in row and "5 s" in row and "1 min" not in row

