"""Indexing: import DIR/function_app.py, call `app.get_functions()` once, and describe each function's trigger."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from azure.functions.decorators.function_app import Function, FunctionRegister

from .worker_rules import check_functions


@dataclass(frozen=True)
class FunctionSpec:
    """One indexed function: its name, its trigger's settings (the function.json shape) and the SDK object."""

    name: str
    trigger_type: str
    trigger: dict[str, Any]
    bindings: tuple[dict[str, Any], ...]
    function: Function

    @property
    def trigger_param(self) -> str:
        return str(self.trigger["name"])

    def binding_of_type(self, binding_type: str) -> dict[str, Any] | None:
        return next((b for b in self.bindings if b.get("type") == binding_type), None)


class IndexError_(Exception):
    """The app could not be indexed (import error, no app object, duplicate names)."""


def load_app(app_dir: Path, module_name: str = "function_app") -> FunctionRegister:
    """Import the app module from app_dir (added to sys.path, as the worker does) and return its FunctionApp."""
    path = app_dir / f"{module_name}.py"
    if not path.exists():
        raise IndexError_(f"{path} not found: devhost needs a v2 programming model app (function_app.py)")
    if str(app_dir) not in sys.path:
        sys.path.insert(0, str(app_dir))
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    # The worker's loader.index_function_app, with its messages (reported as "<ExceptionType>: <message>").
    apps = [v for v in vars(module).values() if isinstance(v, FunctionRegister)]
    if len(apps) > 1:
        raise IndexError_(
            f"ValueError: More than one {apps[0].__class__.__name__} or other top level function app "
            "instances are defined."
        )
    if not apps:
        raise IndexError_(f"ValueError: Could not find top level function app instances in {module_name}.py.")
    return apps[0]


def index(app: FunctionRegister) -> list[FunctionSpec]:
    """Enumerate functions exactly once (the SDK's get_functions() re-validates names and may be called once), and
    refuse the app, as the real worker does, when any function would not load (devhost/worker_rules.py)."""
    specs: list[FunctionSpec] = []
    functions = app.get_functions()
    check_functions(functions)
    for fn in functions:
        trigger = fn.get_trigger()
        if trigger is None:
            raise IndexError_(f"function {fn.get_function_name()} has no trigger")
        bindings = tuple(_plain(b.get_dict_repr()) for b in fn.get_bindings())
        trigger_dict = _plain(trigger.get_dict_repr())
        specs.append(
            FunctionSpec(
                name=str(fn.get_function_name()),
                trigger_type=trigger.get_binding_name(),
                trigger=trigger_dict,
                bindings=bindings,
                function=fn,
            )
        )
    return specs


def _plain(value: Any) -> Any:
    """The binding dict with enums turned into their JSON values, as in function.json."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Enum):
        return value.value if not isinstance(value.value, int) else value.name.lower()
    return value


def describe(spec: FunctionSpec, base_url: str) -> str:
    """One line of the function list printed at start, in the shape `func start` prints."""
    if spec.trigger_type == "httpTrigger":
        methods = ",".join(str(m).upper() for m in (spec.trigger.get("methods") or ["GET", "POST"]))
        route = spec.trigger.get("route") or spec.name
        return f"{spec.name}: [{methods}] {base_url}/api/{route}"
    return f"{spec.name}: {spec.trigger_type}"
