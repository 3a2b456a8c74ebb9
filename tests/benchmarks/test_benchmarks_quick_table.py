"""`python -m benchmarks bus --quick` prints what it just measured (bus.quick.json), labelled as a quick run, not
the committed full-run table; `--table` says that it prints the full run's files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import benchmarks.__main__ as bench
from benchmarks.common import RESULTS_DIR

QUICK_SEND_RATE = 12345.0  # a figure no committed run has: only the quick file can print it


def committed_rate() -> str:
    rate = json.loads((RESULTS_DIR / "bus.json").read_text())["results"]["send_single"]["msgs_per_s"]
    return f"{rate:,.0f} msg/s"


def test_quick_run_prints_its_own_results_labelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fake_child(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        # stands in for `python -m benchmarks bus --in-process --quick --out <tmp>`: writes bus.quick.json
        assert "--quick" in argv and argv[argv.index("--out") + 1] == str(tmp_path)
        doc = json.loads((RESULTS_DIR / "bus.json").read_text())
        doc["quick"] = True
        doc["results"]["send_single"]["msgs_per_s"] = QUICK_SEND_RATE
        (tmp_path / "bus.quick.json").write_text(json.dumps(doc))
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(bench.subprocess, "run", fake_child)
    assert bench.main(["bus", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "QUICK run" in out and "bus.quick.json" in out
    assert "12,345 msg/s" in out
    assert committed_rate() not in out
    assert "durable:" not in out  # only what this run measured


def test_table_names_the_full_run_files(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--table"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Full run, ") and "bus.json" in out
    assert committed_rate() in out
