"""The real Python worker indexes every app devhost runs, and devhost refuses exactly what the worker refuses.

Conformance source: PyPI `azure-functions-runtime` (the Python worker library, Python >= 3.13), run unchanged by
devhost/worker_probe.py in `.venv-worker` (built by `make test` from requirements-worker.txt): its
`loader.index_function_app` + `loader.process_indexed_function` → `functions.Registry.add_indexed_function`, the
code that decides at start-up whether the host gets any function at all (one FunctionLoadError fails the whole
indexing response). On Python <= 3.12 the same validation is azure-functions-python-worker's
`azure_functions_worker/functions.py`.

1. The product app and both sample apps load with the real worker: every function, and the binding metadata the
   worker sends to the host equals what devhost reads.
2. For a corpus of broken apps (tests/host/worker/apps), `python -m devhost start` refuses to start, with the
   worker's own message, and the real worker refuses with that same message; a loadable corpus app loads in both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
CORPUS = Path(__file__).resolve().parent / "apps"
WORKER_PYTHON = Path(os.environ.get("ORDERFLOW_WORKER_PYTHON", ROOT / ".venv-worker" / "bin" / "python"))
APPS = {
    "product": ROOT,
    "sample_app": ROOT / "tests" / "host" / "sample_app",
    "sample_host_app": ROOT / "tests" / "host" / "sample_host_app",
}
BROKEN = sorted(p.name for p in CORPUS.iterdir() if p.is_dir() and not p.name.startswith(("good_", "_")))
GOOD = sorted(p.name for p in CORPUS.iterdir() if p.is_dir() and p.name.startswith("good_"))
# The host reads a binding's enum values (direction, authLevel, ...) case-insensitively; azure-functions 2.x on
# Python 3.13 writes them upper case ("IN"), 1.x on 3.11 lower case ("in"), as function.json does.
ENUM_KEYS = {"direction", "authLevel", "dataType", "cardinality", "accessRights"}


def _run(
    args: list[str], cwd: Path = ROOT, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = None if env is None else {**os.environ, **env}
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False, env=environ)


def real_worker(app_dir: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    if not WORKER_PYTHON.exists():
        pytest.fail(
            f"{WORKER_PYTHON} is missing: `make worker-env` (part of `make test`) builds the Python 3.13 "
            "environment with azure-functions-runtime"
        )
    done = _run([str(WORKER_PYTHON), str(ROOT / "devhost" / "worker_probe.py"), str(app_dir)], cwd=app_dir, env=env)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


_DEVHOST_INDEX = """
import json, sys, typing
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from devhost.app_loader import index, load_app
from devhost.sdk_servicebus import is_sdk_message_type
specs = index(load_app(Path(sys.argv[1])))
out = {}
for s in specs:
    hints = typing.get_type_hints(s.function.get_user_function())
    out[s.name] = {"bindings": list(s.bindings),
                   "sdkType": sorted(b["name"] for b in s.bindings if is_sdk_message_type(hints.get(b["name"])))}
