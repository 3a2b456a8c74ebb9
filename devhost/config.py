"""Host configuration: host.json, local.settings.json and `%Setting%` binding expressions, as `func start` reads
them."""

from __future__ import annotations

import json
import os
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_EXPRESSION = re.compile(r"%([^%]+)%")


class ConfigError(Exception):
    """A configuration problem the user must fix (bad JSON, unknown setting in a binding expression)."""


@dataclass
class HostConfig:
    app_dir: Path
    host_json: dict[str, Any] = field(default_factory=dict)
    values: dict[str, str] = field(default_factory=dict)
    # The host.json values app settings replaced (`AzureFunctionsJobHost__path__to__key`): dotted path -> value.
    overrides: dict[str, str] = field(default_factory=dict)
    # The app settings as the host resolves `%Name%` in host.json: the environment over local.settings.json Values.
    settings: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, app_dir: Path, environ: Mapping[str, str] | None = None) -> HostConfig:
        """host.json with the app settings' overrides applied (`environ`, default the process environment, over
        local.settings.json Values, as the host sees them after `apply_environment`), and the Values."""
        app_dir = app_dir.resolve()
        host_json = _read_json(app_dir / "host.json", required=False)
        local = _read_json(app_dir / "local.settings.json", required=False)
        values = {str(k): str(v) for k, v in (local.get("Values") or {}).items()}
        settings = {**values, **(os.environ if environ is None else environ)}
        host_json, overrides = apply_host_json_overrides(host_json, settings)
        return cls(app_dir=app_dir, host_json=host_json, values=values, overrides=overrides, settings=settings)

    def apply_environment(self, environ: os._Environ[str] | dict[str, str] = os.environ) -> None:
        """Values become environment variables, as with `func start`; variables already set win (as in Core Tools)."""
        for key, value in self.values.items():
            environ.setdefault(key, value)

    def extension(self, name: str) -> dict[str, Any]:
        return dict(setting(setting(self.host_json, "extensions") or {}, name) or {})

    def service_bus_options(self) -> ServiceBusOptions:
        sb = self.extension("serviceBus")
        sessions = sb.get("sessionHandlerOptions") or {}
        # ServiceBusOptions.SessionIdleTimeout (Microsoft.Azure.WebJobs.Extensions.ServiceBus): "If not specified, the
        # ServiceBusRetryOptions.TryTimeout will be used", and clientRetryOptions.tryTimeout defaults to one minute.
        retry = sb.get("clientRetryOptions") or {}
        try_timeout = retry.get("tryTimeout", "00:01:00")
        # ServiceBusRetryMode is an enum {Fixed, Exponential}; the configuration binder parses enum names ignoring
        # case, so "exponential" (the host.json schema's spelling) and "Exponential" both bind, anything else fails.
        if str(retry.get("mode", "exponential")).lower() not in {"fixed", "exponential"}:
            raise ConfigError(f"host.json: clientRetryOptions.mode {retry['mode']!r} is not 'exponential' or 'fixed'")
        for key in ("tryTimeout", "delay", "maxDelay"):
            if key in retry:
                _duration_seconds(retry[key])
        return ServiceBusOptions(
            max_concurrent_calls=int(sb.get("maxConcurrentCalls", 16)),
            max_concurrent_sessions=int(sb.get("maxConcurrentSessions", sessions.get("maxConcurrentSessions", 8))),
            session_idle_timeout_s=_duration_seconds(sb.get("sessionIdleTimeout", try_timeout)),
            max_auto_lock_renewal_s=_duration_seconds(sb.get("maxAutoLockRenewalDuration", "00:05:00")),
        )

    def durable_options(self) -> DurableOptions:
        dt = self.extension("durableTask")
        provider = dict(setting(dt, "storageProvider") or {})
        # DurableTaskOptions.StorageProvider is a plain dictionary: "type" is looked up as spelled
        # (DurableTaskExtension.GetDurabilityProviderFactory); absent, the provider is Azure Storage.
        storage_type = config_text(provider.get("type")) or "AzureStorage"
        hub_name, is_default = self._hub_name(config_text(setting(dt, "hubName")))
        if is_default and storage_type.lower() == "azurestorage":
            hub_name = sanitized_hub_name(hub_name)  # AzureStorageDurabilityProviderFactory: adopted, never refused
        return DurableOptions(
            hub_name=hub_name,
            hub_name_is_default=is_default,
            storage_type=storage_type,
            storage_provider=provider,
            max_concurrent_activities=int(dt.get("maxConcurrentActivityFunctions", 8)),
            # Taken literally: the extension resolves `%Setting%` in hubName but not in defaultVersion, so
            # "%APP_VERSION%" is the version itself (Azure/azure-functions-durable-extension #3279).
            default_version=_default_version(setting(dt, "defaultVersion")),
            version_match_strategy=_enum_setting(
                dt, "versionMatchStrategy", VERSION_MATCH_STRATEGIES, "CurrentOrOlder"
            ),
            version_failure_strategy=_enum_setting(dt, "versionFailureStrategy", VERSION_FAILURE_STRATEGIES, "Reject"),
            partition_count=_partition_count((dt.get("storageProvider") or {}).get("partitionCount", 4)),
            max_queue_polling_interval_s=_max_queue_polling_interval(
                setting(dt.get("storageProvider") or {}, "maxQueuePollingInterval")
            ),
        )

    def _hub_name(self, configured: str | None) -> tuple[str, bool]:
        """DurableTaskOptions.HubName and whether it is the default: host.json's hubName with every `%Name%` resolved
        from the app settings (ResolveAppSettingOptions: TryResolveWholeString, all or nothing, so a missing setting
        leaves the text as written); absent, WEBSITE_SITE_NAME or "TestHubName"."""
        if configured is None:
            site = self.settings.get("WEBSITE_SITE_NAME")
            return (DEFAULT_HUB_NAME if site is None else site), True
        resolved = resolve_whole_string(configured, self.settings)
        return (configured if resolved is None else resolved), False

    def listener_lock_recovery_seconds(self) -> float:
        """host.json `singleton.listenerLockRecoveryPollingInterval` (SingletonOptions; one minute by default)."""
        value = (self.host_json.get("singleton") or {}).get("listenerLockRecoveryPollingInterval")
        return 60.0 if value is None else _duration_seconds(value)


