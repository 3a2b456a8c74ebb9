"""Binding extensions as the Functions host loads them: host.json's extension bundle, and the checks at start.

`check_app` refuses, with the host's own messages, an app the real host would not run as written: a function whose
binding types no loaded extension registers (no `extensionBundle`, or a bundle version without them), a bundle
reference the host cannot use, and, for an app with Durable bindings, a storage provider devhost does not emulate or
a task hub name the Azure Storage provider rejects. Sources (azure-functions-host, the extension bundles' git tags,
the Durable extension) and what the host does instead of refusing: docs/modules-host.md, "devhost/extensions.py".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .config import ConfigError, config_text, setting, task_hub_name_error

if TYPE_CHECKING:
    from .app_loader import FunctionSpec
    from .config import DurableOptions, HostConfig

# Bindings the host registers itself (ScriptHostBuilderExtensions: AddHttp, AddTimersWithStorage, AddManualTrigger,
# AddWarmup; FunctionBinding.GetBindings handles "http"), compared ignoring case as the binding providers do.
BUILT_IN = frozenset({"httptrigger", "http", "timertrigger", "manualtrigger", "warmuptrigger"})
DURABLE = frozenset(
    {"orchestrationtrigger", "activitytrigger", "entitytrigger", "durableclient", "orchestrationclient"}
)
SERVICE_BUS = frozenset({"servicebustrigger", "servicebus"})

DEFAULT_BUNDLE = "Microsoft.Azure.Functions.ExtensionBundle"
PREVIEW_BUNDLE = "Microsoft.Azure.Functions.ExtensionBundle.Preview"
EXPERIMENTAL_BUNDLE = "Microsoft.Azure.Functions.ExtensionBundle.Experimental"
# azure-functions-host src/WebJobs.Script/extensionrequirements.json, "bundles".
MINIMUM_BUNDLE_VERSION = {DEFAULT_BUNDLE: "2.6.1"}

# The published versions of each bundle: the release tags of Azure/azure-functions-extension-bundles (up to 4.38.0
# and 4.45.0-Preview, July 2026), as the CDN's index.json lists them to the host.
PUBLISHED = {
    DEFAULT_BUNDLE: (
        "1.0.0 1.1.0 1.1.1 1.2.0 1.3.0 1.3.2 1.3.3 1.5.0 1.5.1 1.8.1 2.0.0 2.0.1 2.2.0 2.4.0 2.6.1 2.8.3 2.8.5 2.10.0 "
        "2.11.0 2.12.1 2.13.0 2.14.0 2.15.0 2.16.0 2.17.0 2.18.0 2.19.0 2.20.0 2.21.0 2.22.0 2.22.2 2.23.0 2.24.0 "
        "2.25.0 2.26.0 2.27.0 2.28.0 2.29.0 2.30.0 2.32.0 2.33.1 2.34.0 2.35.0 2.36.0 3.0.0 3.1.0 3.2.0 3.3.0 3.5.0 "
        "3.7.0 3.9.1 3.10.0 3.11.0 3.12.0 3.13.0 3.14.0 3.15.0 3.16.0 3.17.0 3.18.0 3.19.0 3.20.2 3.21.0 3.23.0 "
        "3.24.0 3.26.0 3.28.0 3.29.0 3.30.2 3.32.0 3.33.0 3.35.0 3.36.0 3.37.0 3.38.0 3.40.0 3.41.0 4.0.2 4.1.0 "
        "4.2.0 4.3.0 4.3.1 4.4.0 4.5.0 4.6.0 4.7.0 4.8.0 4.9.0 4.12.0 4.13.2 4.15.0 4.16.0 4.17.0 4.20.0 4.21.0 "
        "4.21.1 4.22.0 4.23.0 4.23.1 4.24.0 4.24.1 4.24.2 4.25.0 4.25.1 4.26.0 4.26.1 4.26.2 4.26.3 4.27.0 4.27.1 "
        "4.28.0 4.29.0 4.30.0 4.31.0 4.32.0 4.33.0 4.33.1 4.34.0 4.35.0 4.36.0 4.37.0 4.37.1 4.38.0"
    ).split(),
    PREVIEW_BUNDLE: (
        "3.0.0 4.0.0 4.1.0 4.2.0 4.2.1 4.3.1 4.4.0 4.5.0 4.6.0 4.7.0 4.8.0 4.9.0 4.10.0 4.11.0 4.12.0 4.13.0 4.14.0 "
        "4.15.0 4.16.0 4.17.0 4.18.0 4.19.0 4.20.0 4.21.0 4.22.0 4.23.0 4.24.0 4.25.0 4.26.0 4.26.1 4.26.2 4.27.0 "
        "4.28.0 4.29.0 4.30.0 4.31.0 4.32.0 4.33.0 4.34.0 4.35.0 4.36.0 4.37.0 4.38.0 4.39.0 4.40.0 4.41.0 4.42.0 "
        "4.43.0 4.44.0 4.45.0"
    ).split(),
    EXPERIMENTAL_BUNDLE: "4.1.0 4.2.0 4.3.0 4.4.0 4.5.0 4.6.0".split(),
}


@dataclass(frozen=True)
class Content:
    """What a bundle holds from version `since` on (until the next entry): the Durable and Service Bus binding
    types of its extensions.json, and whether it has the Durable Task Scheduler provider (AzureManagedProvider)."""

    since: str
    bindings: frozenset[str]
    scheduler: bool = False


_ALL = DURABLE | SERVICE_BUS
CONTENTS = {
    DEFAULT_BUNDLE: (
        Content("1.0.0", frozenset()),
        Content("1.1.0", frozenset({"orchestrationtrigger", "activitytrigger", "orchestrationclient"}) | SERVICE_BUS),
        Content("2.0.0", _ALL - {"orchestrationclient"}),
        Content("2.0.1", _ALL),
        Content("4.30.0", _ALL, scheduler=True),
    ),
    PREVIEW_BUNDLE: (Content("3.0.0", _ALL), Content("4.28.0", _ALL, scheduler=True)),
    EXPERIMENTAL_BUNDLE: (Content("4.1.0", _ALL, scheduler=True),),
}

# ---- NuGet versions and version ranges (NuGet.Versioning NuGetVersion.TryParse, VersionRange.TryParse) ------------

_RELEASE = re.compile(r"^\d+(\.\d+){0,3}$")
_LABEL = re.compile(r"^[0-9A-Za-z-]+$")
VersionKey = tuple[tuple[int, int, int, int], int, tuple[tuple[int, int | str], ...]]


def version_key(text: str) -> VersionKey | None:
    """A sortable key of a NuGet version (1 to 4 numbers, an optional -prerelease and +metadata), or None when it
    is not one. A release sorts after its prereleases; prerelease labels compare as SemVer 2.0 says."""
    text = text.strip().split("+", 1)[0]
    release, _, pre = text.partition("-")
    if not _RELEASE.match(release) or ("-" in text and not pre):
        return None
    numbers = [int(n) for n in release.split(".")] + [0, 0, 0]
    labels = pre.split(".") if pre else []
    if any(not _LABEL.match(label) for label in labels):
        return None
    ordered = tuple((0, int(x)) if x.isdigit() else (1, x.lower()) for x in labels)
    return (numbers[0], numbers[1], numbers[2], numbers[3]), 0 if labels else 1, ordered


def _float_minimum(text: str) -> VersionKey | None:
    """FloatRange.TryParse's minimum version of a floating version ("*", "4.*", "4.2.*", "1.0.0-*", "1.0.0-beta*",
    "4.*-*"): the version with each '*' read as the lowest value."""
    text = text.strip()
    release, dash, pre = text.partition("-")
    if release == "*" or release.endswith(".*"):
        if dash and pre != "*":
            return None
        release = "0" if release == "*" else release[:-2] + ".0"
        return version_key(f"{release}-0" if dash else release)
    if dash and pre.endswith("*"):
        label = pre[:-1].rstrip(".")
        return version_key(f"{release}-{label or '0'}")
    return None


@dataclass(frozen=True)
class VersionRange:
    text: str
    minimum: VersionKey | None
    include_minimum: bool
    maximum: VersionKey | None
    include_maximum: bool

    def satisfies(self, version: VersionKey) -> bool:
        """VersionRangeBase.Satisfies: within the bounds, each inclusive or not."""
        above = self.minimum is None or version > self.minimum or (version == self.minimum and self.include_minimum)
        below = self.maximum is None or version < self.maximum or (version == self.maximum and self.include_maximum)
        return above and below


def parse_range(text: str) -> VersionRange | None:
    """A NuGet version range as VersionRange.TryParse(value, allowFloating: true) reads it ("4.0.0" is 4.0.0 or
    later; "[a, b)", "(a,]", "[a]"; a floating minimum such as "[4.*, 5.0.0)"), or None where it returns false."""
    value = text.strip()
    if not value:
        return None
    if value == "*":
        return VersionRange(text, version_key("0.0.0"), True, None, True)
    if value[0] in "[(":
        if value[-1] not in "])":
            return None
        include_min, include_max = value[0] == "[", value[-1] == "]"
        parts = value[1:-1].split(",")
        if len(parts) > 2 or all(not p for p in parts) or (len(parts) == 1 and not (include_min and include_max)):
            return None
        low, high = parts[0], parts[-1]
    else:
        include_min, include_max, low, high = True, False, value, ""
    minimum = maximum = None
    if low.strip():
        minimum = _float_minimum(low) if "*" in low else version_key(low)
        if minimum is None:
            return None
    if high.strip():
        maximum = version_key(high)  # the maximum cannot float
        if maximum is None:
            return None
    if minimum is not None and maximum is not None:
        if minimum > maximum or (minimum == maximum and include_min != include_max):
            return None
    return VersionRange(text, minimum, include_min, maximum, include_max)


# ---- the bundle the host would load -------------------------------------------------------------------------


@dataclass(frozen=True)
class ExtensionBundle:
    """host.json `extensionBundle`: the bundle id and its version range (`extension_bundle` reads it)."""

    id: str
    version: VersionRange

    def resolved(self) -> str | None:
        """The version the host loads: the highest published one in the range (ExtensionBundleManager.
        FindBestVersionMatch). A range that only admits versions after this table's newest of a major is taken as
        that later version, with the content of the newest one known."""
        known = PUBLISHED.get(self.id, [])
        matching = [v for v in known if self.version.satisfies(_key(v))]
        if matching:
            return max(matching, key=_key)
        low = self.version.minimum
        same_major = [_key(v) for v in known if low is not None and _key(v)[0][0] == low[0][0]]
        if low is not None and same_major and max(same_major) < low:
            return ".".join(str(n) for n in low[0][:3])
        return None

    def content(self, version: str) -> Content:
        entries = [c for c in CONTENTS.get(self.id, ()) if _key(c.since) <= _key(version)]
        return entries[-1] if entries else Content(version, frozenset())


def _key(version: str) -> VersionKey:
    key = version_key(version)
    assert key is not None, version
    return key


def extension_bundle(config: HostConfig) -> ExtensionBundle | None:
    """host.json `extensionBundle` as ExtensionBundleConfigurationHelper.Configure reads it (azure-functions-host):
    None when the section is absent or empty; a version range NuGet cannot parse, then an id that is not a valid
    NuGet package id, stop the host with its message."""
    section = setting(config.host_json, "extensionBundle")
    if not section or not isinstance(section, (dict, str)):
        return None
    section = section if isinstance(section, dict) else {}
    version = config_text(setting(section, "version"))
    parsed = parse_range(version) if version and version.strip() else None
    if parsed is None:
        raise bundle_config_error("version")
    bundle_id = config_text(setting(section, "id"))
    # NuGet.Packaging PackageIdValidator.IsValidPackageId: ^\w+([.-]\w+)*$ (ignoring case).
    if not bundle_id or not bundle_id.strip() or not re.match(r"^\w+([.-]\w+)*$", bundle_id):
        raise bundle_config_error("id")
    return ExtensionBundle(bundle_id, parsed)


def bundle_config_error(field: str) -> ConfigError:
    """Resources.ExtensionBundleConfigMissingVersion / ...MissingId of the host, as it throws them at start."""
    return ConfigError(
        f"The value of {field} property in extensionBundle section of host.json file is invalid or missing. "
        "See https://aka.ms/functions-hostjson for more information"
    )


# ---- the checks --------------------------------------------------------------------------------------------------


def binding_types(spec: FunctionSpec) -> list[str]:
    """The function's binding types in the order FunctionDescriptorProvider.VerifyResolvedBindings lists them: the
    input (and inout) bindings as the worker sent them, then the output ones, each type once."""
    ordered = [b for b in spec.bindings if str(b.get("direction", "in")).lower() != "out"]
    ordered += [b for b in spec.bindings if str(b.get("direction", "in")).lower() == "out"]
    return list(dict.fromkeys(str(b.get("type")) for b in ordered))


def binding_errors(functions: Iterable[FunctionSpec], bundle: ExtensionBundle | None) -> list[str]:
    """One line per function the host would put in error, with the host's message ("The '<name>' function is in
    error: ..."): without a bundle, or with one of which no version is published, every type but the built-in ones;
    with a bundle, the Durable and Service Bus types its version lacks (devhost hosts no other extension, and skips
    other triggers with a warning)."""
    version = bundle.resolved() if bundle is not None else None
    errors = []
    for spec in functions:
        if bundle is None or version is None:
            missing = [t for t in binding_types(spec) if t.lower() not in BUILT_IN]
        else:
            missing = [t for t in binding_types(spec) if t.lower() in _ALL - bundle.content(version).bindings]
        if missing:
            errors.append(f"The '{spec.name}' function is in error: {_binding_error(', '.join(missing), bundle)}")
    return errors


def _binding_error(types: str, bundle: ExtensionBundle | None) -> str:
    # FunctionDescriptorProvider.CreateBindingError: the first message has no final period in the host's source.
    if bundle is not None:
        return (
            f"The binding type(s) '{types}' were not found in the configured extension bundle. Please ensure the "
            "type is correct and the correct version of extension bundle is configured"
        )
    return (
        f"The binding type(s) '{types}' are not registered. Please ensure the type is correct and the binding "
        "extension is installed."
    )


class BindingsNotRegistered(ConfigError):
    """Functions the host would put in error; devhost refuses the app instead of starting without them."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = list(errors)
        super().__init__(
            "the Functions host would not load these functions (it starts without them; devhost refuses the app):\n"
            + "\n".join(self.errors)
        )


