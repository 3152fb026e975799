"""Retention and archiving of request records.

Request tags and audit events carry a retention period (``retention_policies``): at least
six months (EU AI Act Art. 19 asks providers of high-risk systems to keep logs at least
that long), configurable upwards. Nothing deletes a record younger than that:

* the database refuses it: a ``BEFORE DELETE`` trigger on ``request_tags`` and
  ``request_ids`` reads the period from ``retention_policies`` (both dialects);
* dropping a PostgreSQL partition goes through :func:`drop_partition_past_retention`;
* audit events are never deleted at all (append-only; their retention is a floor).

:func:`archive_requests` writes whole ingest batches served before a date to a
self-describing archive (registry.requests.archive), reads it back and verifies it, and only
then — with ``purge`` and a date past retention — deletes those rows and drops partitions
that no longer hold anything, recording a ``requests.archived`` audit event either way.
"""

from __future__ import annotations

import calendar
import gzip
import hashlib
import json
from datetime import UTC, date, datetime, time
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field
from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from registry.artifacts.manifest import hash_file
from registry.canonical import canonical_json
from registry.errors import Conflict, InvalidInput, NotFound
from registry.records.trust import ArchiveResult, RetentionKind, RetentionRecord
from registry.requests import archive as request_archive
from registry.requests import partitions as tag_partitions
from registry.tables import (
    AuditEvent,
    Deployment,
    Pair,
    RequestBatch,
    RequestId,
    RequestTag,
    RetentionPolicy,
    utcnow,
)
from registry.trust import audit, audit_tree
from registry.trust.audit import append_event
from registry.trust.bundle_verify import format_time, merkle_root

MIN_MONTHS = 6
KINDS = ("request_tags", "audit_events")
_BATCH_CHUNK = 500


def months_before(when: datetime, months: int) -> datetime:
    """``when`` minus calendar months, the day clamped to the month's length."""
    index = when.year * 12 + (when.month - 1) - months
    year, month = index // 12, index % 12 + 1
    day = min(when.day, calendar.monthrange(year, month)[1])
    return when.replace(year=year, month=month, day=day)


def _policy(session: Session, kind: str) -> RetentionPolicy:
    if kind not in KINDS:
        raise InvalidInput(f"kind must be one of {', '.join(KINDS)}", field="kind")
    row = session.get(RetentionPolicy, kind)
    if row is None:  # a database migrated before the table existed cannot be: seeded there
        raise NotFound(f"no retention policy for {kind}", field="kind")
    return row


def _record(row: RetentionPolicy, now: datetime | None = None) -> RetentionRecord:
    months = max(row.months, MIN_MONTHS)
    return RetentionRecord(
        kind=row.kind,  # type: ignore[arg-type]
        months=months,
        horizon=months_before(now or utcnow(), months),
        updated_by=row.updated_by,
        updated_at=row.updated_at,
    )


def get_retention(session: Session, *, kind: RetentionKind = "request_tags") -> RetentionRecord:
    """How long records of ``kind`` are kept, and the horizon before which they may go."""
    return _record(_policy(session, kind))


def set_retention(
    session: Session,
    *,
    kind: RetentionKind,
    months: Annotated[int, Field(ge=MIN_MONTHS, le=1200)],
    actor: str,
) -> RetentionRecord:
    """Change a retention period (at least six months); audited."""
    if not isinstance(months, int) or not MIN_MONTHS <= months <= 1200:
        raise InvalidInput(
            f"months must be from {MIN_MONTHS} (the legal minimum kept here) to 1200",
            field="months",
        )
    audit.lock_writes(session)
    row = _policy(session, kind)
    before = row.months
    row.months, row.updated_by, row.updated_at = months, actor, utcnow()
    session.flush()
    append_event(
        session,
        actor=actor,
        action="retention.changed",
        entity_type="retention",
        entity_id=kind,
        payload={"kind": kind, "months": months, "previous_months": before},
    )
    return _record(row)


def horizon(session: Session, kind: str = "request_tags", now: datetime | None = None) -> datetime:
    return _record(_policy(session, kind), now).horizon


def check_past_retention(session: Session, until: datetime, *, field: str = "before") -> None:
    """Refuse to delete request records up to ``until`` unless all are past retention."""
    limit = horizon(session)
    if until > limit:
        months = _policy(session, "request_tags").months
        raise InvalidInput(
            f"{field} {until.date().isoformat()} is within the {months}-month retention "
            f"period: only records served before {limit.date().isoformat()} may be deleted",
            field=field,
        )


def drop_partition_past_retention(session: Session, month: date) -> str:
    """PostgreSQL: detach and drop one month's tag partition, only if the whole month is
    past retention and the partition is empty of rows not yet archived (caller's check)."""
    month = tag_partitions.month_start(month)
    end = tag_partitions.add_months(month, 1)
    check_past_retention(session, datetime.combine(end, time(), UTC), field="partition")
    name = tag_partitions.partition_name(month)
    conn = session.connection()
    if name not in tag_partitions.existing_partitions(conn):
        raise NotFound(f"no partition {name}", field="partition")
    conn.execute(text(f"ALTER TABLE request_tags DETACH PARTITION {tag_partitions.SCHEMA}.{name}"))
    conn.execute(text(f"DROP TABLE {tag_partitions.SCHEMA}.{name}"))
    return name


