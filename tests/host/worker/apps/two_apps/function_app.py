"""Refused by the worker: two top-level function app objects."""

import azure.durable_functions as df
import azure.functions as func

app = df.DFApp()
other = func.FunctionApp()


@app.timer_trigger(arg_name="timer", schedule="0 0 * * * *", use_monitor=False)
def tick(timer: func.TimerRequest) -> None:
    pass
