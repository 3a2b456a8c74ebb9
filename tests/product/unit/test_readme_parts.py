"""README's "The parts" table and its reading path through the product name files and folders that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TOP = ("function_app.py", "triggers/", "orchestrators/", "activities/", "orderflow/", "agent/", "devhost/", "lab/")


def _parts_section() -> str:
    text = (ROOT / "README.md").read_text()
    return text[text.index("## The parts") : text.index("## The state machine")]


def test_every_path_the_parts_and_the_reading_path_name_exists() -> None:
    named = set(re.findall(r"`([A-Za-z_][\w./-]*)`", _parts_section()))
    paths = sorted(p for p in named if p.startswith(TOP) and ("/" in p or p.endswith(".py")))
    assert len(paths) >= 30, paths  # the table and the reading path, not a stray mention
    assert [p for p in paths if not (ROOT / p).exists()] == []


def test_the_reading_path_starts_at_the_messages_and_ends_at_the_adapters() -> None:
    section = _parts_section()
    block = section[section.index("A reading path through the product") :].split("\n\n")[0]
    steps = re.split(r"^\d+\. ", block, flags=re.M)[1:]
    assert len(steps) == 8 and "`orderflow/messages.py`" in steps[0] and "`orderflow/adapters.py`" in steps[-1]
