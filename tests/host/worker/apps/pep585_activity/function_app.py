"""Refused by the worker: a PEP 585 alias as an activity's parameter annotation (python-worker #1034)."""

from typing import Any

import azure.durable_functions as df

app = df.DFApp()


@app.activity_trigger(input_name="request")
def work(request: dict[str, Any]) -> str:
    return str(request)