print(json.dumps(out))
"""


def devhost_index(app_dir: Path) -> dict[str, Any]:
    """What devhost reads for each function (app_loader.index, and which parameters it binds as SDK types)."""
    done = _run([sys.executable, "-c", _DEVHOST_INDEX, str(app_dir), str(ROOT)], cwd=app_dir)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def devhost_start(app_dir: Path, state_dir: Path) -> subprocess.CompletedProcess[str]:
    """`python -m devhost start` on an app it must refuse: it exits at once instead of serving. If it serves
    instead (it prints "devhost listening"), it is stopped and the result says so (returncode None)."""
    args = [
        sys.executable,
        "-m",
        "devhost",
        "start",
        "--app-dir",
        str(app_dir),
        "--port",
        "0",
        "--state-dir",
        str(state_dir),
    ]
    state_dir.mkdir(parents=True, exist_ok=True)
    with (
        (state_dir / "stderr.log").open("w+") as err,
        subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True) as proc,
    ):
        assert proc.stdout is not None
        lines, served = [], False
        for line in proc.stdout:  # ends at exit, or at the line that says it serves
            lines.append(line)
            if line.startswith("devhost listening"):
                served = True
                proc.terminate()
                break
        returncode = proc.wait(timeout=60)
        err.seek(0)
        return subprocess.CompletedProcess(args, None if served else returncode, "".join(lines), err.read())


def normalized(binding: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (v.lower() if k in ENUM_KEYS and isinstance(v, str) else v) for k, v in binding.items() if k != "properties"
    }


@pytest.fixture(scope="module")
def indexed() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        worker = {name: pool.submit(real_worker, path) for name, path in APPS.items()}
        devhost = {name: pool.submit(devhost_index, path) for name, path in APPS.items()}
        return {name: (worker[name].result(), devhost[name].result()) for name in APPS}


@pytest.mark.parametrize("app", sorted(APPS))
def test_the_real_worker_loads_every_function(indexed: dict[str, Any], app: str) -> None:
    worker, devhost = indexed[app]
    assert worker["ok"], worker.get("error")
    assert sorted(f["name"] for f in worker["functions"]) == sorted(devhost)


@pytest.mark.parametrize("app", sorted(APPS))
def test_binding_metadata_equals_what_devhost_reads(indexed: dict[str, Any], app: str) -> None:
    worker, devhost = indexed[app]
    for function in worker["functions"]:
        ours = devhost[function["name"]]
        assert [normalized(b) for b in function["rawBindings"]] == [normalized(b) for b in ours["bindings"]], function[
            "name"
        ]
        # The worker marks the bindings it passes as SDK types (deferred bindings, azurefunctions-extensions-base);
        # devhost must bind exactly those as SDK types too.
        deferred = sorted(
            b["name"] for b in function["rawBindings"] if b.get("properties", {}).get("SupportsDeferredBinding")
        )
        assert deferred == ours["sdkType"], function["name"]


def test_the_product_app_has_the_functions_the_pattern_needs(indexed: dict[str, Any]) -> None:
    worker, _ = indexed["product"]
    names = {f["name"] for f in worker["functions"]}
    assert {
        "submission",
        "starter_timer",
        "agent_replies",
        "supervisor",
        "alarms",
        "order_workflow",
        "load_order",
        "set_step_deadline",
        "record_step_result",
        "finish_order",
        "send_agent_request",
        "defer_order",
        "begin_compensation",
        "advance_order",
        "ops_order",
        "ops_orders",
        "ops_resubmit",
        "ops_cancel",
        "ops_summary",
        "ops_openapi",
    } <= names


@pytest.mark.parametrize(
    ("legacy", "expected"),
    [
        (
            "app",
            {"submission": "%OrdersQueueName%", "submission-app": "app-orders", "submission-partner": "partner-orders"},
        ),
        ("none", {"submission-app": "app-orders", "submission-partner": "partner-orders"}),
    ],
)
def test_the_real_worker_indexes_one_submission_trigger_per_apps_queue(legacy: str, expected: dict[str, str]) -> None:
    """Issue 25: the one submission path is registered per inbound queue from the app setting SubmittingApps, which
    the worker reads from its environment when it indexes (app settings are environment variables there); the
    shared queue's trigger only while LegacyOrdersApp names an app."""
    worker = real_worker(ROOT, env={"SubmittingApps": "app,partner", "LegacyOrdersApp": legacy})
    assert worker["ok"], worker.get("error")
    queues = {
        f["name"]: b["queueName"]
        for f in worker["functions"]
        for b in f["rawBindings"]
        if b.get("type") == "serviceBusTrigger" and f["name"].startswith("submission")
    }
    assert queues == expected


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], Any]]:
    base = tmp_path_factory.mktemp("devhost-state")
    with ThreadPoolExecutor(max_workers=4) as pool:
        worker = {name: pool.submit(real_worker, CORPUS / name) for name in BROKEN + GOOD}
        started = {name: pool.submit(devhost_start, CORPUS / name, base / name) for name in BROKEN}
        indexed = {name: pool.submit(devhost_index, CORPUS / name) for name in GOOD}
        results: dict[str, tuple[dict[str, Any], Any]] = {}
        for name in BROKEN:
            results[name] = (worker[name].result(), started[name].result())
        for name in GOOD:
            results[name] = (worker[name].result(), indexed[name].result())
        return results


def test_the_corpus_covers_each_refusal_rule() -> None:
    assert len(BROKEN) >= 7 and GOOD


@pytest.mark.parametrize("app", BROKEN)
def test_devhost_refuses_what_the_worker_refuses_with_its_message(corpus: dict[str, Any], app: str) -> None:
    worker, started = corpus[app]
    assert not worker["ok"], f"the real worker loads {app}: the corpus app no longer shows a refusal"
    assert started.returncode == 1, started.stdout + started.stderr
    assert f"devhost: the app cannot be indexed: {worker['error']}\n" in started.stderr
    assert "devhost listening" not in started.stdout


@pytest.mark.parametrize("app", GOOD)
def test_devhost_loads_what_the_worker_loads(corpus: dict[str, Any], app: str) -> None:
    worker, devhost = corpus[app]
    assert worker["ok"], worker.get("error")
    assert sorted(f["name"] for f in worker["functions"]) == sorted(devhost)


def test_a_pep_585_activity_annotation_is_refused_by_the_rule_devhost_applies() -> None:
    """The exact failure the product had (python-worker #1034): `dict[str, Any]` is neither a class nor a typing
    generic to the worker's check, while `typing.Dict[str, Any]` is."""
    from devhost import worker_rules

    assert not worker_rules._is_generic_type(dict[str, Any]) and not isinstance(dict[str, Any], type)
    assert worker_rules._is_generic_type(typing.Dict[str, Any])  # noqa: UP006
