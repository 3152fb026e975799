"""The pair lifecycle: every status a pair can have, and every move between them.

A pair's status changes only through :func:`apply`, for a named event, and only where the
table below allows it; anything else is refused (``Conflict``), so no service can put a
pair into a state the governance rules do not know. Each change appends a
``pair.status_changed`` audit event with the event and the reason.

::

    registered --validated--> validated --promoted--> promoted --replaced--> validated
        |                        |                       |
        +--drift_flagged--> drifted --flags_cleared--> registered | validated
    any but promoted --deprecated--> deprecated --retired--> retired

``promoted`` means live on at least one deployment; a promoted pair must be moved off every
deployment before it can be deprecated or retired. A rollback may return to a pair that was
drift-flagged since it was replaced (the emergency exit does not re-check gates), but never
to a deprecated or retired one.
"""

from __future__ import annotations

from typing import Literal, get_args

from sqlalchemy.orm import Session

from registry.errors import Conflict
from registry.tables import Pair, utcnow
from registry.trust.audit import append_event

PairStatus = Literal["registered", "validated", "promoted", "drifted", "deprecated", "retired"]
STATUSES: tuple[str, ...] = get_args(PairStatus)

Event = Literal[
    "validated",  # a validation passed
    "promoted",  # made live on a deployment (gates re-checked)
    "rolled_back_to",  # made live again by a rollback (gates not re-checked)
    "replaced",  # no longer live on any deployment
    "drift_flagged",  # a drift flag opened on it
    "flags_cleared",  # its last open flag closed; gates no longer pass
    "flags_cleared_valid",  # its last open flag closed and its gates pass
    "deprecated",  # withdrawn by a promoter: may not be promoted again
    "retired",  # gone for good
]

# event -> {status before: status after}; a status missing from an event's row refuses it.
TRANSITIONS: dict[str, dict[str, str]] = {
    "validated": {
        "registered": "validated",
        "drifted": "validated",
        "validated": "validated",
        "promoted": "promoted",
    },
    "promoted": {"validated": "promoted", "promoted": "promoted"},
    "rolled_back_to": {"validated": "promoted", "promoted": "promoted", "drifted": "promoted"},
    "replaced": {"promoted": "validated"},
    "drift_flagged": {
        "registered": "drifted",
        "validated": "drifted",
        "drifted": "drifted",
        "promoted": "promoted",
    },
    "flags_cleared": {"drifted": "registered"},
    "flags_cleared_valid": {"drifted": "validated"},
    "deprecated": {"registered": "deprecated", "validated": "deprecated", "drifted": "deprecated"},
    "retired": {
        "registered": "retired",
        "validated": "retired",
        "drifted": "retired",
        "deprecated": "retired",
    },
}

_WHY_NOT = {
    "promoted": "only a validated pair can be promoted",
    "rolled_back_to": "a deprecated or retired pair cannot go live again",
    "deprecated": "move it off every deployment first",
    "retired": "move it off every deployment first",
}


def next_status(current: str, event: str) -> str:
    """The status after ``event``, or ``Conflict`` naming why the move is not allowed."""
    row = TRANSITIONS.get(event)
    if row is None:
        raise ValueError(f"unknown lifecycle event {event!r}")
    after = row.get(current)
    if after is None:
        hint = _WHY_NOT.get(event, "that move is not part of the pair lifecycle")
        raise Conflict(f"pair is {current}: cannot apply {event} ({hint})", field="status")
    return after


def allowed(current: str, event: str) -> bool:
    return current in TRANSITIONS.get(event, {})


def apply(session: Session, pair: Pair, event: str, *, actor: str, reason: str) -> str:
    """Move ``pair`` for ``event`` (refused when the table does not allow it); returns the
    new status and records the change in the audit log when the status changed."""
    after = next_status(pair.status, event)
    if after == pair.status:
        return after
    before = pair.status
    pair.status = after
    pair.status_changed_at = utcnow()
    append_event(
        session,
        actor=actor,
        action="pair.status_changed",
        entity_type="pair",
        entity_id=pair.id,
        payload={
            "pair_digest": pair.pair_digest,
            "from": before,
            "to": after,
            "event": event,
            "reason": reason,
        },
    )
    return after
