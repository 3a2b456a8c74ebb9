"""The end-to-end retry budget of one order step, owned by the Scheduler (seeds 000/001 and 003: retries have one
owner; the other layers are configured so that their product cannot exceed it).

The most remote calls one order step can cause is (retries carried in the request + 1) × AgentRequestsMaxDeliveryCount
× FailureThreshold; every other layer is a factor of 1. `RemoteCallBudgetPerStep` is the budget. The Starter carries
`request_retries()` in every request (the `maxRetries` of WorkflowInput): the configured AgentRetriesPerStep, lowered
until the product fits. A budget smaller than deliveries × attempts (not even one call per delivery) is refused at
start-up. Each factor, and why the other layers do not multiply it: docs/modules-product.md."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orderflow import settings


@dataclass(frozen=True)
class RetryBudget:
    budget: int  # RemoteCallBudgetPerStep
    agent_retries: int  # AgentRetriesPerStep: the retries the Scheduler would allow without a budget
    max_delivery_count: int  # AgentRequestsMaxDeliveryCount (= agent-requests MaxDeliveryCount)
    failure_threshold: int  # FailureThreshold

    def __post_init__(self) -> None:
        if self.agent_retries < 0 or min(self.budget, self.max_delivery_count, self.failure_threshold) < 1:
            raise ValueError("the retry budget's factors must be positive (AgentRetriesPerStep may be 0)")
        if self.budget < self.max_delivery_count * self.failure_threshold:
            raise ValueError(
                f"RemoteCallBudgetPerStep {self.budget} is below AgentRequestsMaxDeliveryCount x FailureThreshold = "
                f"{self.max_delivery_count} x {self.failure_threshold}: not even one call per delivery fits"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RetryBudget:
        return cls(
            budget=settings.get_int("RemoteCallBudgetPerStep", env),
            agent_retries=settings.get_int("AgentRetriesPerStep", env),
            max_delivery_count=settings.get_int("AgentRequestsMaxDeliveryCount", env),
            failure_threshold=settings.get_int("FailureThreshold", env),
        )

    def request_retries(self) -> int:
        """The retries the Scheduler allows the Agent per request (carried in the request)."""
        fitting = self.budget // (self.max_delivery_count * self.failure_threshold) - 1
        return min(self.agent_retries, fitting)

    def calls_per_request(self, agent_max_retries: int | None = None) -> int:
        """Calls one delivered request can make; the Agent's own AGENT_MAX_RETRIES may lower it further."""
        retries = self.request_retries()
        if agent_max_retries is not None:
            retries = min(retries, agent_max_retries)
        return retries + 1

    def worst_case(self, agent_max_retries: int | None = None) -> int:
        """The most remote calls one order step can cause, over all its attempts."""
        return self.calls_per_request(agent_max_retries) * self.max_delivery_count * self.failure_threshold

    def arithmetic(self, agent_max_retries: int | None = None) -> str:
        """E.g. `(4 + 1) x 5 x 3 = 75 <= 75`: the README's line, from the settings."""
        retries = self.calls_per_request(agent_max_retries) - 1
        return (
            f"({retries} + 1) x {self.max_delivery_count} x {self.failure_threshold} = "
            f"{self.worst_case(agent_max_retries)} <= {self.budget}"
        )
