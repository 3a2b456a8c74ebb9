"""lab/invariants.py's judge on hand-made evidence: each invariant fails on exactly what it names."""

from __future__ import annotations

from typing import Any

import pytest

from lab.invariants import ALLOWED, Evidence, judge

IDS = ["o-1", "o-2"]


def evidence(**changes: Any) -> Evidence:
    base: dict[str, Any] = dict(
        order_ids=IDS,
        states={"o-1": "Processed", "o-2": "Compensated"},
        effects={"duplicates": 0, "callsByKey": {"o-1:reserve-inventory": 3}},
        transitions=[
            ("o-1", None, "Pending"),
            ("o-1", "Pending", "Processing"),
            ("o-1", "Processing", "Processed"),
            ("o-2", None, "Processing"),
            ("o-2", "Processing", "CompensationInProgress"),
            ("o-2", "CompensationInProgress", "Compensated"),
        ],
        dead_letters=[("orders-inbound", "InvalidJson")],
        budget=75,
        audited=True,
        expect_record=set(IDS),
    )
    return Evidence(**{**base, **changes})


def failing(e: Evidence) -> set[str]:
    return {name for name, ok in judge(e).checks.items() if not ok}


def test_a_clean_run_passes_every_invariant() -> None:
    assert failing(evidence()) == set()


@pytest.mark.parametrize(
    ("changes", "fails"),
    [
        ({"states": {"o-1": "Processed"}}, "invariant: no order lost"),
        ({"states": {"o-1": "Processed", "o-2": "Processing"}}, "invariant: none stuck"),
        ({"effects": {"duplicates": 1, "callsByKey": {}}}, "invariant: at most one side effect per order step"),
        ({"effects": {"duplicates": -1, "callsByKey": {}}}, "invariant: at most one side effect per order step"),
        (
            {"effects": {"duplicates": 0, "callsByKey": {"o-1:reserve-inventory": 76}}},
            "invariant: remote calls per order step within the retry budget",
        ),
        ({"transitions": [("o-1", "Processed", "Pending")]}, "invariant: no transition outside the state machine"),
        ({"transitions": [("o-1", None, "Processed")]}, "invariant: no transition outside the state machine"),
        ({"audited": False}, "invariant: no transition outside the state machine"),
        ({"dead_letters": [("agent-replies", None)]}, "invariant: every dead letter has a reason"),
    ],
)
def test_each_invariant_fails_on_what_it_names(changes: dict[str, Any], fails: str) -> None:
    assert failing(evidence(**changes)) == {fails}


def test_an_order_rejected_by_design_needs_no_record() -> None:
    assert failing(evidence(states={"o-1": "Processed"}, expect_record={"o-1"})) == set()


def test_the_allowed_moves_are_the_state_machines_and_include_an_operators_resubmit() -> None:
    assert ("Error", "Pending") in ALLOWED and ("Processed", "Pending") not in ALLOWED
