"""Refused by the worker: a Python parameter that no binding declares."""

import azure.functions as func

app = func.FunctionApp()


@app.timer_trigger(arg_name="timer", schedule="0 0 * * * *", use_monitor=False)
def tick(timer: func.TimerRequest, extra: str) -> None:
    pass
