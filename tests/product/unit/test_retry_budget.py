"""The end-to-end retry budget (orderflow/retry_budget.py, issue 11): the most remote calls one order step can cause,
computed from what each configuration really runs with, never exceeds `RemoteCallBudgetPerStep`.

    calls per step <= calls per Agent request x deliveries per request x attempts that can call
                    = (min(retries carried in the request, AGENT_MAX_RETRIES) + 1) x MaxDeliveryCount(agent-requests)
                      x FailureThreshold

read from the real files:
- the settings registry defaults (orderflow/settings.py) = Azure, lab/system.py LOCAL_DEFAULTS over them = the demo,
  and both local.settings samples;
- MaxDeliveryCount of agent-requests in servicebus.config.json (embedded broker / emulator) and in
  infra/app/servicebus.bicep (Azure);
- the Agent's AGENT_MAX_RETRIES default (agent/config.py AGENT_SETTINGS);
- factors of 1, each asserted here: the Scheduler's activity retries (orchestrators/order_workflow.py ACTIVITY_RETRY)
  resend the same MessageId `<instanceId>:<step>`, which duplicate detection on agent-requests drops (on in both files,
  with a window longer than those retries take); host.json's Service Bus clientRetryOptions retry bus operations of
  the Functions host only, and the Agent does not read host.json.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import isodate
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.bicep_tree import Scope, evaluate, main, module_scope

from agent.config import AGENT_SETTINGS
from lab.system import LOCAL_DEFAULTS
from orchestrators.order_workflow import ACTIVITY_RETRY
from orderflow import settings
from orderflow.adapters import aio_bus_from_connection_string
from orderflow.embedded.broker import EmbeddedBroker
from orderflow.embedded.config import QueueProperties, load_config_file
from orderflow.messages import AgentRequest
from orderflow.outbound import send_agent_request
from orderflow.retry_budget import RetryBudget
from orderflow.runtime import Tunables

REPO = Path(__file__).resolve().parents[3]
REQUESTS = settings.get("AgentRequestsQueueName", env={}) or "agent-requests"
AGENT_MAX_RETRIES_DEFAULT = int(next(str(s.default) for s in AGENT_SETTINGS if s.name == "AGENT_MAX_RETRIES"))


def _bicep_requests_queue() -> dict[str, Any]:
    """The evaluated `properties` of the agent-requests queue resource, as main.bicep deploys it."""
    scope = module_scope(Scope(main()), main().module("serviceBus"))
    properties = evaluate(scope.file.resource("agentRequestsQueue").get("properties"), scope)
    assert isinstance(properties, dict), properties
    return properties


def _emulator_requests_queue() -> QueueProperties:
    return load_config_file(REPO / "servicebus.config.json")[REQUESTS]


def _bicep_max_delivery_count() -> int:
    return int(_bicep_requests_queue()["maxDeliveryCount"])


def _emulator_max_delivery_count() -> int:
    return _emulator_requests_queue().max_delivery_count


def _sample(name: str) -> dict[str, str]:
    return {k: str(v) for k, v in json.loads((REPO / name).read_text())["Values"].items()}


# Each configuration the system ships: its settings and the agent-requests MaxDeliveryCount of the queues it runs on.
CONFIGURATIONS: dict[str, Callable[[], tuple[Mapping[str, str], int]]] = {
    "azure defaults": lambda: ({}, _bicep_max_delivery_count()),
    "local defaults (demo)": lambda: (LOCAL_DEFAULTS, _emulator_max_delivery_count()),
    "local.settings.sample.json (devhost)": lambda: (
        _sample("local.settings.sample.json"),
        _emulator_max_delivery_count(),
    ),
    "local.settings.func.sample.json (func start)": lambda: (
        _sample("local.settings.func.sample.json"),
        _bicep_max_delivery_count(),
    ),
}


def _agent_max_retries(env: Mapping[str, str]) -> int:
    """What the Agent process runs with: its own AGENT_MAX_RETRIES (the same env), else agent/config.py's default."""
    return int(env.get("AGENT_MAX_RETRIES") or AGENT_MAX_RETRIES_DEFAULT)


def _scheduler_resends_factor() -> int:
    """The Scheduler's activity retries resend an Agent request with the same MessageId: duplicate detection (asserted
    in test_scheduler_resends_are_dropped_by_duplicate_detection) makes them a factor of 1."""
    return 1


def _host_json_factor() -> int:
    """host.json's Service Bus clientRetryOptions retry the Functions host's bus operations (sends, receives,
    settlement), never a remote call; and the Agent, the only caller of the remote, does not read host.json
    (test_the_agent_does_not_read_host_json)."""
    return 1


