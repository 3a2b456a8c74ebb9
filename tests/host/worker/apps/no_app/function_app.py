"""Refused by the worker: no top-level FunctionApp object (the decorators are on an app the module does not keep)."""

import azure.functions as func


def make() -> None:
    app = func.FunctionApp()

    @app.timer_trigger(arg_name="timer", schedule="0 0 * * * *", use_monitor=False)
    def tick(timer: func.TimerRequest) -> None:
        pass
