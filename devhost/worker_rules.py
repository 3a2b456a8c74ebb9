"""The Python worker's function-load rules, applied by devhost before it starts an app.

devhost applies the worker's checks (azure-functions-runtime `functions.py`, `Registry.add_indexed_function`) in the
same order and refuses to start with the worker's own message (`"<ExceptionType>: <message>"`, utils/tracing.py
`serialize_exception`): one refused function fails the whole indexing response, as in Azure, where the host then
starts with no functions. The rules are a re-statement, not the worker's code; tests/host/worker/
test_real_worker_indexing.py keeps them equal to the real worker library (devhost/worker_probe.py under
`.venv-worker`). Why a re-statement: docs/modules-host.md.
"""

from __future__ import annotations

import collections.abc
import inspect
import typing
from typing import Any

import azure.functions as func
from azure.functions.decorators.function_app import Function

HTTP_TRIGGER = "httpTrigger"
OUT, INOUT = 1, 2  # BindingInfo.Direction of FunctionRpc.proto (what Binding.direction returns)


class FunctionLoadError(RuntimeError):
    """The worker's exception (functions.py FunctionLoadError), with its message format."""

    def __init__(self, function_name: str, msg: str) -> None:
        super().__init__("cannot load the " + function_name + " function: " + msg)


class WorkerRefusal(Exception):
    """The app would not load on the real host: `str()` is the message the worker reports."""


def _is_generic_type(tp: Any) -> bool:
    # azure_functions_runtime/utils/typing_inspect.py is_generic_type: a `typing` generic or a Generic subclass.
    # A PEP 585 alias (types.GenericAlias, e.g. dict[str, Any]) is neither, and is not a `type` on Python >= 3.11.
    generic_alias = (typing._GenericAlias, typing._SpecialGenericAlias)  # type: ignore[attr-defined]
    return bool(
        (isinstance(tp, type) and issubclass(tp, typing.Generic))  # type: ignore[arg-type]
        or (
            isinstance(tp, generic_alias)
            and tp.__origin__ not in (typing.Union, tuple, typing.ClassVar, collections.abc.Callable)
        )
    )


def _deferred_registry() -> Any:
    # bindings/meta.py _get_deferred_binding_registry: only when the app imported the base extension.
    import sys

    if "azurefunctions.extensions.base" not in sys.modules:
        return None
    import azurefunctions.extensions.base as clients

    return clients.get_binding_registry()


class _Generic:
    """bindings/generic.py GenericBinding: the converter of a binding type that azure-functions does not know."""

    @staticmethod
    def check_input_type_annotation(pytype: type) -> bool:
        return issubclass(pytype, (str, bytes))

    @staticmethod
    def check_output_type_annotation(pytype: type) -> bool:
        return issubclass(pytype, (str, bytes, bytearray))


def _binding(bind_name: str, deferred: bool = False) -> Any:
    # bindings/meta.py get_binding
    found = None
    if not deferred:
        found = func.get_binding_registry().get(bind_name)
    else:
        registry = _deferred_registry()
        found = registry.get(bind_name) if registry is not None else None
    return found or _Generic


def _has_implicit_output(bind_name: str) -> bool:
    # bindings/meta.py has_implicit_output (GenericBinding exempts durableClient)
    binding = _binding(bind_name)
    if binding is _Generic:
        return bind_name != "durableClient"
    return bool(getattr(binding, "has_implicit_output", lambda: False)())


def _check_function(function: Function) -> None:
    """Registry.add_indexed_function's validation of one function (raises FunctionLoadError or the hint error)."""
    user_fn = function.get_user_function()
    name = function.get_function_name()
    params = dict(inspect.signature(user_fn).parameters)
    annotations = typing.get_type_hints(user_fn)  # a NameError here fails indexing, as in the worker

    bound: dict[str, Any] = {}
    has_explicit_return = False
    return_binding: str | None = None  # Registry.get_return_binding: the $return binding's type wins
    for binding in function.get_bindings():
        if binding.direction == INOUT:
            raise FunctionLoadError(name, '"inout" bindings are not supported')
        if binding.name == "$return":
            if binding.direction != OUT:
                raise FunctionLoadError(name, '"$return" binding must have direction set to "out"')
            has_explicit_return, return_binding = True, binding.type
        else:
            bound[binding.name] = binding
            if not has_explicit_return and _has_implicit_output(binding.type):
                return_binding = binding.type

    if "context" in params and "context" not in bound:  # Registry.is_context_required
        params.pop("context")
        if "context" in annotations:
            anno = annotations["context"]
            if not isinstance(anno, type) or anno.__name__ != "Context":
                raise FunctionLoadError(
                    name,
                    'the "context" parameter is expected to be of type '
                    'azure.functions.Context, got "' + repr(anno) + '"',
                )

    _check_params(name, params, bound, annotations)

    if has_explicit_return and "return" in annotations:  # Registry.get_function_return_type
        anno = annotations["return"]
        origin = typing.get_origin(anno)
        if _is_generic_type(anno) and origin is not None and origin.__name__ == "Out":
            raise FunctionLoadError(name, "return annotation should not be azure.functions.Out")
        if not isinstance(anno, type):
            raise FunctionLoadError(name, "has invalid non-type return annotation " + repr(anno))
        if not _binding(str(return_binding)).check_output_type_annotation(anno):
            raise FunctionLoadError(
                name,
                'Python return annotation "'
                + anno.__name__
                + '" does not match binding type "'
                + str(return_binding)
                + '"',
            )


