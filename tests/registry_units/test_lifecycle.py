"""The pair lifecycle table: legal moves go through, illegal ones are refused with a reason
(the services' use of it is tested in tests/core/test_lifecycle_cli.py)."""

from __future__ import annotations

import pytest

from registry.errors import Conflict
from registry.governance import lifecycle


def test_every_status_is_reachable_and_every_row_names_known_statuses() -> None:
    reachable = {"registered"}
    for row in lifecycle.TRANSITIONS.values():
        assert set(row) <= set(lifecycle.STATUSES)
        assert set(row.values()) <= set(lifecycle.STATUSES)
        reachable |= set(row.values())
    assert reachable == set(lifecycle.STATUSES)


@pytest.mark.parametrize(
    ("before", "event", "after"),
    [
        ("registered", "validated", "validated"),
        ("drifted", "validated", "validated"),
        ("validated", "promoted", "promoted"),
        ("promoted", "replaced", "validated"),
        ("validated", "drift_flagged", "drifted"),
        ("drifted", "flags_cleared", "registered"),
        ("drifted", "flags_cleared_valid", "validated"),
        ("drifted", "rolled_back_to", "promoted"),
        ("validated", "deprecated", "deprecated"),
        ("deprecated", "retired", "retired"),
    ],
)
def test_legal_moves(before: str, event: str, after: str) -> None:
    assert lifecycle.next_status(before, event) == after


@pytest.mark.parametrize(
    ("before", "event", "why"),
    [
        ("registered", "promoted", "only a validated pair"),
        ("deprecated", "promoted", "only a validated pair"),
        ("retired", "rolled_back_to", "cannot go live again"),
        ("promoted", "deprecated", "move it off every deployment"),
        ("promoted", "retired", "move it off every deployment"),
        ("retired", "validated", "not part of the pair lifecycle"),
        ("validated", "replaced", "not part of the pair lifecycle"),
    ],
)
def test_illegal_moves_are_refused_with_a_reason(before: str, event: str, why: str) -> None:
    with pytest.raises(Conflict, match=why):
        lifecycle.next_status(before, event)
