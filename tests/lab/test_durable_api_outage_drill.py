"""`python -m devhost drill durable-api-outage` (lab/durable_api_drills.py) in real processes: devhost's Durable
HTTP API answers 503 on its start and status routes (devhost/durable/http_api.py `OutageSwitch`) while attempts
expire; afterwards every order ends, none stuck.

The verdict is checked, then its claims are read again from the files the drill left: the state store (every
record Processed; the hung orders recovered once, the refused ones started again in attempt 1) and the switch's
ledger (status and start requests refused).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from devhost.durable.http_api import ledger_of
from lab.drill_common import DRILLS, MODULE_DRILLS
from lab.drills_report import FULL, QUICK
from lab.durable_api_drills import DRILL, outage_file
from lab.system import ROOT


def test_the_drill_is_registered_and_in_both_report_runs() -> None:
    assert DRILL in DRILLS and MODULE_DRILLS[DRILL] == "lab.durable_api_drills:run_command"
    assert DRILL in {run.drill for run in FULL} and DRILL in {run.drill for run in QUICK}


def test_a_single_order_is_refused_as_a_usage_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "devhost", "drill", DRILL, "--orders", "1", "--work-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "at least 2 orders" in proc.stderr


@pytest.mark.slow
def test_durable_api_outage_drill_strands_no_order(tmp_path: Path) -> None:
    work = tmp_path / "drill"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "devhost",
            "drill",
            DRILL,
            "--json",
            "--orders",
            "6",
            "--outage-for",
            "8",
            "--work-dir",
            str(work),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
    )
    verdict: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    text = json.dumps(verdict)
    assert proc.returncode == 0 and verdict["passed"] and all(verdict["checks"].values()), text
    assert (verdict["orders"], verdict["lost"], verdict["stuck"], verdict["duplicate_side_effects"]) == (6, 0, 0, 0)
    figures = verdict["figures"]
    assert figures["expired_at_outage_end"] >= 2 and figures["expired_passed_by_checkpoint"] == [], text

    with sqlite3.connect(work / "store.db") as db:
        records = {i: json.loads(doc) for i, doc in db.execute("SELECT id, doc FROM order_state")}
    assert {r["processState"] for r in records.values()} == {"Processed"}
    shapes = Counter((r["attempt"], r["failureCount"], r["restarts"] > 0) for r in records.values())
    assert shapes == Counter({(2, 1, False): 3, (1, 0, True): 3}), shapes  # hung: recovered; refused: restarted
    lines = [json.loads(line) for line in ledger_of(outage_file(work)).read_text().splitlines()]
    routes = Counter(line["route"] for line in lines)
    assert routes["status"] > 0 and routes["start"] > 0 and set(routes) == {"status", "start"}
    assert not outage_file(work).exists()  # the switch is off again
