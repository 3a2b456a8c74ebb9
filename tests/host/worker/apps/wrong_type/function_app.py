"""Refused by the worker: a Service Bus trigger annotated with a type its converter cannot produce."""

import azure.functions as func

app = func.FunctionApp()


@app.service_bus_queue_trigger(arg_name="message", queue_name="q", connection="ServiceBusConnection")
def consume(message: int) -> None:
    pass
