"""Activities: the only code the Scheduler calls. Each one is idempotent (at-least-once delivery)."""

from contextlib import AbstractContextManager
from typing import Any, Dict  # noqa: UP035

from opentelemetry.trace import Span

from orderflow import tracing

# The annotation of an activity's trigger parameter. The Python worker accepts only a class or a `typing` generic
# there: `Registry.validate_function_params` refuses a PEP 585 alias such as `dict[str, Any]` ("binding request has
# invalid non-type annotation"), and one refused function fails the whole indexing response, so the host starts
# with no functions (azure-functions-python-worker #1034, azure-functions-durable-python #468, both open).
# tests/host/worker/test_real_worker_indexing.py indexes the app with the real worker library to keep this true.
ActivityInput = Dict[str, Any]  # noqa: UP006


def traced(name: str, request: ActivityInput) -> AbstractContextManager[Span]:
    """The span of one activity execution (`orderflow.activity.<name>`), in the order's trace: the Scheduler passes
    the traceparent it was started with in each activity's input (workflow version 3; earlier versions' inputs have
    none, so their activities start traces of their own)."""
    return tracing.span(
        f"orderflow.activity.{name}",
        parent=request.get("traceparent"),
        attributes=tracing.order_attributes(request.get("orderId"), request.get("instanceId"), request.get("step")),
    )
