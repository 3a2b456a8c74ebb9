"""The endpoint options of the stand-ins' fault switches (`embedded://PATH?name=value&...`), read one way for the
broker's `BusFaults` and the store's `StoreFaults`: shares in [0, 1], millisecond counts, a seed, the outage file and
the ledger (default `<PATH>.faults.jsonl`). A misspelt option or a bad value is a ValueError, so that it cannot
quietly turn a drill's faults off."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

_COMMON = ("seed", "outageFile", "ledger")


def parse_fault_options(
    query: str, subject: str, path: Path, *, rates: Mapping[str, str], counts: Mapping[str, str]
) -> dict[str, Any]:
    """The dataclass fields a query string sets: `rates` and `counts` map option names to field names (a count is
    clamped at 0); `subject` names the stand-in in errors ("broker", "store"); `path` gives the ledger's default."""
    values: dict[str, Any] = {}
    for name, value in parse_qsl(query, keep_blank_values=True, strict_parsing=True):
        if name in rates:
            rate = float(value)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"embedded {subject} option {name} must be within [0, 1], got {value!r}")
            values[rates[name]] = rate
        elif name in counts:
            values[counts[name]] = max(0, int(value))
        elif name == "seed":
            values["seed"] = int(value)
        elif name in ("outageFile", "ledger"):
            if not value:
                raise ValueError(f"embedded {subject} option {name} needs a path")
            values["outage_file" if name == "outageFile" else "ledger"] = Path(value)
        else:
            known = ", ".join([*rates, *counts, *_COMMON])
            raise ValueError(f"unknown embedded {subject} option {name!r} (known: {known})")
    values.setdefault("ledger", path.with_name(path.name + ".faults.jsonl"))
    return values
