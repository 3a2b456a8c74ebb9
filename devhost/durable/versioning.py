"""Orchestration versions, as the Durable extension (3.1+) and DurableTask.Core handle them.

- An instance's version is its ExecutionStarted event's `Version`, which the Python SDK's `context.version` reads.
- A start without a version gets host.json `extensions.durableTask.defaultVersion`, taken literally (no `%Setting%`
  expansion); without one the version is null, which the SDK shows as None.
- Before each episode the worker checks the instance's version against its own defaultVersion: `None` accepts all,
  `Strict` wants the same string, `CurrentOrOlder` (the default) wants the instance's version <= the worker's. On a
  mismatch `Reject` (the default) abandons the work item (tried again later); `Fail` completes the instance as Failed
  with FailureDetails("VersionMismatch", "Orchestration version did not comply with Worker Versioning").
Source: DurableTask.Core TaskOrchestrationDispatcher.cs `versioningFailed`; every citation in docs/modules-host.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from devhost.config import VERSION_FAILURE_STRATEGIES, VERSION_MATCH_STRATEGIES, DurableOptions

MISMATCH_ERROR_TYPE = "VersionMismatch"
MISMATCH_MESSAGE = "Orchestration version did not comply with Worker Versioning"
# The instance's output after a Fail: DurableTask.AzureStorage stores `FailureDetails.ToString()` ("{ErrorType}:
# {ErrorMessage}") as the Output (AzureTableTrackingStore.UpdateStateAsync, ExecutionCompleted), and the HTTP API
# shows text that is not JSON as a JSON string (DurableClient.ParseToJToken).
MISMATCH_OUTPUT = f"{MISMATCH_ERROR_TYPE}: {MISMATCH_MESSAGE}"

# .NET `char.IsWhiteSpace` (string.IsNullOrWhiteSpace): Unicode Zs/Zl/Zp, U+0009..U+000D, U+0085, U+00A0.
_DOTNET_SPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
# One component of System.Version: int.TryParse(NumberStyles.Integer, invariant) and >= 0. NumberStyles.Integer
# allows leading/trailing white space (U+0009..U+000D, U+0020) and a leading sign; digits are ASCII.
_COMPONENT = re.compile(r"^[\t\n\v\f\r ]*([+-]?)([0-9]+)[\t\n\v\f\r ]*$")
_INT32_MAX = 2**31 - 1


def _is_null_or_white_space(value: str | None) -> bool:
    return value is None or all(c in _DOTNET_SPACE for c in value)


def _component(text: str) -> int | None:
    match = _COMPONENT.match(text)
    if match is None:
        return None
    number = int(match.group(2)) * (-1 if match.group(1) == "-" else 1)
    return number if 0 <= number <= _INT32_MAX else None


def parse_dotnet_version(text: str) -> tuple[int, int, int, int] | None:
    """`System.Version.TryParse`: 2 to 4 dot-separated components; an absent build or revision is -1, as
    `Version.CompareTo` compares them ("1.0" < "1.0.0")."""
    parts = text.split(".")
    if not 2 <= len(parts) <= 4:
        return None
    numbers = [_component(p) for p in parts]
    if any(n is None for n in numbers):
        return None
    padded = [n for n in numbers if n is not None] + [-1] * (4 - len(numbers))
    return padded[0], padded[1], padded[2], padded[3]


def _ordinal_ignore_case_key(text: str) -> bytes:
    """`StringComparison.OrdinalIgnoreCase`: UTF-16 code units compared after a per-character upper-casing."""
    upper = "".join(c.upper() if len(c.upper()) == 1 else c for c in text)
    return upper.encode("utf-16-be", "surrogatepass")


def compare_versions(source: str | None, other: str | None) -> int:
    """DurableTask.Core `VersioningSettings.CompareVersions`: -1, 0 or 1 as `source` is older than, equal to or
    newer than `other`. Empty/white-space versions are equal and older than any other; two System.Version strings
    compare as versions; anything else compares as text, ordinal ignoring case — so "10" < "9" and "v2" > "v10"."""
    if _is_null_or_white_space(source) and _is_null_or_white_space(other):
        return 0
    if _is_null_or_white_space(source):
        return -1
    if _is_null_or_white_space(other):
        return 1
    assert source is not None and other is not None
    left, right = parse_dotnet_version(source), parse_dotnet_version(other)
    if left is not None and right is not None:
        return (left > right) - (left < right)
    a, b = _ordinal_ignore_case_key(source), _ordinal_ignore_case_key(other)
    return (a > b) - (a < b)


@dataclass(frozen=True)
class VersioningPolicy:
    """The worker's versioning settings: host.json `defaultVersion`, `versionMatchStrategy`,
    `versionFailureStrategy` (the extension's defaults: no default version, CurrentOrOlder, Reject)."""

    default_version: str | None = None
    match_strategy: str = "CurrentOrOlder"
    failure_strategy: str = "Reject"

    def __post_init__(self) -> None:
        if self.match_strategy not in VERSION_MATCH_STRATEGIES:
            raise ValueError(f"versionMatchStrategy {self.match_strategy!r} is not one of {VERSION_MATCH_STRATEGIES}")
        if self.failure_strategy not in VERSION_FAILURE_STRATEGIES:
            raise ValueError(
                f"versionFailureStrategy {self.failure_strategy!r} is not one of {VERSION_FAILURE_STRATEGIES}"
            )

    def version_for_new_instance(self, requested: str | None) -> str | None:
        """A start's version: the one asked for (even ""), else defaultVersion (PR #3213: "If a version is
        explicitly specified, it will be used instead of the value in defaultVersion")."""
        return self.default_version if requested is None else requested

    def complies(self, instance_version: str | None) -> bool:
        """TaskOrchestrationDispatcher's check of the instance's version against this worker's."""
        if self.match_strategy == "Strict":
            # `versioningSettings.Version != runtimeState.Version`: ordinal, case-sensitive, null != "".
            return self.default_version == instance_version
        if self.match_strategy == "CurrentOrOlder":
            return compare_versions(instance_version, self.default_version) <= 0
        return True

    @property
    def rejects(self) -> bool:
        return self.failure_strategy == "Reject"

    def describe(self) -> str:
        return (
            f"defaultVersion {self.default_version!r}, versionMatchStrategy {self.match_strategy}, "
            f"versionFailureStrategy {self.failure_strategy}"
        )


def versioning_policy(options: DurableOptions) -> VersioningPolicy:
    """The policy host.json's `extensions.durableTask` asks for (HostConfig.durable_options)."""
    return VersioningPolicy(
        default_version=options.default_version,
        match_strategy=options.version_match_strategy,
        failure_strategy=options.version_failure_strategy,
    )