def _check_params(
    name: str, params: dict[str, inspect.Parameter], bound: dict[str, Any], annotations: dict[str, Any]
) -> None:
    """Registry.validate_function_params."""
    unbound = set(params) - set(bound)
    if unbound:
        settlement = None
        if len(unbound) == 1:  # bindings/meta.py validate_settlement_param (ServiceBusMessageActions)
            candidate = next(iter(unbound))
            registry = _deferred_registry()
            if registry is not None and registry.check_supported_grpc_client_type(annotations.get(candidate)):
                settlement = candidate
        if settlement is None:
            raise FunctionLoadError(
                name,
                "the following parameters are declared in Python but not in the function "
                f"definition (function.json or function decorators):  {unbound!r}",
            )
        params.pop(settlement)
    if set(bound) - set(params):
        raise FunctionLoadError(
            name,
            "Extra parameters in binding definition — the following parameters are "
            "declared as bindings but are not present in Python: " + repr(set(bound) - set(params)),
        )

    for param in params.values():
        binding = bound[param.name]
        has_anno = param.name in annotations
        anno = annotations.get(param.name)
        registry = _deferred_registry()
        deferred = registry is not None and registry.check_supported_type(anno)
        origin = typing.get_origin(anno) if has_anno and _is_generic_type(anno) else None
        is_param_out = has_anno and (
            isinstance(origin, type) and origin.__name__ == "Out"
            if origin is not None
            else isinstance(anno, type) and anno.__name__ == "Out"
        )
        is_binding_out = binding.direction == OUT
        if is_param_out:
            args = typing.get_args(anno)
            if len(args) != 1:
                raise FunctionLoadError(name, "binding " + param.name + " has invalid Out annotation " + repr(anno))
            py_type = args[0]
        else:
            py_type = anno
        if has_anno and not isinstance(py_type, type) and not _is_generic_type(py_type):
            raise FunctionLoadError(name, "binding " + param.name + " has invalid non-type annotation " + repr(anno))
        if is_binding_out and has_anno and not is_param_out:
            raise FunctionLoadError(
                name,
                "binding " + param.name + ' is declared to have the "out" direction, but '
                "its annotation in Python is not a subclass of azure.functions.Out",
            )
        if not is_binding_out and is_param_out:
            raise FunctionLoadError(
                name,
                "binding " + param.name + ' is declared to have the "in" direction in the '
                "binding decorator, but its annotation is azure.functions.Out in Python",
            )
        if not has_anno:
            continue
        bind_type = "generic" if py_type in (str, bytes) and not _has_implicit_output(binding.type) else binding.type
        if is_param_out:
            ok = _binding(bind_type).check_output_type_annotation(py_type)
        else:
            ok = _binding(bind_type, deferred).check_input_type_annotation(py_type)
        if not ok:
            # `binding.data_type is not protos.BindingInfo.undefined`: None (no dataType set) is not undefined (0)
            if not (isinstance(binding.data_type, int) and binding.data_type == 0):
                raise FunctionLoadError(
                    name,
                    'binding type "'
                    + repr(param.name)
                    + '" and dataType "'
                    + binding.type
                    + '" in the binding decorator do not match the corresponding '
                    "function parameter's Python type annotation " + py_type.__name__,
                )
            raise FunctionLoadError(
                name,
                "type of "
                + param.name
                + ' binding in the binding decorator "'
                + binding.type
                + '" does not match its Python annotation "'
                + py_type.__name__
                + '"',
            )


def check_functions(functions: list[Function]) -> None:
    """Validate every function as the worker does at indexing; raise WorkerRefusal with the worker's message."""
    for function in functions:
        try:
            _check_function(function)
        except Exception as exc:
            raise WorkerRefusal(f"{type(exc).__name__}: {exc}") from exc


__all__ = ["FunctionLoadError", "WorkerRefusal", "check_functions"]
