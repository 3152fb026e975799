"""Self-contained audit bundles: everything about one request, verifiable with no database.

A bundle (format ``pairreg.audit-bundle/1``, checked by :mod:`registry.trust.bundle_verify`) holds:

* ``tag`` with its digest, and ``inclusion``: the RFC 6962 audit path from the tag's digest to
  the Merkle root its ingest batch recorded (``log2(batch size)`` hashes, not the batch);
* ``pair`` with both artifacts, their full manifests, sources (Hub commit ids) and provenance;
* ``deployment_event`` that made the pair live, the ``validation`` that allowed it, and the
  flags open at ``served_at``;
* ``events``: the audit sequence numbers of the artifact, pair, validation, promotion and
  ingest events;
* ``log``: a C2SP checkpoint of the audit log's Merkle tree (signed now, or the newest one
  if the log has not grown since) and, for every cited event, its exact leaf bytes and
  inclusion path (docs/transparency.md), so each cited event is proven in log2(n) hashes
  against a checkpoint a witness may have co-signed.

Size: at most six cited events, each with a path of log2(n) hashes, so a bundle is bounded
whatever happened between the artifact's registration and the request (format version 1
carried every audit event in that range, one per ingest batch: ~0.4 MB per thousand
batches).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.canonical import canonical_json
from registry.errors import InvalidInput
from registry.services.requests import audit_request, stored_key
from registry.tables import AuditEvent, RequestId
from registry.trust import audit, audit_tree
from registry.trust.bundle_verify import BUNDLE_FORMAT, merkle_path, merkle_root


def _seq(session: Session, action: str, entity_type: str, entity_id: str | int) -> int | None:
    return session.scalar(
        select(AuditEvent.seq)
        .where(
            AuditEvent.action == action,
            AuditEvent.entity_type == entity_type,
            AuditEvent.entity_id == str(entity_id),
        )
        .order_by(AuditEvent.seq)
        .limit(1)
    )


def _seq_with_payload(
    session: Session,
    actions: tuple[str, ...],
    entity_type: str,
    entity_id: str,
    key: str,
    value: Any,
) -> int | None:
    rows = session.execute(
        select(AuditEvent.seq, AuditEvent.payload).where(
            AuditEvent.action.in_(actions),
            AuditEvent.entity_type == entity_type,
            AuditEvent.entity_id == entity_id,
        )
    )
    for seq, payload in rows:
        if json.loads(payload).get(key) == value:
            return seq
    return None


def build_bundle(
    session: Session,
    *,
    request_id: str,
    source: Annotated[
        str | None,
        Field(max_length=120, description="The source that sent the id, if two sources did."),
    ] = None,
    key_path: str | None = None,
    origin: str | None = None,
) -> dict[str, Any]:
    """The bundle for one request, with a checkpoint signed now (needs the audit key:
    ``key_path`` and the log's ``origin`` come from the operation's context)."""
    answer = audit_request(session, request_id=request_id, source=source)
    pair = answer.pair
    refs: dict[str, int | None] = {
        "target_added": _seq(session, "artifact.added", "artifact", pair["target"]["id"]),
        "pair_registered": _seq(session, "pair.registered", "pair", pair["id"]),
        "ingest_batch": answer.batch["audit_seq"],
    }
    if pair.get("drafter"):
        refs["drafter_added"] = _seq(session, "artifact.added", "artifact", pair["drafter"]["id"])
    if answer.deployment_event is not None:
        refs["promotion"] = _seq_with_payload(
            session,
            ("deployment.promote", "deployment.rollback"),
            "deployment",
            answer.deployment["name"],
            "seq",
            answer.deployment_event["seq"],
        )
    if answer.validation is not None:
        refs["validation"] = _seq_with_payload(
            session,
            ("pair.validation",),
            "pair",
            str(pair["id"]),
            "validation_id",
            answer.validation["id"],
        )
    cited = {k: v for k, v in refs.items() if v is not None}

    from registry.services.transparency import key_file  # a sibling service

    path = key_file(key_path)
    if not path.exists():
        raise InvalidInput(f"no audit signing key at {path}: run `pairreg init`", field="key")

    # Sorted here, not by the database: ingest orders a batch's leaves by Python's code-point
    # order, which a PostgreSQL collation other than C may not share.
    leaves = sorted(
        (r, d)
        for r, d in session.execute(
            select(RequestId.request_id, RequestId.tag_digest).where(
                RequestId.batch_id == answer.tag.batch_id
            )
        )
    )
    ids = [r for r, _ in leaves]
    digests = [d for _, d in leaves]
    index = ids.index(stored_key(answer.tag.source, answer.tag.request_id))
    root = merkle_root(digests)
    bundle: dict[str, Any] = {
        "format": BUNDLE_FORMAT,
        "request_id": request_id,
        "tag": answer.tag.model_dump(mode="json"),
        "pair": pair,
        "deployment": answer.deployment,
        "deployment_event": answer.deployment_event,
        "live_pair_digest": answer.live_pair_digest,
        "validation": answer.validation,
        "open_flags": answer.open_flags,
        "batch": answer.batch,
        "inclusion": {
            "index": index,
            "size": len(digests),
            "path": merkle_path(digests, index),
            "root": root,
        },
        "events": cited,
        "log": _log_proofs(session, cited, str(path), origin),
    }
    return bundle


def _log_proofs(
    session: Session, cited: dict[str, int], key_path: str, origin: str | None
) -> dict[str, Any]:
    """The cited events' inclusion proofs in the log's Merkle tree, up to a C2SP
    checkpoint: each event checks in log2(n) hashes, however long the log."""
    from registry.services import transparency  # a sibling service

    cp = transparency.sign_log_checkpoint(
        session, key_path=key_path, origin=origin, actor="system:bundle"
    )
    events = {}
    for seq in sorted(set(cited.values())):
        ev = session.get(AuditEvent, seq)
        index = audit.leaf_index(session, seq)
        assert ev is not None and index is not None and index < cp.tree_size
        proof = audit_tree.inclusion_proof(session, index, cp.tree_size)
        events[str(seq)] = {
            "leaf_data": canonical_json(audit.event_body(ev)).decode("utf-8"),
            "index": index,
            "path": [h.hex() for h in proof.path],
        }
    return {"checkpoint": cp.note, "verifier_key": cp.verifier_key, "events": events}