@pytest.mark.parametrize("configuration", sorted(CONFIGURATIONS))
def test_the_product_of_every_layer_fits_the_budget(configuration: str) -> None:
    env, max_delivery_count = CONFIGURATIONS[configuration]()
    carried = Tunables.from_env(env).agent_retries  # maxRetries in every request the Starter starts
    calls_per_request = min(carried, _agent_max_retries(env)) + 1
    threshold = settings.get_int("FailureThreshold", env)
    budget = settings.get_int("RemoteCallBudgetPerStep", env)

    product = calls_per_request * max_delivery_count * threshold * _scheduler_resends_factor() * _host_json_factor()

    assert product <= budget, (
        f"{configuration}: ({calls_per_request - 1} + 1) x {max_delivery_count} x {threshold} = {product} > {budget}"
    )
    # RetryBudget computes the same product from the settings (its deliveries being the queue's, next test).
    assert RetryBudget.from_env(env).worst_case(_agent_max_retries(env)) == product


@pytest.mark.parametrize("configuration", sorted(CONFIGURATIONS))
def test_the_delivery_count_setting_equals_the_queue_property(configuration: str) -> None:
    env, max_delivery_count = CONFIGURATIONS[configuration]()
    assert settings.get_int("AgentRequestsMaxDeliveryCount", env) == max_delivery_count


def test_agent_requests_has_the_same_max_delivery_count_in_both_files() -> None:
    assert (
        _bicep_max_delivery_count()
        == _emulator_max_delivery_count()
        == settings.get_int("AgentRequestsMaxDeliveryCount", {})
    )


def _activity_retries_take() -> timedelta:
    """The longest the Scheduler keeps resending one request: the intervals between its tries (no backoff
    coefficient in the Python SDK's RetryOptions)."""
    interval = timedelta(milliseconds=int(ACTIVITY_RETRY.first_retry_interval_in_milliseconds))
    return interval * (int(ACTIVITY_RETRY.max_number_of_attempts) - 1)


def test_scheduler_resends_need_duplicate_detection_on_agent_requests_in_both_files() -> None:
    bicep, emulator = _bicep_requests_queue(), _emulator_requests_queue()
    assert ACTIVITY_RETRY.max_number_of_attempts > 1  # the Scheduler does resend: the factor needs the dedup
    assert bicep["requiresDuplicateDetection"] is True
    assert emulator.requires_duplicate_detection is True
    step_timeout = timedelta(
        seconds=max(settings.get_int("StepTimeoutSeconds", env) for env, _ in (c() for c in CONFIGURATIONS.values()))
    )
    for window in (
        isodate.parse_duration(bicep["duplicateDetectionHistoryTimeWindow"]),
        emulator.duplicate_detection_history_time_window,
    ):
        # Longer than the resends take, and than a whole step: any resend of a step's request is still a duplicate.
        assert window > _activity_retries_take() and window > step_timeout, window


def _request(instance: str = "o-1:1", step: str = "reserve-inventory") -> AgentRequest:
    # As the send_agent_request activity builds it from the Scheduler's input (activities/agents.py).
    return AgentRequest.model_validate(
        {
            "instanceId": instance,
            "orderId": instance.split(":")[0],
            "attempt": int(instance.split(":")[1]),
            "step": step,
            "idempotencyKey": f"{instance.split(':')[0]}:{step}",
            "deadline": "2026-01-01T00:00:30Z",
            "maxRetries": 4,
            "payload": {"orderId": instance.split(":")[0]},
            "replyTo": "agent-replies",
        }
    )


async def test_scheduler_resends_are_dropped_by_duplicate_detection(tmp_path: Path) -> None:
    """What the Scheduler's activity retry does: the same request sent again (a send whose ack was lost). On the
    embedded broker, with the repo's queue declarations, agent-requests keeps one copy: a factor of 1."""
    path = tmp_path / "bus.db"
    bus = aio_bus_from_connection_string(f"Endpoint=embedded://{path};ConfigFile={REPO / 'servicebus.config.json'}")
    try:
        for _ in range(ACTIVITY_RETRY.max_number_of_attempts):
            await send_agent_request(bus, REQUESTS, _request())
        await send_agent_request(bus, REQUESTS, _request(instance="o-1:2"))  # the next attempt is a new request
    finally:
        await bus.close()
    assert _request().message_id() == "o-1:1:reserve-inventory"
    assert EmbeddedBroker(path).counts(REQUESTS).active == 2


def test_the_agent_does_not_read_host_json() -> None:
    """host.json's clientRetryOptions configure the Functions host's Service Bus client only: the Agent (the one
    process that calls the remote service) never reads it, so it adds no factor to the remote calls."""
    host = json.loads((REPO / "host.json").read_text())
    assert "clientRetryOptions" in host["extensions"]["serviceBus"]  # what this factor is about
    readers = [
        str(p.relative_to(REPO))
        for p in sorted((REPO / "agent").rglob("*.py"))
        if "host.json" in p.read_text() or "host_json" in p.read_text()
    ]
    assert readers == []
    assert _host_json_factor() == 1


