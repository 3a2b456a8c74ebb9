"""Refused by the worker: an annotation that typing.get_type_hints cannot resolve."""

from __future__ import annotations

import azure.functions as func

app = func.FunctionApp()


@app.timer_trigger(arg_name="timer", schedule="0 0 * * * *", use_monitor=False)
def tick(timer: NoSuchType) -> None:  # noqa: F821
    pass