def check_bundle(bundle: ExtensionBundle) -> None:
    """What makes the host itself fail to start: no published version in the range, or, for the default bundle, a
    version below the host's minimum (ScriptStartupTypeLocator.ValidateBundleRequirements)."""
    version = bundle.resolved()
    minimum = MINIMUM_BUNDLE_VERSION.get(bundle.id)
    if version is None and minimum is not None:
        # ExtensionBundleManager logs MatchingBundleNotFound, then ValidateBundleRequirements fails the start on the
        # missing version; for another bundle the host starts with no extension (binding_errors).
        raise ConfigError(
            f"Bundle version matching the {bundle.version.text} was not found: no published version of {bundle.id} "
            "is in that range, and the host does not start"
        )
    if version is not None and minimum is not None and _key(version) < _key(minimum):
        raise ConfigError(
            f"Referenced bundle {bundle.id} of version {version} does not meet the required minimum version of "
            f"{minimum}. Update your extension bundle reference in host.json to reference {minimum} or later. "
            "For more information see https://aka.ms/func-min-bundle-versions."
        )


def uses_durable(functions: Iterable[FunctionSpec]) -> bool:
    """Whether the host would load the Durable extension (a function uses one of its binding types)."""
    return any(t.lower() in DURABLE for spec in functions for t in binding_types(spec))