@dataclass(frozen=True)
class ServiceBusOptions:
    max_concurrent_calls: int
    max_concurrent_sessions: int
    session_idle_timeout_s: float
    max_auto_lock_renewal_s: float


@dataclass(frozen=True)
class DurableOptions:
    hub_name: str
    max_concurrent_activities: int
    hub_name_is_default: bool = False
    storage_type: str = "AzureStorage"  # storageProvider.type as written ("azureManaged": Durable Task Scheduler)
    storage_provider: dict[str, Any] = field(default_factory=dict)  # the effective storageProvider section
    default_version: str | None = None
    version_match_strategy: str = "CurrentOrOlder"
    version_failure_strategy: str = "Reject"
    partition_count: int = 4
    max_queue_polling_interval_s: float = 30.0


# DurableTask.Core VersioningSettings.VersionMatchStrategy / VersionFailureStrategy (Azure/durabletask
# src/DurableTask.Core/Settings/VersioningSettings.cs): the names, in the order of their numeric values. The extension
# (3.1+, PR #3095) binds them from host.json `extensions.durableTask`; its defaults are CurrentOrOlder and Reject
# (learn.microsoft.com "Orchestration versioning in Durable Functions", Advanced usage).
VERSION_MATCH_STRATEGIES = ("None", "Strict", "CurrentOrOlder")
VERSION_FAILURE_STRATEGIES = ("Reject", "Fail")


def setting(section: Mapping[str, Any], name: str) -> Any:
    """A key of a host.json section, found case-insensitively as .NET configuration keys are."""
    for key, value in section.items():
        if key.lower() == name.lower():
            return value
    return None


def config_text(value: Any) -> str | None:
    """A configuration value as the binder sees it: text, or None for null or an object."""
    if value is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def resolve_whole_string(value: str, settings: Mapping[str, str]) -> str | None:
    """WebJobs NameResolverExtensions.TryResolveWholeString: every `%Name%` replaced by the setting (names looked up
    ignoring case, as .NET configuration keys are); None when a '%' has no closing one or a name is not set."""
    folded = {k.lower(): v for k, v in settings.items()}
    out: list[str] = []
    i = 0
    while i < len(value):
        start = value.find("%", i)
        if start < 0:
            out.append(value[i:])
            break
        end = value.find("%", start + 1)
        if end < 0:
            return None
        name = value[start + 1 : end]
        found = settings.get(name, folded.get(name.lower()))
        if found is None:
            return None
        out.append(value[i:start] + found)
        i = end + 1
    return "".join(out)


def _default_version(value: Any) -> str | None:
    """`defaultVersion` as the extension keeps it: the string as written, "" included; null or absent is no default
    version (the docs: `"defaultVersion": null` is the same as not setting it)."""
    if value is None or isinstance(value, str):
        return value
    raise ConfigError(
        f"host.json: extensions.durableTask.defaultVersion {value!r} is not a string; write it in quotes, e.g. "
        f'"{value}" (devhost does not guess how the host would turn a JSON {type(value).__name__} into text)'
    )


