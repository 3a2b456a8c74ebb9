"""Scheduler contracts shared by the starter, the orchestrator and its activities (plain models, no I/O)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# The key of LOAD_ORDER's result that lists the steps an earlier attempt completed (they are not sent again).
SUCCEEDED_STEPS = "succeededSteps"


class Outcome(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timedOut"
    SUPERSEDED = "superseded"
    DEFERRED = "deferred"  # the remote service's circuit breaker was open: back to Pending, FailureCount unchanged


class WorkflowInput(BaseModel):
    """The Scheduler's input. Settings travel in the input: an orchestrator must not read the environment."""

    model_config = ConfigDict(populate_by_name=True, frozen=True)

    schema_version: Literal[1] = Field(default=1, alias="schemaVersion")
    order_id: str = Field(alias="orderId")
    attempt: int = Field(ge=1)
    step_timeout_seconds: int = Field(alias="stepTimeoutSeconds", gt=0)
    agent_retries: int = Field(default=4, alias="agentRetries", ge=0)

    def to_dict(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)

