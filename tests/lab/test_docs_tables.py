"""The README's settings tables are the registries' (lab/docs_tables.py generates them; never edited by hand)."""

from __future__ import annotations

import pytest

from lab import docs_tables
from orderflow.settings import Setting


def test_the_readme_tables_are_the_generated_ones() -> None:
    text = docs_tables.README.read_text()
    assert text.count("<!-- settings table: ") == len(docs_tables.REGISTRIES)
    assert docs_tables.render(text) == text, "run: python -m lab.docs_tables"


def test_a_setting_added_to_a_registry_changes_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    text = docs_tables.README.read_text()
    added = (*docs_tables.REGISTRIES["agent"], Setting("AGENT_NEW", "1", "A new switch | with a pipe."))
    monkeypatch.setitem(docs_tables.REGISTRIES, "agent", added)
    rendered = docs_tables.render(text)
    assert "| `AGENT_NEW` | `1` | A new switch \\| with a pipe. |" in rendered and rendered != text
