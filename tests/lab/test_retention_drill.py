"""`python -m devhost drill retention` (lab/retention_drills.py): the judge is a pure function of what the drill read
(lab/_retention_checks.py). A clean record passes; each failure of the product fails its own check — a finished
order whose stored order never got its TTL, a document that outlives the retention, an instance left unpurged, an
unfinished order touched, a kept order expired, a stale index entry, an alarm that fires on a healthy run, a forced
alarm that never fires or never goes quiet. The drill is registered, reported, and refuses a retention of 0. The
drill itself runs in `make drills-quick` (CI, after the tests), not here: `make test` stays within its time."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from lab._retention_checks import (
    BACKLOG_GROWTH,
    DEAD_LETTERS,
    DRILL,
    OLDEST_PENDING,
    OLDEST_PROCESSING,
    TTL_NEVER,
    AlarmEvidence,
    Doc,
    Fired,
    IndexRow,
    RetentionEvidence,
    index_figures,
    judge,
    judge_alarms,
    judge_retention,
    merge_findings,
)
from lab.drill_common import DRILLS, MODULE_DRILLS
from lab.drills_report import FULL, QUICK
from lab.invariants import Findings
from lab.retention_drills import RetentionOptions

RETENTION = 5
FINISHED = ["r-1", "r-2", "r-3"]
KEPT = "r-kept"
HELD = ["r-held-1", "r-held-2"]
NOTIFIED = Doc(True, True, "Processed", 1, RETENTION, True, False, True, True)
KEPT_DOC = Doc(True, True, "Processed", 1, TTL_NEVER, True, True, False, False)
HELD_DOC = Doc(True, True, "Processing", 1, None, False, False, False, False)
GONE = Doc(False, False)


def _instances(orders: list[str], status: str = "Completed") -> dict[str, str | None]:
    return {f"{o}:1": status for o in orders}


def clean_retention() -> RetentionEvidence:
    ended = [*FINISHED, KEPT]
    return RetentionEvidence(
        finished=list(FINISHED),
        kept=KEPT,
        held=list(HELD),
        retention_s=RETENTION,
        statuses={o: "completed" for o in ended},
        kept_before=NOTIFIED,
        at_finish={**{o: NOTIFIED for o in FINISHED}, KEPT: KEPT_DOC, **{h: HELD_DOC for h in HELD}},
        after={**{o: GONE for o in FINISHED}, KEPT: KEPT_DOC, **{h: HELD_DOC for h in HELD}},
        instance_of={o: f"{o}:1" for o in [*ended, *HELD]},
        instances_at_finish={**_instances(ended), **_instances(HELD, "Running")},
        instances_after=_instances(HELD, "Running"),
        index=[IndexRow(h, True) for h in HELD],
        supervised=list(HELD),
        firing_seen=[],
        ticks=6,
        summary_firing=[],
        purge={"position": "2026-12-01T00:00:00Z", "windowSeconds": 3600.0, "deleted": 4},
        invariants_margin_s=3.0,
        elapsed_s=7.0,
    )


WARM = ["a-0", "a-1", "a-2"]
HUNG = ["a-3", "a-4", "a-5"]
BURST = ["a-6", "a-7", "a-8"]


def clean_alarms() -> AlarmEvidence:
    return AlarmEvidence(
        warmup_firing=[],
        warmup_ticks=4,
        warmup_summary_firing=[],
        poison_reason="InvalidJson",
        poison_queue="app-orders",
        fired={
            DEAD_LETTERS: Fired("dead-letters:app-orders", "timer", 0.9, 1, 0, queue="app-orders"),
            BACKLOG_GROWTH: Fired(BACKLOG_GROWTH, "summary", 0.2, 3, 2),
            OLDEST_PENDING: Fired(OLDEST_PENDING, "summary", 5.0, 5.1, 5.0, order_id=BURST[0]),
            OLDEST_PROCESSING: Fired(OLDEST_PROCESSING, "summary", 13.9, 14.1, 14.0, order_id=HUNG[0]),
        },
        dead_letters_quiet=True,
        warmup=list(WARM),
        held=list(HUNG),
        burst=list(BURST),
        held_at_stop={h: replace(HELD_DOC, deadline_in_s=3.5) for h in HUNG},
        final_firing=[],
        final_ticks=2,
        final_summary_firing=[],
        statuses={o: "completed" for o in [*WARM, *HUNG, *BURST]},
        attempts={**{o: 1 for o in [*WARM, *BURST]}, **{h: 2 for h in HUNG}},
        index=[],
        elapsed_s=32.0,
    )


def _failed(checks: dict[str, bool]) -> list[str]:
    return [name for name, ok in checks.items() if not ok]


def _findings(**overrides: Any) -> Findings:
    checks = {"invariant: no order lost": True, "invariant: none stuck": True}
    figures = {"invariants": {"transitions_audited": 10, "most_calls_per_key": 1, "lost": []}}
    return Findings(overrides.get("checks", checks), overrides.get("figures", figures), 0, 0, 0)


def test_a_clean_record_passes() -> None:
    verdict = judge(clean_retention(), clean_alarms(), _findings())
    assert verdict.passed, verdict.failed_checks()
    assert verdict.drill == DRILL and verdict.orders == len(FINISHED) + 1 + len(HELD) + 9
    figures = verdict.figures
    assert (figures["expired"], figures["purged"], figures["unfinished"], figures["index_stale"]) == (3, 4, 2, 0)
    assert figures["alarms_fired"] == sorted([BACKLOG_GROWTH, DEAD_LETTERS, OLDEST_PENDING, OLDEST_PROCESSING])


def test_a_stored_order_without_its_ttl_fails() -> None:
    """notifications.py skipping expire_finished: the record expires, the stored order never does."""
    ev = clean_retention()
    ev.at_finish[FINISHED[0]] = replace(NOTIFIED, stored_expiry=False)
    ev.after[FINISHED[0]] = Doc(False, True)
    assert _failed(judge_retention(ev)[0]) == [
        "each finished order's record and stored order carried FinishedOrderRetentionSeconds once notified",
        "finished orders' records and stored orders are gone after the retention",
    ]


def test_a_document_read_after_its_retention_fails() -> None:
    ev = clean_retention()
    ev.after[FINISHED[1]] = replace(NOTIFIED)
    assert _failed(judge_retention(ev)[0]) == [
        "finished orders' records and stored orders are gone after the retention"
    ]


def test_an_instance_left_unpurged_fails() -> None:
    ev = clean_retention()
    ev.instances_after[f"{KEPT}:1"] = "Completed"
    checks, figures = judge_retention(ev)
    assert _failed(checks) == ["finished orders' Durable instances were purged (the kept one's too)"]
    assert figures["instances_left"] == [f"{KEPT}:1"]


def test_an_unfinished_order_touched_fails() -> None:
    cases: tuple[dict[str, dict[str, Any]], ...] = (
        {"after": {HELD[0]: replace(HELD_DOC, ttl=RETENTION, record_expiry=True)}},  # given a TTL
        {"after": {HELD[0]: GONE}},  # expired
        {"instances_after": {f"{HELD[1]}:1": None}},  # its running instance's history gone, or purged:
        {"instances_after": {}},
    )
    for touched in cases:
        ev = clean_retention()
        for name, value in touched.items():
            current = getattr(ev, name)
            setattr(ev, name, {**current, **value} if value else {})
        failed = _failed(judge_retention(ev)[0])
        assert "unfinished orders untouched: documents kept without TTL, instances running" in failed, touched


def test_a_kept_order_that_expires_fails() -> None:
    ev = clean_retention()
    ev.after[KEPT] = replace(KEPT_DOC, stored=False)
    assert _failed(judge_retention(ev)[0]) == ["the kept order's documents outlived the retention"]
    ev = clean_retention()
    ev.at_finish[KEPT] = replace(KEPT_DOC, stored_expiry=True)  # keep left the stored order's TTL
    assert "the kept order had its retention, and keep removed it from both documents" in _failed(
        judge_retention(ev)[0]
    )


def test_a_stale_or_missing_index_entry_fails() -> None:
    ev = clean_retention()
    ev.index.append(IndexRow(FINISHED[0], False))
    checks, figures = judge_retention(ev)
    assert _failed(checks) == ["the recovery index holds only live entries"]
    assert (figures["index_live"], figures["index_stale"], figures["index_stale_orders"]) == (2, 1, [FINISHED[0]])
    ev = clean_retention()
    ev.index = ev.index[:1]
    assert _failed(judge_retention(ev)[0]) == ["every unfinished supervised order has its live index entry"]
    assert index_figures([], ["x"])[:2] == (True, False)


def test_an_alarm_on_the_healthy_run_fails_and_quiet_needs_ticks() -> None:
    ev = clean_retention()
    ev.firing_seen = [BACKLOG_GROWTH]
    assert _failed(judge_retention(ev)[0]) == [
        "every alarm quiet while the orders ran and after (the alarm timer's document)"
    ]
    ev = clean_retention()
    ev.ticks = 1  # the timer hardly ran: quiet proves nothing
    assert len(_failed(judge_retention(ev)[0])) == 1
    alarms = clean_alarms()
    alarms.warmup_summary_firing = [f"{DEAD_LETTERS}:app-orders"]
    assert _failed(judge_alarms(alarms)[0]) == ["alarms quiet on a healthy run (timer and summary)"]


def test_a_forced_alarm_that_never_fires_fails() -> None:
    for name in (DEAD_LETTERS, BACKLOG_GROWTH, OLDEST_PENDING, OLDEST_PROCESSING):
        ev = clean_alarms()
        del ev.fired[name]
        failed = _failed(judge_alarms(ev)[0])
        assert len(failed) == 1 and name in failed[0], (name, failed)


def test_an_alarm_about_the_wrong_order_or_queue_fails() -> None:
    ev = clean_alarms()
    ev.fired[OLDEST_PROCESSING] = replace(ev.fired[OLDEST_PROCESSING], order_id=WARM[0])
    ev.fired[DEAD_LETTERS] = replace(ev.fired[DEAD_LETTERS], queue="app-status")
    assert len(_failed(judge_alarms(ev)[0])) == 2


def test_an_alarm_that_stays_on_fails() -> None:
    ev = clean_alarms()
    ev.dead_letters_quiet = False
    ev.final_firing = [OLDEST_PENDING]
    checks, figures = judge_alarms(ev)
    assert _failed(checks) == [
        "dead-letters quiet again once the dead letter was removed",
        "every alarm quiet again once devhost was back and the backlog drained (timer and summary)",
    ]
    assert figures["alarms_left"] == [OLDEST_PENDING]


def test_a_stop_after_the_deadline_is_said() -> None:
    """The Supervisor may have recovered the order before devhost stopped: the drill did not force what it says."""
    ev = clean_alarms()
    ev.held_at_stop[HUNG[1]] = replace(HELD_DOC, deadline_in_s=-0.5)
    assert _failed(judge_alarms(ev)[0]) == [
        "devhost stopped while the hung orders held every slot (Processing, first attempt, before the deadline)"
    ]


def test_the_invariants_of_both_systems_merge() -> None:
    bad = _findings(checks={"invariant: no order lost": False, "invariant: none stuck": True})
    merged = merge_findings(_findings(), bad)
    assert merged.checks == {"invariant: no order lost": False, "invariant: none stuck": True}
    assert merged.figures["invariants"]["transitions_audited"] == 20
    unread = Findings({}, {}, 0, 0, -1)
    assert merge_findings(_findings(), unread).duplicates == -1
    assert not judge(clean_retention(), clean_alarms(), bad).passed


def test_the_drill_is_registered_and_reported() -> None:
    assert DRILL in DRILLS and MODULE_DRILLS[DRILL] == "lab.retention_drills:run_command"
    assert DRILL in {run.drill for run in FULL} and DRILL in {run.drill for run in QUICK}


def test_the_drill_refuses_no_retention() -> None:
    with pytest.raises(ValueError, match="FinishedOrderRetentionSeconds"):
        RetentionOptions(overrides=(("FinishedOrderRetentionSeconds", "0"),))
    with pytest.raises(ValueError, match="at least one order"):
        RetentionOptions(orders=0)
    assert RetentionOptions().retention_values()["PurgeSchedule"] == "*/1 * * * * *"
    assert RetentionOptions().alarm_values()["MaxOrdersInProcessing"] == "3"
