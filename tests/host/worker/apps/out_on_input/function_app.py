"""Refused by the worker: azure.functions.Out on an input (trigger) binding."""

import azure.functions as func

app = func.FunctionApp()


@app.timer_trigger(arg_name="timer", schedule="0 0 * * * *", use_monitor=False)
def tick(timer: func.Out[str]) -> None:
    pass
