"""Refused by the worker: a binding whose parameter the Python function does not have."""

import azure.functions as func

app = func.FunctionApp()


@app.timer_trigger(arg_name="timer", schedule="0 0 * * * *", use_monitor=False)
def tick() -> None:
    pass