def _enum_setting(section: Mapping[str, Any], name: str, names: tuple[str, ...], default: str) -> str:
    """An enum option as the configuration binder reads it (`Enum.Parse`, ignoring case and surrounding spaces, or
    the member's number); null or absent is the default; anything else stops the host, as the binder's
    InvalidOperationException does."""
    value = setting(section, name)
    if value is None:
        return default
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if text is not None:
        for index, member in enumerate(names):
            if text.lower() == member.lower() or text == str(index):
                return member
    raise ConfigError(f"host.json: extensions.durableTask.{name} {value!r} is not one of {', '.join(names)}")


# learn.microsoft.com/azure/azure-functions/functions-host-json, "Override host.json values": an app setting named
# `AzureFunctionsJobHost__path__to__setting` overrides the host.json value at `path.to.setting` ("the dot (.) used to
# indicate JSON hierarchy is replaced by a double underscore (__)"); locally, in local.settings.json Values too. The
# host reads host.json into .NET configuration under the section `AzureFunctionsJobHost`, and the environment-variable
# provider, added after it, wins: keys compare case-insensitively ("durabletask" overrides "durableTask"), a key
# host.json lacks is added, and the value is text (as every JSON value is to the configuration binder).
# functions-app-settings: "__" is the hierarchy delimiter on Windows and Linux (":" only on Windows; not read here).
HOST_JSON_OVERRIDE_PREFIX = "AzureFunctionsJobHost__"


