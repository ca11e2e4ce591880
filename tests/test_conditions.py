"""The kstatus conditions, as pure functions: what is written at first sight, after success,
after an error that waiting heals and after one that it does not."""

from __future__ import annotations

from dbq.controller import conditions as cond
from dbq.errors import ConflictingObjects, DatabaseUnreachable


def types(conditions):
    return {c["type"]: (c["status"], c["reason"]) for c in conditions}


def test_first_sight_is_ready_unknown_and_reconciling():
    first = cond.reconciling(None, 1)
    assert types(first) == {"Ready": ("Unknown", "Reconciling"), "Reconciling": ("True", "Reconciling")}
    assert all(c["observedGeneration"] == 1 for c in first)
    assert cond.reconciling(first, 1) is None  # written once per generation


def test_a_new_generation_is_reconciling_and_keeps_ready():
    ready = cond.settled(
        cond.set_condition(cond.reconciling(None, 1), cond.READY, True, "Provisioned", "ok", 1)
    )
    assert types(ready) == {"Ready": ("True", "Provisioned")}
    assert cond.reconciling(ready, 1) is None
    second = cond.reconciling(ready, 2)
    assert types(second) == {"Ready": ("True", "Provisioned"), "Reconciling": ("True", "Reconciling")}


def test_errors_are_reconciling_when_waiting_heals_them_and_stalled_when_not():
    failed = cond.set_condition(cond.reconciling(None, 3), cond.READY, False, "X", "x", 3)
    waiting = cond.settled(failed, DatabaseUnreachable("cannot reach 127.0.0.1:1"))
    assert types(waiting)["Reconciling"] == ("True", "DatabaseUnreachable") and "Stalled" not in types(
        waiting
    )
    stuck = cond.settled(waiting, ConflictingObjects("ring has 64 slots"))
    assert types(stuck)["Stalled"] == ("True", "ConflictingObjects") and "Reconciling" not in types(stuck)
    assert cond.condition(stuck, cond.STALLED)["observedGeneration"] == 3
    healed = cond.settled(stuck)
    assert set(types(healed)) == {"Ready"}
