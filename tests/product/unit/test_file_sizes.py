"""No non-test Python file runs over 600 lines, and no module docstring over 10 lines (issue 22).

A module that grows past 600 lines is split on its seams (private `_*.py` modules that the module or its package
re-exports, or a sibling module of its own). A module docstring says the concern, the contract and the source; the
rationale and figures live in docs/modules-*.md."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

MAX_LINES = 600
MAX_DOCSTRING_LINES = 10


def _root() -> Path:
    top = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], cwd=Path(__file__).parent, capture_output=True, text=True, check=True
    )
    return Path(top.stdout.strip())


def _non_test_python_files(root: Path) -> list[Path]:
    """Tracked and untracked-but-not-ignored `.py` files outside tests/ (what `git ls-files '*.py'` shows, plus
    files not added yet)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "*.py"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.decode()
    names = sorted({name for name in listed.split("\0") if name and not name.startswith("tests/")})
    return [root / name for name in names if (root / name).is_file()]


def test_no_non_test_python_file_is_over_600_lines() -> None:
    root = _root()
    files = _non_test_python_files(root)
    assert any(p.name == "function_app.py" for p in files), "the listing found no product code"
    lengths = {str(p.relative_to(root)): len(p.read_text(encoding="utf-8").splitlines()) for p in files}
    over = sorted(((n, path) for path, n in lengths.items() if n > MAX_LINES), reverse=True)
    assert not over, f"{len(over)} non-test file(s) over {MAX_LINES} lines: " + ", ".join(
        f"{path} ({n})" for n, path in over
    )


def test_no_module_docstring_is_over_10_lines() -> None:
    root = _root()
    docs = {
        str(p.relative_to(root)): ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")), clean=False)
        for p in _non_test_python_files(root)
    }
    assert docs.get("function_app.py") or docs.get("orderflow/settings.py"), "the listing found no docstrings"
    long = sorted(
        (len(doc.splitlines()), path)
        for path, doc in docs.items()
        if doc and len(doc.splitlines()) > MAX_DOCSTRING_LINES
    )
    assert not long, f"module docstrings over {MAX_DOCSTRING_LINES} lines: " + ", ".join(f"{p} ({n})" for n, p in long)
