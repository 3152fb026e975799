"""Duties that belong to nobody who builds pairs: approving remote model code, and the keys
workers sign their measurements with.

* Remote code: an artifact whose checkpoint ships its own Python (``config.json``
  ``auto_map``) is measured only after an admin approves *those bytes*, by manifest digest;
  a new version of the same lineage needs its own approval. A policy cannot grant it.
  Jobs that need it are claimed only by isolated workers (``registry.services.jobs``).
* Worker keys: an admin registers an Ed25519 public key for a worker token; a result that
  worker signs is checked on arrival and stored with its signature, and
  :func:`verify_measurement` (or :func:`registry.trust.measurement_signing.verify_record`,
  offline) checks it again at any time.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.errors import Conflict, InvalidInput, NotFound
from registry.params import Id
from registry.records.core import from_row
from registry.records.governance import (
    MeasurementVerification,
    RemoteCodeApprovalRecord,
    WorkerKeyRecord,
)
from registry.refs import resolve_artifact
from registry.services.measurements import get_measurement
from registry.services.tokens import TOKEN_ACTOR
from registry.tables import ApiToken, Measurement, Pair, RemoteCodeApproval, WorkerKey
from registry.trust.audit import append_event, lock_writes
from registry.trust.measurement_signing import (
    check_signature,
    fingerprint,
    public_key_raw,
    verify_record,
)

ApprovalReason = Annotated[
    str, Field(min_length=1, max_length=500, description="Why these bytes may run (recorded).")
]


def approve_remote_code(
    session: Session,
    *,
    ref: Annotated[str, Field(min_length=1, description="Artifact ref (lineage@vN or id).")],
    reason: ApprovalReason,
    actor: str,
) -> RemoteCodeApprovalRecord:
    """Approve one artifact's own model code to run in isolated workers, by manifest digest.

    The approval names these exact bytes: a new version of the lineage, or changed files,
    needs a new approval. Audited as ``artifact.remote_code_approved``."""
    art = resolve_artifact(session, ref)
    if not (art.facts or {}).get("remote_code"):
        raise InvalidInput(
            f"{art.lineage}@v{art.version} ships no model code of its own (no auto_map): "
            "nothing to approve",
            field="ref",
        )
    lock_writes(session)
    row = session.scalar(
        select(RemoteCodeApproval).where(RemoteCodeApproval.manifest_digest == art.manifest_digest)
    )
    if row is not None:
        return RemoteCodeApprovalRecord.model_validate(
            {**from_row(RemoteCodeApprovalRecord, row).model_dump(), "created": False}
        )
    row = RemoteCodeApproval(
        manifest_digest=art.manifest_digest,
        artifact_id=art.id,
        reason=reason.strip(),
        approved_by=actor,
    )
    session.add(row)
    session.flush()
    append_event(
        session,
        actor=actor,
        action="artifact.remote_code_approved",
        entity_type="artifact",
        entity_id=art.id,
        payload={
            "lineage": art.lineage,
            "version": art.version,
            "manifest_digest": art.manifest_digest,
            "reason": row.reason,
        },
    )
    return from_row(RemoteCodeApprovalRecord, row)


def approved_digests(session: Session, digests: list[str]) -> set[str]:
    """Which of these manifest digests an admin approved to run their own code."""
    if not digests:
        return set()
    return set(
        session.scalars(
            select(RemoteCodeApproval.manifest_digest).where(
                RemoteCodeApproval.manifest_digest.in_(digests)
            )
        )
    )


def pair_needs_remote_code(pair: Pair) -> bool:
    parts = [pair.target] + ([pair.drafter] if pair.drafter is not None else [])
    return any((p.facts or {}).get("remote_code") for p in parts)


def register_worker_key(
    session: Session,
    *,
    token: Annotated[str, Field(min_length=1, max_length=100, description="The worker token.")],
    public_key: Annotated[
        str,
        Field(
            min_length=1,
            max_length=2000,
            description="Ed25519 public key: 64 hex characters (raw) or a PEM block.",
        ),
    ],
    actor: str,
) -> WorkerKeyRecord:
    """Register the public key a worker token signs its results with (admin)."""
    raw = public_key_raw(public_key)
    tok = session.scalar(select(ApiToken).where(ApiToken.name == token))
    if tok is None or tok.revoked_at is not None:
        raise NotFound(f"no live token named {token}", field="token")
    if tok.role not in ("worker", "admin"):
        raise InvalidInput(
            f"token {token} has role {tok.role}: only workers produce measurements", field="token"
        )
    lock_writes(session)
    fp = fingerprint(raw)
    if session.scalar(select(WorkerKey).where(WorkerKey.fingerprint == fp)) is not None:
        raise Conflict(f"key {fp} is already registered", field="public_key")
    row = WorkerKey(fingerprint=fp, token_name=token, public_key=raw.hex(), created_by=actor)
    session.add(row)
    session.flush()
    append_event(
        session,
        actor=actor,
        action="worker_key.registered",
        entity_type="worker_key",
        entity_id=row.id,
        payload={"fingerprint": fp, "token": token, "public_key": row.public_key},
    )
    return from_row(WorkerKeyRecord, row)


def list_worker_keys(session: Session, *, token: str | None = None) -> list[WorkerKeyRecord]:
    """Registered worker keys (public: an auditor verifies measurements with them)."""
    stmt = select(WorkerKey)
    if token:
        stmt = stmt.where(WorkerKey.token_name == token)
    return [from_row(WorkerKeyRecord, r) for r in session.scalars(stmt.order_by(WorkerKey.id))]


def check_result_signature(
    session: Session, actor: str, signed: Any, expected: dict[str, Any]
) -> dict[str, Any]:
    """A job result's signature, checked on arrival: a live key registered for the token
    that completes the job (the embedded worker may use any registered key), valid over
    exactly the statement the registry computes for what it is about to store."""
    if not isinstance(signed, dict) or not isinstance(signed.get("key"), str):
        raise InvalidInput("result.signature must be {statement, key, signature}", field="result")
    stmt = select(WorkerKey).where(
        WorkerKey.fingerprint == signed["key"], WorkerKey.revoked_at.is_(None)
    )
    if actor.startswith(TOKEN_ACTOR):
        stmt = stmt.where(WorkerKey.token_name == actor[len(TOKEN_ACTOR) :])
    key = session.scalar(stmt)
    if key is None:
        raise InvalidInput(
            f"result signed by key {signed['key']}, which is not registered for {actor}",
            field="result",
        )
    why = check_signature(signed, bytes.fromhex(key.public_key))
    if why is None and signed.get("statement") != expected:
        why = "the signed statement does not describe this result"
    if why is not None:
        raise InvalidInput(f"result signature refused: {why}", field="result")
    return {"statement": expected, "key": key.fingerprint, "signature": signed["signature"]}


def verify_measurement(session: Session, *, id: Id) -> MeasurementVerification:
    """Check a measurement's stored signature against its worker's registered key, as an
    offline verifier would (``registry.trust.measurement_signing.verify_record``)."""
    record = get_measurement(session, id=id, prompts=True)
    row = session.get(Measurement, id)
    assert row is not None
    signed = row.signature
    if not signed:
        return MeasurementVerification(
            measurement_id=id,
            produced_via=row.produced_via,
            signed=False,
            ok=False,
            problems=["the measurement is not signed"],
        )
    key = session.scalar(select(WorkerKey).where(WorkerKey.fingerprint == signed.get("key")))
    if key is None:
        problems = [f"no registered worker key {signed.get('key')}"]
    else:
        problems = verify_record(record.model_dump(mode="json"), key.public_key)
    return MeasurementVerification(
        measurement_id=id,
        produced_via=row.produced_via,
        signed=True,
        key=signed.get("key"),
        token_name=key.token_name if key else None,
        ok=not problems,
        problems=problems,
    )