# --- archiving --------------------------------------------------------------------------


def _archivable_batches(session: Session, cutoff: datetime) -> list[int]:
    """Batches whose every tag was served before ``cutoff`` (whole batches only, so each
    archived batch's Merkle root can be recomputed from the archive alone)."""
    rows = session.execute(
        select(RequestId.batch_id)
        .group_by(RequestId.batch_id)
        .having(func.max(RequestId.served_at) < cutoff)
        .order_by(RequestId.batch_id)
    )
    return [r[0] for r in rows]


def _rows_for(session: Session, batch_ids: list[int]) -> list[dict[str, Any]]:
    rows = session.execute(
        select(
            RequestTag,
            RequestId.tag_digest,
            RequestId.batch_id,
            Pair.pair_digest,
            Deployment.name,
            RequestId.client_request_id,
        )
        .join(
            RequestId,
            (RequestId.request_id == RequestTag.request_id)
            & (RequestId.served_at == RequestTag.served_at),
        )
        .join(Pair, Pair.id == RequestTag.pair_id)
        .join(Deployment, Deployment.id == RequestTag.deployment_id)
        .where(RequestId.batch_id.in_(batch_ids))
        .order_by(RequestId.batch_id, RequestId.request_id)
    )
    out = []
    # The client's id, which its tag digest covers (a batch's keys share one source, so key
    # order is client-id order within a batch).
    for tag, digest, batch_id, pair_digest, dep, client_id in rows:
        out.append(
            {
                "request_id": tag.request_id if client_id is None else client_id,
                "deployment": dep,
                "pair_digest": pair_digest,
                "served_at": format_time(tag.served_at),
                "input_tokens": tag.input_tokens,
                "output_tokens": tag.output_tokens,
                "spec": tag.spec,
                "pair_filled": tag.pair_filled,
                "consistent": tag.consistent,
                "tag_digest": digest,
                "batch_id": batch_id,
            }
        )
    return out


def archive_requests(
    session: Session,
    *,
    before: date,
    directory: str,
    purge: bool = False,
    key_path: str | None = None,
    origin: str | None = None,
    actor: str,
) -> ArchiveResult:
    """Archive every whole ingest batch served before ``before`` into ``directory`` (a new
    or empty folder the server can write), verify the archive, and with ``purge`` delete
    the archived rows and drop emptied partitions — refused unless past retention."""
    from registry.services import transparency  # transparency is a sibling service

    cutoff = datetime.combine(before, time(), UTC)
    if purge:
        check_past_retention(session, cutoff)
    out = Path(directory)
    if out.exists() and any(out.iterdir()):
        raise InvalidInput(f"directory {out} is not empty", field="directory")
    out.mkdir(parents=True, exist_ok=True)
    audit.lock_writes(session)
    batch_ids = _archivable_batches(session, cutoff)
    if not batch_ids:
        raise NotFound(f"no whole ingest batch was served before {before}", field="before")

    # The checkpoint the ingest events will be proven against (signed if not yet).
    cp = transparency.sign_log_checkpoint(session, key_path=key_path, origin=origin, actor=actor)
    batches = {
        b.id: b for b in session.scalars(select(RequestBatch).where(RequestBatch.id.in_(batch_ids)))
    }
    events = {
        e.seq: e
        for e in session.scalars(
            select(AuditEvent).where(AuditEvent.seq.in_([b.audit_seq for b in batches.values()]))
        )
    }
    digests: list[str] = []
    count = 0
    with gzip.open(out / request_archive.REQUESTS, "wt", encoding="utf-8") as fh:
        for i in range(0, len(batch_ids), _BATCH_CHUNK):
            for row in _rows_for(session, batch_ids[i : i + _BATCH_CHUNK]):
                fh.write(json.dumps(row, sort_keys=True) + "\n")
                digests.append(row["tag_digest"])
                count += 1
    with open(out / request_archive.BATCHES, "w", encoding="utf-8") as fh:
        for bid in batch_ids:
            b = batches[bid]
            ev = events[b.audit_seq]  # type: ignore[index]
            index = audit.leaf_index(session, ev.seq)
            assert index is not None and index < cp.tree_size  # integrated before signing
            proof = audit_tree.inclusion_proof(session, index, cp.tree_size)
            entry = {
                "batch_id": b.id,
                "audit_seq": b.audit_seq,
                "merkle_root": b.merkle_root,
                "stored": b.stored,
                "created_at": format_time(b.created_at),
                "event": {
                    "leaf_data": canonical_json(audit.event_body(ev)).decode("utf-8"),
                    "index": index,
                    "path": [h.hex() for h in proof.path],
                },
            }
            fh.write(json.dumps(entry, sort_keys=True) + "\n")
    (out / request_archive.CHECKPOINT).write_text(cp.note, encoding="utf-8")
    files = {}
    for name in (request_archive.REQUESTS, request_archive.BATCHES, request_archive.CHECKPOINT):
        path = out / name
        files[name] = {"sha256": hash_file(path).sha256, "bytes": path.stat().st_size}
    manifest = {
        "format": request_archive.FORMAT,
        "created_at": format_time(utcnow()),
        "created_by": actor,
        "before": before.isoformat(),
        "counts": {"requests": count, "batches": len(batch_ids)},
        "merkle_root": merkle_root(digests),
        "merkle_root_covers": "RFC 6962 root over tag_digest of every line of "
        f"{request_archive.REQUESTS}, in file order",
        "files": files,
        "log_origin": cp.origin,
        "verifier_key": cp.verifier_key,
        "checkpoint": {"tree_size": cp.tree_size, "root_hash": cp.root_hash},
        "description": request_archive.__doc__,
    }
    manifest_bytes = json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8")
    (out / request_archive.MANIFEST).write_bytes(manifest_bytes)

    report = request_archive.verify_archive(out, trusted_log_key=cp.verifier_key)
    if not report.ok:
        raise Conflict(
            "the archive did not verify after writing; nothing was deleted: "
            + "; ".join(report.failures()),
            field="directory",
        )
    dropped: list[str] = []
    if purge:
        dropped = _purge(session, batch_ids, cutoff)
    manifest_sha = hashlib.sha256(manifest_bytes).hexdigest()
    event = append_event(
        session,
        actor=actor,
        action="requests.archived",
        entity_type="request_archive",
        entity_id=manifest_sha[:16],
        payload={
            "before": before.isoformat(),
            "manifest_sha256": manifest_sha,
            "merkle_root": manifest["merkle_root"],
            "requests": count,
            "batches": len(batch_ids),
            "first_batch_id": batch_ids[0],
            "last_batch_id": batch_ids[-1],
            "checkpoint_size": cp.tree_size,
            "purged": purge,
            "dropped_partitions": dropped,
        },
    )
    return ArchiveResult(
        directory=str(out),
        before=before,
        manifest=manifest,
        manifest_sha256=manifest_sha,
        batches=len(batch_ids),
        requests=count,
        purged=purge,
        dropped_partitions=dropped,
        audit_seq=event.seq,
    )


