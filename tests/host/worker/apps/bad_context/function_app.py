"""Refused by the worker: an unbound `context` parameter that is not azure.functions.Context."""

import azure.functions as func

app = func.FunctionApp()


@app.timer_trigger(arg_name="timer", schedule="0 0 * * * *", use_monitor=False)
def tick(timer: func.TimerRequest, context: str) -> None:
    pass
