"""Host rules: devhost refuses, with the real host's message, an app the Functions host would not run as written.

Conformance sources (read in their repositories; file and function named at each test):
- azure-functions-host (v4, src/WebJobs.Script): Description/FunctionDescriptorProvider.cs `VerifyResolvedBindings`
  and `CreateBindingError`; Host/ScriptHost.cs `GetFunctionDescriptorsAsync` (a function whose bindings do not
  resolve is put in error, the host starts without it); ScriptHostBuilderExtensions.cs (AddHttp, AddTimersWithStorage,
  AddManualTrigger, AddWarmup: the bindings that need no bundle); Config/ExtensionBundleConfigurationHelper.cs;
  ExtensionBundle/ExtensionBundleManager.cs `FindBestVersionMatch`; DependencyInjection/ScriptStartupTypeLocator.cs
  `ValidateBundleRequirements` with extensionrequirements.json.
- Azure/azure-functions-extension-bundles: each release tag's src/Microsoft.Azure.Functions.ExtensionBundle/
  extensions.json (which binding types a bundle version registers).
- Azure/azure-functions-durable-extension v3.x: Options/AzureStorageOptions.cs `ValidateHubName`,
  `IsSanitizedHubName`; Storage/NameValidator.cs; Options/DurableTaskOptions.cs `HubName`, `ResolveAppSettingOptions`
  (WebJobs NameResolverExtensions.TryResolveWholeString); DurableTaskExtension.cs `GetDurabilityProviderFactory`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import azure.durable_functions as df
import azure.functions as func
import pytest
from support.bicep_tree import Opaque, Scope, app, evaluate, main, module_scope, object_items, string_parts, text

from devhost.app_loader import FunctionSpec, index
from devhost.config import ConfigError, HostConfig, sanitized_hub_name, task_hub_name_error
from devhost.extensions import BindingsNotRegistered, ExtensionBundle, check_app, parse_range
from lab.system import ROOT

QUICKSTART = Path(__file__).resolve().parent / "apps" / "durable_quickstart"
BUNDLE_V4 = {"id": "Microsoft.Azure.Functions.ExtensionBundle", "version": "[4.*, 5.0.0)"}
NOT_REGISTERED = (
    "The binding type(s) '{}' are not registered. Please ensure the type is correct and the binding extension is "
    "installed."
)
NOT_IN_BUNDLE = (
    "The binding type(s) '{}' were not found in the configured extension bundle. Please ensure the type is correct "
    "and the correct version of extension bundle is configured"
)
HUB_ERROR = (
    "Task hub name '{}' should contain only alphanumeric characters, start with a letter, and have length between "
    "3 and 45."
)


# ---- apps, built with the real SDK decorators -------------------------------------------------------------------


def durable_app() -> list[FunctionSpec]:
    """An HTTP starter with a durable client, an orchestrator, an activity and a Service Bus trigger."""
    bp = df.DFApp(http_auth_level=func.AuthLevel.ANONYMOUS)

    @bp.route(route="start")
    @bp.durable_client_input(client_name="client")
    async def starter(req: func.HttpRequest, client: Any) -> func.HttpResponse:
        return func.HttpResponse("")

    @bp.orchestration_trigger(context_name="context")
    def flow(context: df.DurableOrchestrationContext) -> Any:
        yield context.call_activity("step", None)

    @bp.activity_trigger(input_name="value")
    def step(value: str) -> str:
        return value

    @bp.service_bus_queue_trigger(arg_name="message", queue_name="q", connection="ServiceBusConnection")
    @bp.service_bus_topic_output(arg_name="out", topic_name="t", connection="ServiceBusConnection")
    def relay(message: func.ServiceBusMessage, out: func.Out[str]) -> None:
        pass

    return index(bp)


def plain_app() -> list[FunctionSpec]:
    """HTTP and timer functions only."""
    fa = func.FunctionApp()

    @fa.route(route="ping")
    def ping(req: func.HttpRequest) -> func.HttpResponse:
        return func.HttpResponse("pong")

    @fa.timer_trigger(arg_name="timer", schedule="0 */5 * * * *")
    def tick(timer: func.TimerRequest) -> None:
        pass

    return index(fa)


def config(tmp_path: Path, host_json: dict[str, Any], settings: dict[str, str] | None = None) -> HostConfig:
    (tmp_path / "host.json").write_text(json.dumps({"version": "2.0", **host_json}))
    return HostConfig.load(tmp_path, environ=settings or {})


def refusal(cfg: HostConfig, functions: list[FunctionSpec]) -> str:
    with pytest.raises(ConfigError) as caught:
        check_app(cfg, functions)
    return str(caught.value)


# ---- 1. bindings without an extension bundle ---------------------------------------------------------------------


def test_without_a_bundle_every_durable_and_service_bus_function_is_in_error_with_the_hosts_message(
    tmp_path: Path,
) -> None:
    # FunctionDescriptorProvider.VerifyResolvedBindings: the function's input then output binding types, each once,
    # minus those a provider resolved, joined with ", "; CreateBindingError without a bundle.
    with pytest.raises(BindingsNotRegistered) as caught:
        check_app(config(tmp_path, {}), durable_app())
    assert caught.value.errors == [
        "The 'starter' function is in error: " + NOT_REGISTERED.format("durableClient"),
        "The 'flow' function is in error: " + NOT_REGISTERED.format("orchestrationTrigger"),
        "The 'step' function is in error: " + NOT_REGISTERED.format("activityTrigger"),
        "The 'relay' function is in error: " + NOT_REGISTERED.format("serviceBusTrigger, serviceBus"),
    ]


def test_http_and_timer_need_no_bundle(tmp_path: Path) -> None:
    # Built into the host: httpTrigger / http (WebJobsCoreScriptBindingProvider, FunctionBinding.GetBindings) and
    # timerTrigger (CoreExtensionsScriptBindingProvider).
    check_app(config(tmp_path, {}), plain_app())


def test_with_a_v4_bundle_the_same_app_is_accepted(tmp_path: Path) -> None:
    # Bundle 4.x (extensions.json of every 4.x tag): DurableTask and ServiceBus register all these types.
    check_app(config(tmp_path, {"extensionBundle": BUNDLE_V4}), durable_app())


def test_an_empty_extension_bundle_section_is_no_bundle(tmp_path: Path) -> None:
    # The section "exists" only with a value or children (.NET IConfigurationSection.Exists).
    with pytest.raises(BindingsNotRegistered):
        check_app(config(tmp_path, {"extensionBundle": {}}), durable_app())


# ---- 2. the bundle reference ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "resolved"),
    [
        ("[4.*, 5.0.0)", "4.38.0"),  # the newest published 4.x (FindBestVersionMatch takes the highest)
        ("[4.32.0, 5.0.0)", "4.38.0"),
        ("[3.3.0, 4.0.0)", "3.41.0"),
        ("[2.*, 3.0.0)", "2.36.0"),
        ("4.0.2", "4.38.0"),  # a bare version is a minimum
        ("[4.26.2]", "4.26.2"),
        ("(4.37.1, 4.38.0)", None),  # nothing published strictly between
        ("[4.39.0, 5.0.0)", "4.39.0"),  # after this table's newest 4.x: taken as published, with 4.38.0's content
        ("[5.0.0, 6.0.0)", None),
    ],
)
def test_the_bundle_version_is_the_highest_published_one_in_the_range(version: str, resolved: str | None) -> None:
    parsed = parse_range(version)
    assert parsed is not None
    assert ExtensionBundle("Microsoft.Azure.Functions.ExtensionBundle", parsed).resolved() == resolved


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("[4.*, 5.0.0)", True),
        ("[4.0.0,5.0.0)", True),
        ("*", True),
        ("4.*", True),
        ("[1.0]", True),
        ("(,2.0]", True),
        ("(1.0,)", True),
        ("[1.0.0)", False),  # one bound needs [ ]: VersionRangeFactory.TryParse
        ("(1.0.0)", False),
        ("[,]", False),
        ("[5.0.0, 4.0.0)", False),  # minimum above maximum
        ("[1.0.0, 1.0.0)", False),
        ("[4.0.0, 5.*)", False),  # the maximum cannot float
        ("[4.0.0, 5.0.0, 6.0.0)", False),
        ("four", False),
        ("", False),
    ],
)
def test_version_ranges_parse_as_nuget_parses_them(text: str, valid: bool) -> None:
    assert (parse_range(text) is not None) is valid


@pytest.mark.parametrize(
    ("bundle", "message"),
    [
        (
            {"id": "Microsoft.Azure.Functions.ExtensionBundle"},
            "The value of version property in extensionBundle section of host.json file is invalid or missing. "
            "See https://aka.ms/functions-hostjson for more information",
        ),
        (
            {"id": "Microsoft.Azure.Functions.ExtensionBundle", "version": "[4.0, latest)"},
            "The value of version property in extensionBundle section of host.json file is invalid or missing. "
            "See https://aka.ms/functions-hostjson for more information",
        ),
        (
            {"id": "Extension Bundle", "version": "[4.*, 5.0.0)"},  # PackageIdValidator: ^\w+([.-]\w+)*$
            "The value of id property in extensionBundle section of host.json file is invalid or missing. "
            "See https://aka.ms/functions-hostjson for more information",
        ),
        (
            {"id": "Microsoft.Azure.Functions.ExtensionBundle", "version": "[1.*, 2.0.0)"},
            "Referenced bundle Microsoft.Azure.Functions.ExtensionBundle of version 1.8.1 does not meet the "
            "required minimum version of 2.6.1. Update your extension bundle reference in host.json to reference "
            "2.6.1 or later. For more information see https://aka.ms/func-min-bundle-versions.",
        ),
    ],
)
def test_a_bundle_reference_the_host_cannot_use_stops_it_with_its_message(
    tmp_path: Path, bundle: dict[str, str], message: str
) -> None:
    # ExtensionBundleConfigurationHelper.Configure (version first, then id); ScriptStartupTypeLocator.
    # ValidateBundleRequirements with extensionrequirements.json (Microsoft.Azure.Functions.ExtensionBundle >= 2.6.1).
    assert refusal(config(tmp_path, {"extensionBundle": bundle}), plain_app()) == message


def test_a_range_with_no_published_version_is_refused(tmp_path: Path) -> None:
    # Default bundle: MatchingBundleNotFound, then ValidateBundleRequirements fails on the missing version.
    bundle = {"id": "Microsoft.Azure.Functions.ExtensionBundle", "version": "[5.0.0, 6.0.0)"}
    assert refusal(config(tmp_path, {"extensionBundle": bundle}), plain_app()).startswith(
        "Bundle version matching the [5.0.0, 6.0.0) was not found"
    )
    # Another bundle id: the host starts without extensions; the functions that need one are in error.
    preview = {"id": "Microsoft.Azure.Functions.ExtensionBundle.Preview", "version": "[9.0.0, 10.0.0)"}
    with pytest.raises(BindingsNotRegistered) as caught:
        check_app(config(tmp_path, {"extensionBundle": preview}), durable_app())
    assert caught.value.errors[1] == "The 'flow' function is in error: " + NOT_IN_BUNDLE.format("orchestrationTrigger")


# ---- 3. the task hub name (Azure Storage provider) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("orderflow", True),
        ("SampleHub", True),
        ("abc", True),
        ("a" * 50, True),  # the check allows 50, though its message says 45
        ("a" * 51, False),
        ("ab", False),
        ("1hub", False),  # a table name starts with a letter
        ("my-hub", False),  # a table name has no hyphen
        ("my_hub", False),
        ("hub name", False),
        ("", False),
        ("%TaskHubName%", False),
    ],
)
def test_task_hub_names_as_the_azure_storage_provider_checks_them(name: str, valid: bool) -> None:
    # AzureStorageOptions.ValidateHubName: NameValidator blob, container (lower-cased), table, queue names; <= 50.
    assert task_hub_name_error(name) == (None if valid else HUB_ERROR.format(name))


def test_an_invalid_hub_name_stops_the_host_with_the_extensions_message(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"extensionBundle": BUNDLE_V4, "extensions": {"durableTask": {"hubName": "my-hub"}}})
    assert refusal(cfg, durable_app()) == HUB_ERROR.format("my-hub")


def test_the_hub_name_from_an_app_setting_is_checked_once_resolved(tmp_path: Path) -> None:
    # DurableTaskOptions.ResolveAppSettingOptions: TryResolveWholeString from the app settings (names ignoring case).
    host_json = {"extensionBundle": BUNDLE_V4, "extensions": {"durableTask": {"hubName": "%MyTaskHub%"}}}
    check_app(config(tmp_path, host_json, {"mytaskhub": "ordersHub"}), durable_app())
    assert config(tmp_path, host_json, {"MyTaskHub": "ordersHub"}).durable_options().hub_name == "ordersHub"
    assert refusal(config(tmp_path, host_json, {"MyTaskHub": "orders-hub"}), durable_app()) == HUB_ERROR.format(
        "orders-hub"
    )
    # Not set: TryResolveWholeString fails and the name stays as written, which the provider refuses.
    assert refusal(config(tmp_path, host_json, {}), durable_app()) == HUB_ERROR.format("%MyTaskHub%")
    # Every `%Name%` in the text is resolved, or none: one missing setting leaves the whole text as written.
    joined = {"extensions": {"durableTask": {"hubName": "orders%Env%%Region%"}}}
    assert config(tmp_path, joined, {"Env": "Prod", "Region": "Eu"}).durable_options().hub_name == "ordersProdEu"
    assert config(tmp_path, joined, {"Env": "Prod"}).durable_options().hub_name == "orders%Env%%Region%"


def test_an_app_without_durable_bindings_is_not_checked_for_its_hub_name(tmp_path: Path) -> None:
    # The Durable extension (and its provider's check) loads only for an app that uses its bindings.
    cfg = config(tmp_path, {"extensionBundle": BUNDLE_V4, "extensions": {"durableTask": {"hubName": "my-hub"}}})
    check_app(cfg, plain_app())


@pytest.mark.parametrize(
    ("site", "hub"),
    [
        (None, "TestHubName"),  # DurableTaskOptions.DefaultHubName
        ("orderflow-func-x7k2", "orderflowfuncx7k2"),  # WEBSITE_SITE_NAME, letters and digits kept
        ("7orders", "t7orders"),
        ("ab", "abHub"),
        ("--", "DefaultTaskHub"),
        ("a" * 60, "a" * 45),
    ],
)
def test_the_default_hub_name_is_the_site_name_sanitized_never_refused(
    tmp_path: Path, site: str | None, hub: str
) -> None:
    # AzureStorageDurabilityProviderFactory.EnsureDefaultClientSettingsInitialized: a default name is sanitized
    # (AzureStorageOptions.IsSanitizedHubName), an explicit one validated.
    settings = {} if site is None else {"WEBSITE_SITE_NAME": site}
    cfg = config(tmp_path, {"extensionBundle": BUNDLE_V4}, settings)
    assert cfg.durable_options().hub_name == hub == sanitized_hub_name(site or "TestHubName")
    check_app(cfg, durable_app())


def test_a_default_hub_name_in_a_deployment_slot_is_refused(tmp_path: Path) -> None:
    # DurableTaskOptions.Validate: IsInNonProductionSlot (WEBSITE_SLOT_NAME set, not "Production") and the default name.
    bundle = {"extensionBundle": BUNDLE_V4}
    assert refusal(config(tmp_path, bundle, {"WEBSITE_SLOT_NAME": "staging"}), durable_app()).startswith(
        "Task Hub name must be specified in host.json when using slots. Specified name must not equal the default "
        "HubName (TestHubName).See documentation"
    )
    check_app(config(tmp_path, bundle, {"WEBSITE_SLOT_NAME": "production"}), durable_app())
    named = {**bundle, "extensions": {"durableTask": {"hubName": "stagingHub"}}}
    check_app(config(tmp_path, named, {"WEBSITE_SLOT_NAME": "staging"}), durable_app())


# ---- 4. the storage provider: Azure Storage only; the Durable Task Scheduler is refused ------------------------


def test_an_unknown_storage_provider_is_refused(tmp_path: Path) -> None:
    provider = {"type": "netherite"}
    cfg = config(tmp_path, {"extensionBundle": BUNDLE_V4, "extensions": {"durableTask": {"storageProvider": provider}}})
    assert refusal(cfg, durable_app()).startswith("Storage provider type (netherite) is not one devhost emulates")
    # "type" is a key of a plain dictionary (DurableTaskOptions.StorageProvider): "Type" selects nothing.
    provider = {"Type": "netherite"}
    cfg = config(tmp_path, {"extensionBundle": BUNDLE_V4, "extensions": {"durableTask": {"storageProvider": provider}}})
    assert cfg.durable_options().storage_type == "AzureStorage"


_STAND_INS = {
    "durableTaskSchedulerEndpoint": "https://dts-orderflow.westeurope.durabletask.io",
    "identityClientId": "00000000-0000-0000-0000-0000000000a1",
}


def _stand_in(interpolation: Any) -> str:
    return _STAND_INS[text(interpolation).removeprefix("${").removesuffix("}")]


def scheduler_settings() -> dict[str, str]:
    """The app settings infra/app/function.bicep gives the function app when durableBackend is
    DurableTaskScheduler (durableTaskSchedulerSettings, its non-empty branch), deployment-time values stood in for,
    plus the hub name setting host.json names."""
    function = app("function.bicep")
    branch = function.variables["durableTaskSchedulerSettings"].named_children[1]
    assert branch.type == "object", "the DTS settings are the true branch of `useDurableTaskScheduler ? {...} : {}`"
    scope = module_scope(Scope(main()), main().module("functionApp"))
    settings = {}
    for key, node in object_items(branch):
        value = string_parts(node, _stand_in) if node.type == "string" else None
        settings[key] = value if value is not None else str(evaluate(node, scope))
    hub = evaluate(dict(object_items(function.variables["hostSettings"]))["TaskHubName"], scope)
    assert not isinstance(hub, Opaque)
    return {**settings, "TaskHubName": str(hub)}


def test_the_scheduler_settings_infra_deploys_are_recognised_and_refused(tmp_path: Path) -> None:
    settings = scheduler_settings()
    assert settings["AzureFunctionsJobHost__extensions__durableTask__storageProvider__type"] == "azureManaged"
    cfg = HostConfig.load(ROOT, environ=settings)  # the product's host.json with the deployed overrides
    options = cfg.durable_options()
    assert options.storage_type == "azureManaged"
    assert options.storage_provider["connectionStringName"] == "DURABLE_TASK_SCHEDULER_CONNECTION_STRING"
    assert options.hub_name == "orderflow" and not options.hub_name_is_default
    message = refusal(cfg, durable_app())
    assert message.startswith(
        "extensions.durableTask.storageProvider.type is 'azureManaged' (app setting "
        "AzureFunctionsJobHost__extensions__durableTask__storageProvider__type): the Durable Task Scheduler, task "
        "hub 'orderflow', connection DURABLE_TASK_SCHEDULER_CONNECTION_STRING (endpoint "
        "https://dts-orderflow.westeurope.durabletask.io)."
    ), message
    assert "devhost emulates the Azure Storage provider only" in message


def test_scheduler_settings_in_host_json_are_refused_too(tmp_path: Path) -> None:
    # The documented host.json (learn.microsoft.com, Durable Task Scheduler quickstart), the emulator's connection.
    provider = {"type": "azureManaged", "connectionStringName": "DURABLE_TASK_SCHEDULER_CONNECTION_STRING"}
    host_json = {
        "extensionBundle": {"id": "Microsoft.Azure.Functions.ExtensionBundle", "version": "[4.29.0, 4.30.0)"},
        "extensions": {"durableTask": {"hubName": "%TASKHUB_NAME%", "storageProvider": provider}},
    }
    local = {
        "DURABLE_TASK_SCHEDULER_CONNECTION_STRING": "Endpoint=http://localhost:8080;Authentication=None",
        "TASKHUB_NAME": "default",
    }
    message = refusal(config(tmp_path, host_json, local), durable_app())
    assert message.startswith(
        "extensions.durableTask.storageProvider.type is 'azureManaged' (host.json): the Durable Task Scheduler, "
        "task hub 'default', connection DURABLE_TASK_SCHEDULER_CONNECTION_STRING (endpoint http://localhost:8080); "
        "the extension bundle has no Durable Task Scheduler provider either."  # 4.29.0 lacks AzureManagedProvider
    ), message


# ---- 5. devhost start -----------------------------------------------------------------------------------------


def _start(app_dir: Path, state: Path) -> tuple[int | None, str, str]:
    """`python -m devhost start`; stopped as soon as it says it serves (returncode None then)."""
    args = [sys.executable, "-m", "devhost", "start", "--app-dir", str(app_dir), "--port", "0"]
    args += ["--state-dir", str(state)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    state.mkdir(parents=True)
    with (
        (state / "stderr").open("w+") as err,
        subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True) as proc,
    ):
        assert proc.stdout is not None
        out, served = [], False
        for line in proc.stdout:
            out.append(line)
            if line.startswith("devhost listening"):
                served = True
                proc.terminate()
                break
        code = proc.wait(timeout=60)
        err.seek(0)
        return (None if served else code), "".join(out), err.read()


def test_devhost_start_refuses_the_quickstart_without_a_bundle_and_runs_it_with_one(tmp_path: Path) -> None:
    """Acceptance: an app that no one here wrote the shape of (Microsoft's Python Durable quickstart), with Durable
    triggers and no extensionBundle, is refused by `devhost start` with the host's message; with the bundle
    `func init` writes, the same app starts."""
    assert "extensionBundle" not in json.loads((QUICKSTART / "host.json").read_text())
    code, out, err = _start(QUICKSTART, tmp_path / "refused")
    assert code == 1 and "devhost listening" not in out
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-4:] == [
        "devhost: the Functions host would not load these functions (it starts without them; devhost refuses the app):",
        "The 'http_start' function is in error: " + NOT_REGISTERED.format("durableClient"),
        "The 'greetings' function is in error: " + NOT_REGISTERED.format("orchestrationTrigger"),
        "The 'greet' function is in error: " + NOT_REGISTERED.format("activityTrigger"),
    ]
    with_bundle = tmp_path / "app"
    shutil.copytree(QUICKSTART, with_bundle)
    host_json = json.loads((with_bundle / "host.json").read_text())
    (with_bundle / "host.json").write_text(json.dumps({**host_json, "extensionBundle": BUNDLE_V4}))
    code, out, err = _start(with_bundle, tmp_path / "served")
    assert code is None, err
    assert "greetings: orchestrationTrigger" in out


_PRODUCT_CHECK = """
import json, os, sys
from pathlib import Path
from devhost.app_loader import index, load_app
from devhost.config import ConfigError, HostConfig
from devhost.extensions import check_app
root = Path(sys.argv[1])
values = json.loads((root / "local.settings.sample.json").read_text())["Values"]
os.environ.update(values)
specs = index(load_app(root))
verdicts = {}
for name, extra in (("sample", {}), ("scheduler", json.loads(sys.argv[2]))):
    try:
        check_app(HostConfig.load(root, environ={**values, **extra}), specs)
        verdicts[name] = None
    except ConfigError as exc:
        verdicts[name] = str(exc)
print(json.dumps(verdicts))
"""


def test_the_product_starts_with_its_host_json_and_sample_settings_and_not_with_the_scheduler_settings() -> None:
    # In a child process: importing the product's function_app here would replace the test session's module.
    done = subprocess.run(
        [sys.executable, "-c", _PRODUCT_CHECK, str(ROOT), json.dumps(scheduler_settings())],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    verdicts = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdicts["sample"] is None
    assert verdicts["scheduler"].startswith("extensions.durableTask.storageProvider.type is 'azureManaged'")


def test_the_lab_gives_devhost_the_settings_host_json_names() -> None:
    # The demo, the drills and the end-to-end tests run the product without local.settings.json: its hub name
    # setting comes from the sample, as Bicep's TaskHubName does on Azure, or devhost refuses "%TaskHubName%".
    from lab.system import host_json_settings

    assert host_json_settings() == {"TaskHubName": "orderflow"}
    cfg = HostConfig.load(ROOT, environ=host_json_settings())
    assert cfg.durable_options().hub_name == "orderflow"