def check_app(config: HostConfig, functions: Sequence[FunctionSpec]) -> None:
    """Refuse (ConfigError) what the real host would not run: see the module docstring."""
    bundle = extension_bundle(config)
    if bundle is not None:
        check_bundle(bundle)
    errors = binding_errors(functions, bundle)
    if errors:
        raise BindingsNotRegistered(errors)
    if uses_durable(functions):
        check_durable_backend(config, bundle)


SCHEDULER_CONNECTION = "DURABLE_TASK_SCHEDULER_CONNECTION_STRING"
_TYPE_PATH = "extensions.durableTask.storageProvider.type"


def check_durable_backend(config: HostConfig, bundle: ExtensionBundle | None) -> None:
    """The storage provider devhost emulates is Azure Storage; the task hub name as that provider checks it."""
    options = config.durable_options()
    kind = options.storage_type
    if kind.lower() == "azuremanaged":
        raise ConfigError(scheduler_refusal(config, options, bundle))
    if kind.lower() != "azurestorage":
        raise ConfigError(
            f"Storage provider type ({kind}) is not one devhost emulates: it runs the Azure Storage provider only "
            f"(host.json {_TYPE_PATH})"
        )
    error = None if options.hub_name_is_default else task_hub_name_error(options.hub_name)
    if error is not None:
        raise ConfigError(error)
    slot = config.settings.get("WEBSITE_SLOT_NAME")
    if options.hub_name_is_default and slot is not None and slot.lower() != "production":
        # DurableTaskOptions.Validate with IsInNonProductionSlot (the message as the extension concatenates it).
        raise ConfigError(
            "Task Hub name must be specified in host.json when using slots. Specified name must not equal the "
            f"default HubName ({options.hub_name}).See documentation on Task Hubs for information on how to set "
            "this: https://docs.microsoft.com/azure/azure-functions/durable/durable-functions-task-hubs"
        )