# RetryBudget itself.


def test_the_defaults_spend_the_budget_exactly() -> None:
    budget = RetryBudget.from_env({})
    assert (budget.budget, budget.agent_retries, budget.max_delivery_count, budget.failure_threshold) == (75, 4, 5, 3)
    assert budget.request_retries() == 4
    assert budget.worst_case() == 75
    assert budget.arithmetic() == "(4 + 1) x 5 x 3 = 75 <= 75"


def test_a_smaller_budget_lowers_the_retries_carried_in_each_request() -> None:
    budget = RetryBudget(budget=30, agent_retries=4, max_delivery_count=5, failure_threshold=3)
    assert budget.request_retries() == 1  # 30 // 15 - 1
    assert budget.worst_case() == 30 and budget.arithmetic() == "(1 + 1) x 5 x 3 = 30 <= 30"
    assert RetryBudget(budget=15, agent_retries=4, max_delivery_count=5, failure_threshold=3).request_retries() == 0


def test_a_larger_budget_never_raises_the_configured_retries() -> None:
    budget = RetryBudget(budget=1000, agent_retries=4, max_delivery_count=5, failure_threshold=3)
    assert budget.request_retries() == 4 and budget.worst_case() == 75


def test_the_agents_own_limit_lowers_the_calls_further() -> None:
    budget = RetryBudget.from_env({})
    assert budget.calls_per_request(agent_max_retries=1) == 2 and budget.worst_case(agent_max_retries=1) == 30
    assert budget.calls_per_request(agent_max_retries=9) == 5


@pytest.mark.parametrize(("budget", "deliveries", "threshold"), [(14, 5, 3), (9, 5, 2), (1, 2, 1), (8, 3, 3)])
def test_a_budget_below_deliveries_times_threshold_is_refused(budget: int, deliveries: int, threshold: int) -> None:
    with pytest.raises(ValueError, match="RemoteCallBudgetPerStep"):
        RetryBudget(budget=budget, agent_retries=4, max_delivery_count=deliveries, failure_threshold=threshold)
    RetryBudget(
        budget=deliveries * threshold, agent_retries=4, max_delivery_count=deliveries, failure_threshold=threshold
    )  # one call per delivery fits: accepted


@pytest.mark.parametrize("field", ["budget", "max_delivery_count", "failure_threshold", "agent_retries"])
def test_factors_must_be_positive(field: str) -> None:
    values = {"budget": 75, "agent_retries": 4, "max_delivery_count": 5, "failure_threshold": 3}
    with pytest.raises(ValueError, match="positive"):
        RetryBudget(**{**values, field: -1 if field == "agent_retries" else 0})


@given(
    budget=st.integers(1, 2000),
    retries=st.integers(0, 20),
    deliveries=st.integers(1, 20),
    threshold=st.integers(1, 20),
    agent_limit=st.none() | st.integers(0, 20),
)
def test_whatever_the_settings_the_worst_case_fits_the_budget(
    budget: int, retries: int, deliveries: int, threshold: int, agent_limit: int | None
) -> None:
    if budget < deliveries * threshold:
        with pytest.raises(ValueError):
            RetryBudget(budget, retries, deliveries, threshold)
        return
    fitted = RetryBudget(budget, retries, deliveries, threshold)
    assert 0 <= fitted.request_retries() <= retries
    assert fitted.worst_case(agent_limit) <= budget
    # As many retries as fit: one more would break the budget (unless the configured retries are the limit).
    if fitted.request_retries() < retries:
        assert (fitted.request_retries() + 2) * deliveries * threshold > budget


def test_tunables_carry_the_fitted_retries() -> None:
    assert Tunables.from_env({}).agent_retries == 4
    assert Tunables.from_env({"RemoteCallBudgetPerStep": "30"}).agent_retries == 1
    assert Tunables.from_env({"RemoteCallBudgetPerStep": "30", "AgentRetriesPerStep": "0"}).agent_retries == 0
    assert Tunables.from_env({"RemoteCallBudgetPerStep": "1000", "AgentRetriesPerStep": "2"}).agent_retries == 2
    assert (
        Tunables.from_env(
            {"RemoteCallBudgetPerStep": "20", "FailureThreshold": "2", "AgentRequestsMaxDeliveryCount": "2"}
        ).agent_retries
        == 4
    )  # 20 // 4 - 1 = 4


def test_tunables_refuse_a_budget_that_does_not_fit_one_call_per_delivery() -> None:
    with pytest.raises(ValueError, match="RemoteCallBudgetPerStep"):
        Tunables.from_env({"RemoteCallBudgetPerStep": "14"})


def test_the_readme_shows_the_arithmetic_with_todays_defaults() -> None:
    line = RetryBudget.from_env({}).arithmetic()
    assert line in (REPO / "README.md").read_text(), f"README.md does not show the retry budget arithmetic {line!r}"
