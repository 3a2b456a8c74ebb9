"""The crash budget (orderflow/session_locks.py) on every configuration the system ships: a consumer killed while it
holds an order's session on `agent-requests` or `agent-replies` must never cost that order an attempt, and the
attempts left after a lost one must outlast the locks a crash leaves.

Issue 8 measured it: killing devhost 10 times during 100 orders sent 35 healthy orders to Error with 60 s locks on
the Agent queues, and 0 with 5 s locks. The rule is read from what each configuration really runs with:
- Azure: the app settings' registry defaults (orderflow/settings.py, which the Bicep app settings equal), the queues'
  lockDuration in infra/app/servicebus.bicep, host.json;
- the demo (`devhost demo`, the e2e drills): lab/system.py LOCAL_DEFAULTS over the registry defaults, the
  embedded broker's servicebus.config.json, host.json;
- the two local samples (devhost's with the embedded broker, `func start`'s with the Bicep-deployed queues).

On the Azure Storage Durable backend (Azure and `func start`) the rule also counts the backend's own waits
(`AzureStorageBackend` below): queue polling in every step, the partition lease and the activity visibility timeout
after a host crash.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import isodate
import pytest
from support.bicep_tree import REPO, Scope, evaluate, main, module_scope

from devhost.config import HostConfig
from lab.system import LOCAL_DEFAULTS
from orderflow import settings
from orderflow.embedded.config import load_config_file
from orderflow.session_locks import MIN_LOCK_DURATION, CrashBudget

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
    return HostConfig(app_dir=REPO, host_json=_host_json()).service_bus_options().max_auto_lock_renewal_s


def _host_json() -> dict[str, object]:
    return dict(json.loads((REPO / "host.json").read_text()))


def _budget(env: Mapping[str, str], locks: Mapping[str, timedelta]) -> CrashBudget:
    return CrashBudget.from_settings(env, requests_lock=locks[REQUESTS], replies_lock=locks[REPLIES])


CONFIGURATIONS = {
    "azure defaults": lambda: _budget({}, _bicep_locks()),
    "local defaults (demo)": lambda: _budget(LOCAL_DEFAULTS, _emulator_locks()),
    "local.settings.sample.json (devhost)": lambda: _budget(_sample("local.settings.sample.json"), _emulator_locks()),
    "local.settings.func.sample.json (func start)": lambda: _budget(
        _sample("local.settings.func.sample.json"), _bicep_locks()
    ),
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
    assert broken == [
        "a crash can cost an attempt: StepTimeoutSeconds must exceed LockDuration(agent-requests) + "
        "LockDuration(agent-replies) + headroom, but 10 s <= 15 s"
    ]


def test_one_attempt_leaves_nothing_after_a_lost_one() -> None:
    budget = _budget({"FailureThreshold": "1"}, _emulator_locks())
    assert [v for v in budget.violations() if "attempts after a lost one" in v] == [
        "the attempts after a lost one end before the dead locks: (FailureThreshold - 1) x StepTimeoutSeconds + "
        "backoffs must exceed the locks + headroom, but 0 s <= 15 s"
    ]


def test_lock_renewal_must_outlast_the_longest_hold() -> None:
    budget = _budget({}, _emulator_locks())
    assert budget.violations(max_auto_lock_renewal_s=59) == [
        "host.json maxAutoLockRenewalDuration must cover the longest a function holds a message "
        "(max(StepTimeoutSeconds, ClaimLeaseSeconds)), but 59 s < 60 s"
    ]
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


# ---- the Durable backend's waits (Azure Storage provider: Azure, and `func start` on Azurite) ----------------------
#
# Conformance source: Azure/durabletask src/DurableTask.AzureStorage/AzureStorageOrchestrationServiceSettings.cs
# (read at 5217032961abf45846f462732a5e2813316e3747), the defaults the Functions extension leaves alone except those
# host.json sets (Azure/azure-functions-durable-extension Options/AzureStorageOptions.cs, handed over by
# AzureStorageDurabilityProviderFactory):
# - MaxQueuePollingInterval (default 30 s): an idle queue's poll interval grows from 50 ms (Messaging/TaskHubQueue.cs)
#   by randomized exponential backoff up to it (BackoffPollingHelper.cs); a local enqueue resets only the enqueuing
#   worker's poller, so a message from another worker waits up to one interval to be dequeued.
# - LeaseInterval (30 s): a dead worker's partition (control-queue) lease expires after it; LeaseAcquireInterval
#   (10 s): how often the other workers look for leases to take.
# - WorkItemQueueVisibilityTimeout (5 min): an activity message a dead worker had dequeued stays hidden that long.
AZURE_STORAGE_BACKEND_CONFIGURATIONS = ["azure defaults", "local.settings.func.sample.json (func start)"]


@dataclass(frozen=True)
class AzureStorageBackend:
    """The Azure Storage provider's waits, in seconds, and the rules that keep them inside the crash budget."""

    max_queue_polling_s: float
    lease_interval_s: float = 30.0
    lease_acquire_interval_s: float = 10.0
    work_item_visibility_s: float = 300.0

    @classmethod
    def from_host_json(cls, host_json: dict[str, object]) -> AzureStorageBackend:
        """maxQueuePollingInterval as the host binds it (devhost reads it the same way; 30 s when absent)."""
        provider = dict((host_json.get("extensions") or {}).get("durableTask", {}).get("storageProvider", {}))
        # The lease and visibility defaults hold only while host.json leaves them alone.
        assert not {"workItemQueueVisibilityTimeout", "controlQueueVisibilityTimeout"} & set(provider)
        return cls(
            max_queue_polling_s=HostConfig(app_dir=REPO, host_json=host_json)
            .durable_options()
            .max_queue_polling_interval_s
        )

    @property
    def step_dispatch_s(self) -> float:
        """The worst dispatch latency of one step: the send activity (work-item queue) and the reply event (control
        queue), each waiting up to one poll after an idle spell."""
        return 2 * self.max_queue_polling_s

    @property
    def partition_takeover_s(self) -> float:
        """How long a dead worker's partition stays unserved: its lease runs out, a peer's next acquire pass takes
        it, and the peer's first poll of the control queue dequeues the waiting message."""
        return self.lease_interval_s + self.lease_acquire_interval_s + self.max_queue_polling_s

    def violations(self, budget: CrashBudget) -> list[str]:
        """Every broken rule, with its numbers; empty when the backend fits the budget."""
        broken = []
        if not budget.step_timeout_s > budget.dead_lock_s + self.step_dispatch_s:
            broken.append(
                "a quiet spell can cost an attempt: StepTimeoutSeconds must exceed the locks + headroom + "
                f"2 x maxQueuePollingInterval, but {_s(budget.step_timeout_s)} <= "
                f"{_s(budget.dead_lock_s)} + {_s(self.step_dispatch_s)}"
            )
        if not budget.claim_lease_s > self.partition_takeover_s:
            broken.append(
                "a crash can cost the next attempt its start: ClaimLeaseSeconds must exceed LeaseInterval + "
                f"LeaseAcquireInterval + maxQueuePollingInterval, but {_s(budget.claim_lease_s)} <= "
                f"{_s(self.partition_takeover_s)}"
            )
        if not budget.spare_attempts_s > self.partition_takeover_s + self.step_dispatch_s:
            broken.append(
                "the attempts after a lost one end before the dead partition is served: (FailureThreshold - "
                "1) x StepTimeoutSeconds + backoffs must exceed the partition takeover + one step's "
                f"dispatch, but {_s(budget.spare_attempts_s)} <= "
                f"{_s(self.partition_takeover_s + self.step_dispatch_s)}"
            )
        return broken


