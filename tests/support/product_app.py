"""The product app's functions as the worker calls them, found on their blueprints.

`FunctionApp.get_functions()` registers the blueprints' functions each time it is called, and a second call in one
process raises "does not have a unique function name" (devhost's loader and other tests call it too); the builders on
the blueprint modules give the same user functions without indexing the app again.
"""

from __future__ import annotations

import importlib
from typing import Any

BLUEPRINT_MODULES = (
    "orchestrators.order_workflow",
    "activities.state",
    "activities.frozen_versions",
    "triggers.submission",
    "triggers.starter",
    "triggers.agent_replies",
    "triggers.supervisor",
    "triggers.ops_api",
)


def user_function(name: str) -> Any:
    """The Python function the worker would call for the registered function `name`."""
    for module_name in BLUEPRINT_MODULES:
        module = importlib.import_module(module_name)
        for attr in dir(module):
            function = getattr(getattr(module, attr), "_function", None)
            if function is not None and function.get_function_name() == name:
                return function.get_user_function()
    raise LookupError(f"no registered function {name!r} in {BLUEPRINT_MODULES}")