def apply_host_json_overrides(
    host_json: dict[str, Any], settings: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """A copy of `host_json` with every `AzureFunctionsJobHost__a__b` setting written at a.b (the existing key's
    spelling kept, its case ignored; missing objects created; a list element by its index), and the overrides
    applied (dotted path as the setting spells it -> value). A setting that names an object (not a value) changes
    nothing, as the binder binds an object's children, not a value on it."""
    result: dict[str, Any] = json.loads(json.dumps(host_json))
    applied: dict[str, str] = {}
    prefix = HOST_JSON_OVERRIDE_PREFIX.lower()
    # In name order, so that of two spellings of one key (possible in a case-sensitive environment) the result does
    # not depend on the environment's order.
    for name in sorted(settings):
        if not name.lower().startswith(prefix):
            continue
        path = name[len(prefix) :].split("__")
        if not path or any(not part for part in path):
            continue
        if _set_path(result, path, str(settings[name])):
            applied[".".join(path)] = str(settings[name])
    return result, applied


def _set_path(node: Any, path: list[str], value: str) -> bool:
    for i, part in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                return False  # past the end: .NET would add an element; devhost binds no host.json list from it
            index: int | str = int(part)
        elif isinstance(node, dict):
            index = next((k for k in node if k.lower() == part.lower()), part)
        else:
            return False
        current = node[index] if (isinstance(node, list) or index in node) else None
        if last:
            if isinstance(current, dict | list):
                return False
            node[index] = value
            return True
        if not isinstance(current, dict | list):
            current = {}
            node[index] = current
        node = current
    return False


def resolve(value: str, env: Mapping[str, str] = os.environ, *, lenient: bool = False) -> str:
    """Resolve `%Name%` binding expressions from app settings, as the host does for trigger properties."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in env:
            return env[name]
        if lenient:
            return match.group(0)
        raise ConfigError(
            f"binding expression %{name}% names an app setting that is not set: set {name} in "
            f"local.settings.json (Values) or in the environment"
        )

    return _EXPRESSION.sub(sub, value)


# .NET `TimeSpan.Parse` invariant format, which the host's configuration binder uses for every TimeSpan option in
# host.json: `[-]d` (whole days) or `[-][d.]hh:mm[:ss[.fffffff]]`, with hh < 24, mm < 60, ss < 60
# (learn.microsoft.com/dotnet/api/system.timespan.parse). Note that "00:30" is 30 minutes, not 30 seconds.
_TIMESPAN = re.compile(r"^\s*(-)?(?:(\d+)|(?:(\d+)\.)?(\d{1,2}):(\d{1,2})(?::(\d{1,2})(?:\.(\d{1,7}))?)?)\s*$")


# The task hub's name as the Azure Storage provider checks it (Azure/azure-functions-durable-extension v3.x,
# Options/AzureStorageOptions.cs ValidateHubName and IsSanitizedHubName, Storage/NameValidator.cs; the default is
# DurableTaskOptions.DefaultHubName). docs/modules-host.md, "devhost/config.py", has the fine print.
DEFAULT_HUB_NAME = "TestHubName"
_MIN_HUB_NAME, _MAX_HUB_NAME = 3, 45  # the numbers the error message names (the check itself allows 50)
_TABLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")
_CONTAINER_OR_QUEUE_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_LETTER_OR_DIGIT = {"Lu", "Ll", "Lt", "Lm", "Lo", "Nd"}  # .NET char.IsLetterOrDigit


def task_hub_name_error(name: str) -> str | None:
    """The extension's message when `name` is not a valid Azure Storage task hub name, else None: the name must
    pass Azure Storage's blob, container, table and queue name rules (container and queue lower-cased) and be at
    most 50 characters, i.e. a letter, then letters and digits, 3 to 50 in all."""
    blob = bool(name.strip()) and len(name) <= 1024  # NameValidator.ValidateBlobName
    lower = name.lower()  # ValidateContainerName and ValidateQueueName get ToLowerInvariant()
    container_and_queue = 3 <= len(lower) <= 63 and _CONTAINER_OR_QUEUE_NAME.match(lower) is not None
    table = 3 <= len(name) <= 63 and _TABLE_NAME.match(name) is not None  # ValidateTableName
    if blob and container_and_queue and table and len(name) <= 50:
        return None
    return (
        f"Task hub name '{name}' should contain only alphanumeric characters, start with a letter, and have length "
        f"between {_MIN_HUB_NAME} and {_MAX_HUB_NAME}."
    )


def sanitized_hub_name(name: str) -> str:
    """The default hub name as the provider adopts it (never refused): its letters and digits (UTF-16 units, as
    .NET sees them), a 't' before a leading digit, at most 45 characters, 'Hub' appended under 3; 'DefaultTaskHub'
    when nothing is left."""
    kept = [c for c in name if ord(c) <= 0xFFFF and unicodedata.category(c) in _LETTER_OR_DIGIT]
    if not kept:
        return "DefaultTaskHub"
    if unicodedata.category(kept[0]) == "Nd":  # char.IsNumber (Nd, Nl, No); only Nd survives the filter
        kept.insert(0, "t")
    sanitized = "".join(kept[:_MAX_HUB_NAME])
    return sanitized if len(sanitized) >= _MIN_HUB_NAME else sanitized + "Hub"


def _partition_count(value: Any) -> int:
    """storageProvider.partitionCount: AzureStorageOrchestrationService refuses anything outside 1..16 ("The number
    of partitions must be a positive integer and no greater than 16.")."""
    try:
        count = int(str(value))
    except ValueError:
        count = 0
    if not 1 <= count <= 16:
        raise ConfigError(
            f"host.json: extensions.durableTask.storageProvider.partitionCount {value!r}: the number of "
            "partitions must be a positive integer and no greater than 16"
        )
    return count


def _max_queue_polling_interval(value: Any) -> float:
    """storageProvider.maxQueuePollingInterval, the Azure Storage provider's longest idle poll of a queue: 30 s when
    absent (AzureStorageOptions.MaxQueuePollingInterval); the extension refuses zero or less (AzureStorageOptions.
    Validate: "MaxQueuePollingInterval must be non-negative")."""
    if value is None:
        return 30.0
    seconds = _duration_seconds(value)
    if seconds <= 0:
        raise ConfigError(
            f"host.json: extensions.durableTask.storageProvider.maxQueuePollingInterval {value!r} must "
            "be more than zero"
        )
    return seconds


def _duration_seconds(value: Any) -> float:
    """A host.json TimeSpan to seconds, as `TimeSpan.Parse` reads it; anything else is a ConfigError (the host
    fails to start on a value it cannot bind)."""
    # The JSON configuration provider hands the binder every value as text: a number 5 is "5", i.e. five days.
    match = _TIMESPAN.match(str(value)) if isinstance(value, (str, int, float)) else None
    if match is None:
        raise ConfigError(f"host.json: {value!r} is not a TimeSpan ([d.]hh:mm[:ss[.fffffff]])")
    sign, whole_days, days, hours, minutes, seconds, fraction = match.groups()
    if whole_days is not None:
        total = int(whole_days) * 86400.0
    else:
        h, m, s = int(hours), int(minutes), int(seconds or 0)
        if h > 23 or m > 59 or s > 59:
            raise ConfigError(f"host.json: {value!r} is out of range for a TimeSpan (hh < 24, mm < 60, ss < 60)")
        fraction_s = int(fraction) / 10 ** len(fraction) if fraction else 0.0
        total = int(days or 0) * 86400 + h * 3600 + m * 60 + s + fraction_s
    return float(-total if sign else total)


def _read_json(path: Path, *, required: bool) -> dict[str, Any]:
    if not path.exists():
        if required:
            raise ConfigError(f"{path} is missing")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return data
