"""Calling a registered function the way the Python worker does: bindings to kwargs, converters, sync vs
async.

`Invoker.call(fn, inputs)` builds the keyword arguments of any function indexed from `app.get_functions()`:
the trigger value (decoded with the worker's converter for Durable triggers, see
azure/functions/durable_functions.py), a durableClient binding's JSON (the DF decorator turns it into a
DurableOrchestrationClient), and a `context` (azure.functions.Context) when the function asks for one.
Sync functions run in a thread pool, async ones on the running loop. Durable outputs are encoded as the worker
encodes them (an activity's return value becomes its JSON string).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

from azure.functions import Context
from azure.functions.durable_functions import ActivityTriggerConverter, OrchestrationTriggerConverter
from azure.functions.meta import Datum

# Triggers whose payload the worker converts: the Durable extension sends them as strings of JSON.
CONVERTERS: dict[str, Any] = {
    "activityTrigger": ActivityTriggerConverter,
    "orchestrationTrigger": OrchestrationTriggerConverter,
}
DURABLE_CLIENT = "durableClient"
CONTEXT_PARAM = "context"


class InvocationContext(Context):
    """The `context: func.Context` argument a function may declare."""

    def __init__(self, function_name: str, invocation_id: str | None = None) -> None:
        self._function_name = function_name
        self._invocation_id = invocation_id or str(uuid.uuid4())
        self._local = threading.local

    @property
    def invocation_id(self) -> str:
        return self._invocation_id

    @property
    def thread_local_storage(self) -> type[threading.local]:
        return self._local

    @property
    def function_name(self) -> str:
        return self._function_name

    @property
    def function_directory(self) -> str:
        return ""

    @property
    def trace_context(self) -> Any:
        return SimpleNamespace(trace_parent="", trace_state="", attributes={})

    @property
    def retry_context(self) -> Any:
        return SimpleNamespace(retry_count=0, max_retry_count=0, exception=None)


class Invoker:
    """Reusable for every trigger. `client_binding_json` supplies what a durableClient parameter receives."""

    def __init__(
        self,
        *,
        client_binding_json: Callable[[], str] | None = None,
        max_workers: int = 32,
        worker_loop: Any = None,
    ) -> None:
        self._client_binding_json = client_binding_json
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="devhost-fn")
        # With a worker loop (devhost.sdk_servicebus.WorkerLoop), `async def` functions run on it, apart from the
        # host loop, as they run in the Python worker process in Azure: one loop for all user code, so clients the
        # app caches (aiohttp sessions of the Durable client, aio SDK clients) stay on one loop.
        self._worker_loop = worker_loop

    def set_client_binding(self, provider: Callable[[], str]) -> None:
        self._client_binding_json = provider

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def call(self, fn: Any, inputs: Mapping[str, Any], *, invocation_id: str | None = None) -> Any:
        """Invoke `fn` (an azure.functions Function) with `inputs` keyed by binding/parameter name."""
        user_fn = fn.get_user_function()
        kwargs = self.build_kwargs(fn, inputs, invocation_id=invocation_id)
        if inspect.iscoroutinefunction(user_fn) and self._worker_loop is not None:
            result = await self._worker_loop.call(user_fn, **kwargs)
        elif inspect.iscoroutinefunction(user_fn):
            result = await user_fn(**kwargs)
        else:
            loop = asyncio.get_running_loop()
            call = functools.partial(contextvars.copy_context().run, user_fn, **kwargs)
            result = await loop.run_in_executor(self._executor, call)
        return encode_output(trigger_type(fn), result)

    def build_kwargs(self, fn: Any, inputs: Mapping[str, Any], *, invocation_id: str | None = None) -> dict[str, Any]:
        params = _parameters(fn.get_user_function())
        kwargs: dict[str, Any] = {}
        trigger = fn.get_trigger()
        for binding in fn.get_bindings():
            name = binding.name
            if binding is trigger:
                if name in inputs:
                    kwargs[_trigger_param(name, params)] = decode_input(binding.type, inputs[name])
            elif binding.type == DURABLE_CLIENT and name not in inputs:
                kwargs[name] = self._client_json()
        kwargs.update({k: v for k, v in inputs.items() if k not in kwargs})
        if CONTEXT_PARAM in params and CONTEXT_PARAM not in kwargs:
            kwargs[CONTEXT_PARAM] = InvocationContext(fn.get_function_name(), invocation_id)
        return _fit_to_signature(kwargs, params)

    def _client_json(self) -> str:
        if self._client_binding_json is None:
            raise RuntimeError("this function has a durableClient binding but no Durable backend is configured")
        return self._client_binding_json()


def trigger_type(fn: Any) -> str | None:
    trigger = fn.get_trigger()
    return getattr(trigger, "type", None) if trigger is not None else None


def decode_input(binding_type: str, value: Any) -> Any:
    """Convert a Durable trigger payload with the worker's converter; other trigger values pass unchanged."""
    converter = CONVERTERS.get(binding_type)
    if converter is None or not isinstance(value, str):
        return value
    return converter.decode(Datum(value=value, type="string"), trigger_metadata={})


def encode_output(binding_type: str | None, result: Any) -> Any:
    """Encode a Durable function's return value as the worker does (activity → JSON string)."""
    converter = CONVERTERS.get(binding_type or "")
    if converter is None:
        return result
    return converter.encode(result, expected_type=None).value


def _parameters(user_fn: Callable[..., Any]) -> Mapping[str, inspect.Parameter]:
    return inspect.signature(user_fn).parameters


def _trigger_param(name: str, params: Mapping[str, inspect.Parameter]) -> str:
    """The parameter that receives the trigger: its binding name, or the only parameter there is.

    Orchestrator callables are `Orchestrator.create(fn).handle(context)` whatever the binding name.
    """
    return next(iter(params)) if name not in params and len(params) == 1 else name


def _fit_to_signature(kwargs: dict[str, Any], params: Mapping[str, inspect.Parameter]) -> dict[str, Any]:
    """Drop what the function does not accept, unless it takes **kwargs."""
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}
