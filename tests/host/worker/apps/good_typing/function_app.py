"""Loads: `typing` generics and unannotated parameters are what the worker accepts for an activity's input."""

from __future__ import annotations

from typing import Any, Dict  # noqa: UP035

import azure.durable_functions as df
import azure.functions as func

app = df.DFApp()


@app.activity_trigger(input_name="request")
def typed(request: Dict[str, Any]) -> dict[str, Any]:  # noqa: UP006
    return request


@app.activity_trigger(input_name="request")
def untyped(request) -> str:  # type: ignore[no-untyped-def]
    return str(request)


@app.timer_trigger(arg_name="timer", schedule="0 0 * * * *", use_monitor=False)
def tick(timer: func.TimerRequest, context: func.Context) -> None:
    pass
