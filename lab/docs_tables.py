"""The README's settings tables, generated from the registries: `python -m lab.docs_tables` rewrites them in place.

Each table sits between `<!-- settings table: NAME -->` and `<!-- end settings table -->`; NAME picks the registry
(`app`: orderflow.settings.SETTINGS, `agent`: agent.config.AGENT_SETTINGS). A test keeps the README equal to
`render(README)`, so a setting added to a registry shows up in the docs or fails the suite.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from pathlib import Path

from agent.config import AGENT_SETTINGS
from orderflow.settings import SETTINGS, Setting

README = Path(__file__).resolve().parents[1] / "README.md"
REGISTRIES: dict[str, tuple[Setting, ...]] = {"app": SETTINGS, "agent": AGENT_SETTINGS}
_BLOCK = re.compile(r"(<!-- settings table: (\w+) -->\n)(.*?)(<!-- end settings table -->)", re.DOTALL)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(settings: Iterable[Setting]) -> str:
    """`| setting | default | meaning |`, one row a setting, in registry order."""
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for s in settings:
        default = "—" if s.default is None else f"`{_cell(s.default)}`"
        rows.append(f"| `{s.name}` | {default} | {_cell(s.doc)} |")
    return "\n".join(rows) + "\n"


def render(text: str) -> str:
    """`text` with every settings block replaced by its registry's table; an unknown NAME is a KeyError."""
    return _BLOCK.sub(lambda m: m.group(1) + markdown_table(REGISTRIES[m.group(2)]) + m.group(4), text)


def main() -> int:
    text = README.read_text()
    README.write_text(render(text))
    print(f"{README.name}: {len(_BLOCK.findall(text))} settings tables written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
