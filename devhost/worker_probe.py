"""Index a Functions app with the real Python worker library, as the host's worker does at start-up.

Run with the interpreter of the worker environment (`.venv-worker`), never imported by devhost itself:

    .venv-worker/bin/python devhost/worker_probe.py APP_DIR

It prints one JSON object: `{"ok": true, "functions": [{"name", "bindings", "rawBindings"}...]}` or
`{"ok": false, "error": "<the worker's message>"}`. The steps are the worker's own (azure_functions_runtime
handle_event.py `worker_init_request` → `load_function_metadata` → `index_functions`); `protos` is a stand-in with
FunctionRpc.proto's values that records what the worker builds. Steps and stand-in: docs/modules-host.md.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace
from typing import Any


class _Message(SimpleNamespace):
    """A protobuf message stand-in: keyword construction, attribute access."""


class _BindingInfo(_Message):
    # enum Direction / enum DataType of FunctionRpc.proto's BindingInfo
    in_ = 0
    out = 1
    inout = 2
    undefined = 0
    string = 1
    binary = 2
    stream = 3


PROTOS = SimpleNamespace(
    BindingInfo=_BindingInfo,
    RpcFunctionMetadata=_Message,
    RpcRetryOptions=_Message,
    RpcException=_Message,
)


def probe(app_dir: str) -> dict[str, Any]:
    from azure_functions_runtime import loader  # (only in the worker environment)
    from azure_functions_runtime.bindings import meta
    from azure_functions_runtime.functions import Registry

    app_dir = os.path.abspath(app_dir)
    os.chdir(app_dir)  # the worker runs in the app root (AzureWebJobsScriptRoot) with it on sys.path
    sys.path.insert(0, app_dir)
    try:
        meta.load_binding_registry()
        indexed = loader.index_function_app(os.path.join(app_dir, "function_app.py"))
        metadata, _ = loader.process_indexed_function(PROTOS, Registry(), indexed, app_dir)
    except Exception as exc:  # noqa: BLE001 - the worker's own message: utils/tracing.py serialize_exception
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    functions = []
    for item in metadata:
        functions.append(
            {
                "name": item.name,
                "bindings": {
                    name: {"type": b.type, "direction": b.direction, "dataType": b.data_type}
                    for name, b in item.bindings.items()
                },
                "rawBindings": [json.loads(raw) for raw in item.raw_bindings],
            }
        )
    return {"ok": True, "functions": functions}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: worker_probe.py APP_DIR")
    print(json.dumps(probe(sys.argv[1]), sort_keys=True))