def scheduler_refusal(config: HostConfig, options: DurableOptions, bundle: ExtensionBundle | None) -> str:
    """Why devhost does not run an app configured for the Durable Task Scheduler, naming what it recognised: where
    the type comes from, the task hub, the connection setting (connectionName, else connectionStringName, else
    DURABLE_TASK_SCHEDULER_CONNECTION_STRING, as the provider reads them) and its endpoint."""
    provider: Mapping[str, Any] = options.storage_provider
    keys = ("connectionName", "connectionStringName")
    name = next((str(provider[k]) for k in keys if str(provider.get(k) or "").strip()), SCHEDULER_CONNECTION)
    connection = config.settings.get(name)
    fields = {k.strip().lower(): v for k, _, v in (p.partition("=") for p in (connection or "").split(";")) if v}
    endpoint = f"endpoint {fields['endpoint']}" if "endpoint" in fields else "no endpoint" if connection else "unset"
    source = next(
        (
            f"app setting AzureFunctionsJobHost__{p.replace('.', '__')}"
            for p in config.overrides
            if p.lower() == _TYPE_PATH.lower()
        ),
        "host.json",
    )
    version = bundle.resolved() if bundle is not None else None
    has_provider = bundle is not None and version is not None and bundle.content(version).scheduler
    note = "" if has_provider else "; the extension bundle has no Durable Task Scheduler provider either"
    return (
        f"{_TYPE_PATH} is '{options.storage_type}' ({source}): the Durable Task Scheduler, task hub "
        f"'{options.hub_name}', connection {name} ({endpoint}){note}. devhost emulates the Azure Storage provider "
        "only and does not run this app as if it used Azure Storage: run it without that setting, or run "
        "`func start` against the scheduler or its emulator"
    )
