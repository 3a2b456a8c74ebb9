"""`python -m devhost drill bus-outage` (lab/bus_drills.py): Service Bus busy, then timing out, for devhost and the
Agent (the embedded broker's `BusFaults`, through their connection string) while orders are submitted and answered;
afterwards every order Processed once with `completed`, none lost, stuck or dead-lettered.

The options and the figures are checked without a system; then (slow) the drill runs in real processes and its
claims are read again from the files it left: the fault ledger (both kinds injected, some past the SDK's retries), the
state store (every record Processed) and the broker (no dead letter).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lab.bus_drills import DRILL, BusDrillOptions, FaultyBusSystem, bus_config, injected_figures, ledger_file
from lab.drill_common import DRILLS, MODULE_DRILLS
from lab.drills_report import FULL, QUICK
from lab.invariants import _dead_letters
from lab.store_drills import FaultLedger
from lab.system import ROOT
from orderflow.embedded._connection_string import parse_embedded


def test_the_drill_is_registered_and_in_both_report_runs() -> None:
    assert DRILL in DRILLS and MODULE_DRILLS[DRILL] == "lab.bus_drills:run_command"
    assert DRILL in {run.drill for run in FULL} and DRILL in {run.drill for run in QUICK}


def test_options_are_checked_before_anything_starts() -> None:
    assert BusDrillOptions().kinds == ("server-busy", "timeout")
    assert BusDrillOptions(overrides=(("outageKinds", "drop, timeout"),)).kinds == ("drop", "timeout")
    for bad in (("outageKinds", "busy"), ("outageKinds", ""), ("serverBusyRate", "2"), ("timeoutMs", "x")):
        with pytest.raises(ValueError):
            BusDrillOptions(overrides=(bad,))
    options = BusDrillOptions(overrides=(("dropRate", "0.1"), ("StepTimeoutSeconds", "40")))
    assert options.fault_options() == {"timeoutMs": "1000", "dropRate": "0.1"}
    assert options.settings_values()["StepTimeoutSeconds"] == "40" and "dropRate" not in options.settings_values()


def test_only_devhost_and_the_agent_see_the_faults(tmp_path: Path) -> None:
    options = BusDrillOptions(seed=3)
    system = FaultyBusSystem(bus_config(tmp_path, options), options)
    faulty = {name: system._process(name, ["-c", "pass"]).env["ServiceBusConnection"] for name in ("devhost", "agent")}
    for connection in faulty.values():
        faults = parse_embedded(connection).faults
        assert faults is not None and faults.seed == 3 and faults.timeout_ms == 1000
        assert faults.outage_file == tmp_path.resolve() / "servicebus.db.down"
    assert parse_embedded(system.app_bus_connection).faults is None  # the client app and the drill's own reads
    assert parse_embedded(system._process("simulator", ["-c", "pass"]).env["ServiceBusConnection"]).faults is None


def test_the_figures_count_the_ledger_by_kind_and_by_who_met_it() -> None:
    entries = [
        {"op": "send", "queue": "q", "fault": "server-busy", "retried": True},
        {"op": "send", "queue": "q", "fault": "server-busy", "retried": False},
        {"op": "receive", "queue": "q", "fault": "timeout", "retried": False},
        {"op": "complete", "queue": "q", "fault": "timeout", "retried": None},  # the AMQP endpoint's: not known
    ]
    figures = injected_figures(FaultLedger(entries, field="fault"))
    assert figures["injected"] == 4
    assert figures["injected_by_kind"] == {"server-busy": 2, "timeout": 2}
    assert figures["sdk_retries_by_kind"] == {"server-busy": 1, "timeout": 0}
    assert figures["reaching_callers_by_op"] == {"send": 1, "receive": 1}


@pytest.mark.slow
def test_bus_outage_drill_costs_no_order(tmp_path: Path) -> None:
    work = tmp_path / "drill"
    command = [sys.executable, "-m", "devhost", "drill", DRILL, "--json", "--orders", "6", "--outage-for", "14"]
    proc = subprocess.run([*command, "--work-dir", str(work)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    verdict: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    text = json.dumps(verdict)
    assert proc.returncode == 0 and verdict["passed"] and all(verdict["checks"].values()), text
    assert (verdict["orders"], verdict["lost"], verdict["stuck"], verdict["duplicate_side_effects"]) == (9, 0, 0, 0)

    ledger = FaultLedger.read(ledger_file(work / "servicebus.db"), field="fault")
    assert ledger.count("server-busy") > 0 and ledger.count("timeout") > 0
    assert any(e["retried"] is False and e["op"] != "receive" for e in ledger.entries)  # past the SDK's retries
    with sqlite3.connect(work / "store.db") as db:
        states = [json.loads(doc)["processState"] for (doc,) in db.execute("SELECT doc FROM order_state")]
    assert states == ["Processed"] * 9
    assert _dead_letters(f"Endpoint=embedded://{work / 'servicebus.db'}") == []