def _s(seconds: float) -> str:
    return f"{seconds:g} s"


@pytest.mark.parametrize("configuration", AZURE_STORAGE_BACKEND_CONFIGURATIONS)
def test_the_budget_counts_the_azure_storage_backends_waits(configuration: str) -> None:
    backend = AzureStorageBackend.from_host_json(_host_json())
    assert backend.max_queue_polling_s == 5.0
    assert backend.violations(CONFIGURATIONS[configuration]()) == []


def test_the_step_timeout_on_azure_is_the_one_the_backend_rule_reads() -> None:
    # The Bicep app settings equal the registry defaults (tests/product/infra/test_infra_settings.py); 30 s on Azure.
    assert CONFIGURATIONS["azure defaults"]().step_timeout_s == 30.0


def test_the_providers_default_polling_breaks_the_budget() -> None:
    """host.json without maxQueuePollingInterval: the first order after a quiet spell can lose its attempt."""
    backend = AzureStorageBackend.from_host_json({"version": "2.0"})
    assert backend.max_queue_polling_s == 30.0
    assert backend.violations(CONFIGURATIONS["azure defaults"]()) == [
        "a quiet spell can cost an attempt: StepTimeoutSeconds must exceed the locks + headroom + "
        "2 x maxQueuePollingInterval, but 30 s <= 15 s + 60 s",
        "a crash can cost the next attempt its start: ClaimLeaseSeconds must exceed LeaseInterval + "
        "LeaseAcquireInterval + maxQueuePollingInterval, but 60 s <= 70 s",
        "the attempts after a lost one end before the dead partition is served: (FailureThreshold - 1) x "
        "StepTimeoutSeconds + backoffs must exceed the partition takeover + one step's dispatch, but 66 s <= 130 s",
    ]


def test_polling_at_the_edge_of_the_step_breaks_it() -> None:
    # 30 s > 15 s + 2 x 7.5 s is false: the chosen 5 s leaves 5 s of the step.
    edge = AzureStorageBackend(max_queue_polling_s=7.5)
    assert [v for v in edge.violations(CONFIGURATIONS["azure defaults"]()) if "quiet spell" in v]
    assert AzureStorageBackend(max_queue_polling_s=5).violations(CONFIGURATIONS["azure defaults"]()) == []


def test_a_hidden_activity_message_costs_its_attempt_and_nothing_after() -> None:
    """A host killed while it runs an activity: the message stays hidden for WorkItemQueueVisibilityTimeout, longer
    than any step, so that attempt is lost (its CompleteBy passes and the Supervisor retries it under a new instance
    id, with messages of its own); when the old message reappears its attempt's LockedBy is gone and the fenced
    writes change nothing. The attempts after it are rule 2's and the partition rule's."""
    backend = AzureStorageBackend.from_host_json(_host_json())
    budget = CONFIGURATIONS["azure defaults"]()
    assert backend.work_item_visibility_s > budget.step_timeout_s
    assert budget.failure_threshold >= 2
