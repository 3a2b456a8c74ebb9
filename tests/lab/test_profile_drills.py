"""The azure-storage timing profile's drills and options (lab/profile_drills.py, lab/drill.py): how `--timing` and
`--settings` default, which drills take the profile, the quiet spell, and where `make drills` runs them. The drills
themselves take minutes (`python -m devhost drill idle-then-burst --json`, `... host-crash --timing azure-storage`):
`make drills`, not the suite."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from devhost.__main__ import _parser
from lab.drill import PROFILE_KILLS, DrillOptions, drill_config, resolve_timing, run_drill_command
from lab.drill_common import DRILLS, MODULE_DRILLS
from lab.drills_report import FULL, QUICK
from lab.profile_drills import quiet_seconds
from lab.system import devhost_args


def _drill(*argv: str) -> argparse.Namespace:
    args = _parser().parse_args(["drill", *argv])
    resolve_timing(args)
    return args


def test_idle_then_burst_runs_the_profile_with_the_deployed_settings_by_default() -> None:
    assert "idle-then-burst" in DRILLS and MODULE_DRILLS["idle-then-burst"] == "lab.profile_drills:run_command"
    args = _drill("idle-then-burst")
    assert (args.timing, args.settings) == ("azure-storage", "sample")
    assert (_drill("idle-then-burst", "--timing", "local").settings) == "local"


def test_host_crash_takes_the_profile_with_two_kills_and_the_deployed_settings() -> None:
    args = _drill("host-crash", "--timing", "azure-storage")
    assert (args.timing, args.settings) == ("azure-storage", "sample")
    options = DrillOptions("host-crash", timing=args.timing, settings=args.settings)
    assert options.kill_count == PROFILE_KILLS == 2
    assert drill_config(Path("/tmp/x"), options).timing == "azure-storage"
    assert DrillOptions("host-crash").kill_count == 10  # the local timing keeps its ten kills
    assert _drill("host-crash", "--timing", "azure-storage", "--settings", "local").settings == "local"
    assert (_drill("host-crash").timing, _drill("host-crash").settings) == ("local", "local")


def test_a_drill_that_runs_the_local_timing_only_refuses_the_profile() -> None:
    args = _parser().parse_args(["drill", "retry-budget", "--timing", "azure-storage"])
    assert run_drill_command(args) == 2  # a usage error, nothing started
    with pytest.raises(SystemExit):
        _parser().parse_args(["drill", "host-crash", "--timing", "azure"])


def test_start_and_demo_take_the_timing_and_the_system_passes_it_to_every_devhost() -> None:
    assert _parser().parse_args(["start"]).timing == "local"
    assert _parser().parse_args(["start", "--timing", "azure-storage"]).timing == "azure-storage"
    assert _parser().parse_args(["demo", "--timing", "azure-storage"]).timing == "azure-storage"
    assert devhost_args(Path("app"), 0, Path("s"))[-2:] != ["--timing", "local"]  # the local command line unchanged
    assert devhost_args(Path("app"), 0, Path("s"), "azure-storage")[-2:] == ["--timing", "azure-storage"]


def test_the_quiet_spell_outlasts_the_slowest_backoff_to_the_ceiling() -> None:
    # 50 ms, then + 1.2 x 50 ms x 2^(n-1) until the ceiling, then two ceilings: every poller waits the ceiling.
    assert quiet_seconds(0.05, 5.0) == 18.0
    assert quiet_seconds(0.05, 30.0) == 91.2


def test_make_drills_runs_both_profile_drills_and_the_quick_subset_neither() -> None:
    names = [run.name for run in FULL]
    assert len(names) == len(set(names))
    assert "idle-then-burst" in names and "host-crash --timing azure-storage" in names
    profile = next(run for run in FULL if run.name == "host-crash --timing azure-storage")
    assert profile.drill == "host-crash" and profile.args == ("--timing", "azure-storage")
    assert not {"idle-then-burst", "host-crash --timing azure-storage"} & {run.name for run in QUICK}