def _purge(session: Session, batch_ids: list[int], cutoff: datetime) -> list[str]:
    """Delete the archived batches' rows; on PostgreSQL drop partitions left empty."""
    dropped: list[str] = []
    if session.get_bind().dialect.name == "postgresql":
        conn = session.connection()
        for name in tag_partitions.existing_partitions(conn):
            if not name.startswith(f"{tag_partitions.PARENT}_y"):
                continue
            month = date(int(name[-7:-3]), int(name[-2:]), 1)
            if datetime.combine(tag_partitions.add_months(month, 1), time(), UTC) > cutoff:
                continue
            # Drop only a partition whose every row belongs to an archived batch.
            left = conn.execute(
                text(
                    f"SELECT count(*) FROM {tag_partitions.SCHEMA}.{name} t "
                    "JOIN request_ids i ON i.request_id = t.request_id "
                    "WHERE NOT (i.batch_id = ANY(:ids))"
                ),
                {"ids": batch_ids},
            ).scalar()
            if left == 0:
                dropped.append(drop_partition_past_retention(session, month))
    for i in range(0, len(batch_ids), _BATCH_CHUNK):
        chunk = batch_ids[i : i + _BATCH_CHUNK]
        ids = select(RequestId.request_id).where(RequestId.batch_id.in_(chunk))
        session.execute(
            delete(RequestTag).where(RequestTag.request_id.in_(ids), RequestTag.served_at < cutoff)
        )
        session.execute(delete(RequestId).where(RequestId.batch_id.in_(chunk)))
    session.flush()
    return dropped


def get_archived_request(
    session: Session,
    *,
    directory: str,
    request_id: str,
    trusted_key: str | None = None,
    key_path: str | None = None,
    origin: str | None = None,
) -> dict[str, Any]:
    """Reconstruct an archived request from its archive (verified whole first), with the
    pair that served it as the registry still records it. Without ``trusted_key`` the
    archive is pinned to this registry's own log key (beside ``key_path``, from the
    operation's context)."""
    from registry.services.requests import pair_with_manifests

    out = Path(directory)
    if trusted_key is None:
        # The registry knows its own log's key: the archive is pinned to it.
        from registry.services.transparency import published_verifier

        own = published_verifier(key_path, origin)
        trusted_key = own.vkey if own is not None else None
    try:
        found = request_archive.find_request(out, request_id, trusted_log_key=trusted_key)
    except KeyError as exc:
        raise NotFound(f"{request_id!r} is not in the archive {out}", field="request_id") from exc
    except (OSError, ValueError) as exc:
        raise InvalidInput(
            f"directory {out}: not a readable archive: {exc}", field="directory"
        ) from exc
    pair = session.scalar(select(Pair).where(Pair.pair_digest == found["tag"]["pair_digest"]))
    found["pair"] = pair_with_manifests(pair) if pair is not None else None
    return found
