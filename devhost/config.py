"""Host configuration: host.json, local.settings.json and `%Setting%` binding expressions, as `func start` reads
them."""

from __future__ import annotations

import json
import os
import re
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

    @classmethod
    def load(cls, app_dir: Path) -> HostConfig:
        app_dir = app_dir.resolve()
        host_json = _read_json(app_dir / "host.json", required=False)
        local = _read_json(app_dir / "local.settings.json", required=False)
        values = {str(k): str(v) for k, v in (local.get("Values") or {}).items()}
        return cls(app_dir=app_dir, host_json=host_json, values=values)

    def apply_environment(self, environ: os._Environ[str] | dict[str, str] = os.environ) -> None:
        """Values become environment variables, as with `func start`; variables already set win (as in Core Tools)."""
        for key, value in self.values.items():
            environ.setdefault(key, value)

    def extension(self, name: str) -> dict[str, Any]:
        return dict((self.host_json.get("extensions") or {}).get(name) or {})

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
        return DurableOptions(
            hub_name=resolve(str(dt.get("hubName", "devhost")), os.environ, lenient=True),
            max_concurrent_activities=int(dt.get("maxConcurrentActivityFunctions", 8)),
        )


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


def resolve(value: str, env: Mapping[str, str] = os.environ, *, lenient: bool = False) -> str:
    """Resolve `%Name%` binding expressions from app settings, as the host does for trigger properties."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in env:
            return env[name]
        if lenient:
            return match.group(0)
        raise ConfigError(f"binding expression %{name}% names an app setting that is not set: set {name} in "
                          f"local.settings.json (Values) or in the environment")

    return _EXPRESSION.sub(sub, value)


# .NET `TimeSpan.Parse` invariant format, which the host's configuration binder uses for every TimeSpan option in
# host.json: `[-]d` (whole days) or `[-][d.]hh:mm[:ss[.fffffff]]`, with hh < 24, mm < 60, ss < 60
# (learn.microsoft.com/dotnet/api/system.timespan.parse). Note that "00:30" is 30 minutes, not 30 seconds.
_TIMESPAN = re.compile(r"^\s*(-)?(?:(\d+)|(?:(\d+)\.)?(\d{1,2}):(\d{1,2})(?::(\d{1,2})(?:\.(\d{1,7}))?)?)\s*$")


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
