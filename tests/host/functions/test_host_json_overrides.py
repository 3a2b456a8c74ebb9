"""host.json values overridden by app settings, as the Functions host does it.

Source: learn.microsoft.com/azure/azure-functions/functions-host-json, "Override host.json values": "When the runtime
finds an application setting in the format `AzureFunctionsJobHost__path__to__setting`, it overrides the equivalent
host.json setting located at `path.to.setting` in the JSON. When expressed as an application setting, the dot (.)
used to indicate JSON hierarchy is replaced by a double underscore (__)"; locally the app settings are
local.settings.json Values (functions-app-settings: "__" is the hierarchy delimiter on Windows and Linux). The host's
configuration is .NET's: keys compare case-insensitively, the environment provider wins over host.json, a value is
text. The Durable maintainers' answer for taking `defaultVersion` from configuration is exactly this setting,
`AzureFunctionsJobHost__extensions__durableTask__defaultVersion` (Azure/azure-functions-durable-extension #3279).
"""

from __future__ import annotations

import json
import sqlite3
import urllib.request
from collections.abc import Callable
from pathlib import Path

from azure.durable_functions.models.history import HistoryEventType as T
from support.hosted import HostedSample, wait_until

from devhost.config import HostConfig, apply_host_json_overrides
from devhost.durable import versioning_policy
from lab.system import ROOT
from orderflow.workflow import WORKFLOW_VERSION

DEFAULT_VERSION = "AzureFunctionsJobHost__extensions__durableTask__defaultVersion"


def _app(tmp_path: Path, host_json: dict, values: dict[str, str] | None = None) -> Path:  # type: ignore[type-arg]
    app_dir = tmp_path / "app"
    app_dir.mkdir(exist_ok=True)
    (app_dir / "host.json").write_text(json.dumps(host_json))
    if values is not None:
        (app_dir / "local.settings.json").write_text(json.dumps({"IsEncrypted": False, "Values": values}))
    return app_dir


def test_the_app_setting_overrides_the_repos_default_version() -> None:
    # The upgrade drill runs the product's host.json (WORKFLOW_VERSION) as version "1.0" this way.
    assert HostConfig.load(ROOT, environ={}).durable_options().default_version == WORKFLOW_VERSION
    config = HostConfig.load(ROOT, environ={DEFAULT_VERSION: "1.0"})
    assert config.durable_options().default_version == "1.0"
    assert versioning_policy(config.durable_options()).version_for_new_instance(None) == "1.0"
    assert config.overrides == {"extensions.durableTask.defaultVersion": "1.0"}
    # The file is untouched: the override lives in the loaded configuration only.
    durable = json.loads((ROOT / "host.json").read_text())["extensions"]["durableTask"]
    assert durable["defaultVersion"] == WORKFLOW_VERSION


def test_keys_compare_case_insensitively_and_keep_host_jsons_spelling(tmp_path: Path) -> None:
    app_dir = _app(tmp_path, {"extensions": {"durableTask": {"defaultVersion": "2.0", "hubName": "Hub"}}})
    config = HostConfig.load(app_dir, environ={"azurefunctionsjobhost__EXTENSIONS__durabletask__DEFAULTVERSION": "1.5"})
    assert config.host_json == {"extensions": {"durableTask": {"defaultVersion": "1.5", "hubName": "Hub"}}}
    assert config.durable_options().default_version == "1.5"


def test_a_key_host_json_lacks_is_added_as_text_and_bound_as_the_option_reads_it(tmp_path: Path) -> None:
    app_dir = _app(tmp_path, {"version": "2.0"})
    config = HostConfig.load(
        app_dir,
        environ={
            DEFAULT_VERSION: "3.0",
            "AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentCalls": "3",
            "AzureFunctionsJobHost__extensions__serviceBus__sessionIdleTimeout": "00:00:05",
            "AzureFunctionsJobHost__extensions__durableTask__versionMatchStrategy": "strict",
        },
    )
    assert config.durable_options().default_version == "3.0"
    assert config.durable_options().version_match_strategy == "Strict"
    options = config.service_bus_options()
    assert options.max_concurrent_calls == 3 and options.session_idle_timeout_s == 5.0


def test_local_settings_values_override_and_the_environment_wins_over_them(tmp_path: Path) -> None:
    host_json = {"extensions": {"durableTask": {"defaultVersion": "2.0"}}}
    app_dir = _app(tmp_path, host_json, values={DEFAULT_VERSION: "1.0"})
    assert HostConfig.load(app_dir, environ={}).durable_options().default_version == "1.0"
    assert HostConfig.load(app_dir, environ={DEFAULT_VERSION: "4.0"}).durable_options().default_version == "4.0"
    # An empty setting is a value (""), as the environment provider keeps it, not a removal.
    assert HostConfig.load(app_dir, environ={DEFAULT_VERSION: ""}).durable_options().default_version == ""


def test_other_settings_and_settings_naming_an_object_change_nothing() -> None:
    host_json = {"extensions": {"durableTask": {"defaultVersion": "2.0"}}, "functions": ["a", "b"]}
    result, applied = apply_host_json_overrides(
        host_json,
        {
            "extensions__durableTask__defaultVersion": "9.0",  # no prefix
            "AzureFunctionsJobHost__extensions": "x",  # an object: the binder binds its children
            "AzureFunctionsJobHost__extensions____defaultVersion": "x",  # an empty segment
            "AzureFunctionsJobHost__functions__1": "c",  # a list element by its index
        },
    )
    assert result == {"extensions": {"durableTask": {"defaultVersion": "2.0"}}, "functions": ["a", "c"]}
    assert applied == {"functions.1": "c"}
    assert host_json["functions"] == ["a", "b"]  # the input is not changed


def _started_version(state_dir: Path, instance_id: str) -> str | None:
    with sqlite3.connect(state_dir / "durable.db") as db:
        rows = db.execute("SELECT event FROM history WHERE instance_id = ? ORDER BY seq", (instance_id,)).fetchall()
    started = next(json.loads(e) for (e,) in rows if json.loads(e)["EventType"] == T.EXECUTION_STARTED)
    return started.get("Version")  # type: ignore[no-any-return]


def test_a_real_devhost_starts_instances_with_the_overridden_default_version(
    make_host: Callable[..., HostedSample],
) -> None:
    # tests/host/sample_host_app's host.json has no defaultVersion: the app setting alone gives its instances "7.0".
    host = make_host(**{DEFAULT_VERSION: "7.0"}).start()
    request = urllib.request.Request(
        f"{host.url}/api/orchestrators/slow_chain/override-1?code={host.function_key()}", data=b"0.01", method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        status_uri = json.loads(response.read())["statusQueryGetUri"]

    def completed() -> bool:
        with urllib.request.urlopen(status_uri, timeout=10) as r:
            return bool(json.loads(r.read())["runtimeStatus"] == "Completed")

    wait_until(completed, 30, "the instance to complete")
    assert _started_version(host.tmp / "state", "override-1") == "7.0"
