"""Ingesting request tags (idempotent, batched) and answering "which pair served request X".

Ingest of one batch, in one transaction:

1. validate every tag; resolve deployments and pair digests (unknown digest: 422);
2. work out the pair live on each tag's deployment at its ``served_at`` from the deployment's
   event history (read once per deployment per batch, then a binary search per tag); a tag
   without a digest gets that pair, a tag whose digest differs is stored as *inconsistent*;
3. digest each tag (``registry.requests.encoding``: the canonical bytes without a dict per tag);
   the same id twice in the batch with different content keeps the first and reports the
   other as a conflict;
4. store the new ids and their tags (``registry.requests.store``: on PostgreSQL a bulk ``COPY``,
   or a staging table and one set-based statement); an id already recorded with the same
   digest is a retry (no-op), with a different digest that one tag is reported as a conflict
   and every other tag is stored;
5. append one audit event with the batch's Merkle root over the stored tags' digests.

Request ids are the client's, so they are unique only per **source**, the actor that ingests
them (``token:<name>`` over HTTP, ``local:<user>`` embedded): the stored key is
``<source>/<client id>`` (:func:`stored_key`), and the client's id is kept beside it
(``request_ids.client_request_id``) for look-ups. One client therefore cannot claim, or
clash with, an id another client sends; a clash within one source is that source's own
conflict, reported per tag and never a reason to refuse the rest of the batch.

No log-wide lock: the event is queued for the audit sequencer (``registry.trust.audit``), so
batches from many clients insert in parallel; batches feeding the same online monitor take
that monitor's lock in turn (``registry.services.online``). Ids are inserted sorted, so two
batches sharing ids lock them in the same order and cannot deadlock.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import hashlib
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError
from sqlalchemy import and_, bindparam, case, func, or_, select, update
from sqlalchemy.orm import Session, aliased

from registry.canonical import digest_of
from registry.errors import Conflict, InvalidInput, NotFound
from registry.governance.timeline import live_event, load_timelines
from registry.params import Limit, RequestCursor, Timestamp
from registry.records.requests import (
    MAX_BATCH,
    DecodedTags,
    IngestResult,
    RequestAudit,
    RequestCounts,
    RequestPage,
    RequestTagRecord,
    TagConflict,
    TagIn,
)
from registry.refs import resolve_deployment, resolve_pair
from registry.requests import store as tag_store
from registry.requests.encoding import json_string, tag_json, time_texts, validated_counters_json
from registry.requests.gc_pause import gc_paused
from registry.requests.store import Row
from registry.services import online
from registry.services.artifacts import to_record as artifact_record
from registry.services.base import check_limit
from registry.services.pairs import to_record as pair_record
from registry.tables import (
    Deployment,
    DeploymentEvent,
    DriftFlag,
    Pair,
    RequestBatch,
    RequestId,
    RequestTag,
    Validation,
)
from registry.trust.audit import append_event
from registry.trust.bundle_verify import format_time, merkle_root

_CHUNK = 5000  # ids per IN (...) list; SQLite's variable limit is 32766
_SOURCE_MAX = 120  # request_ids.source


def source_of(actor: str) -> str:
    """The namespace of an ingesting actor's request ids: the actor with ``%`` and ``/``
    escaped, so the first ``/`` of a stored key always ends the source (two different
    (source, client id) pairs never make the same key). A very long actor keeps a prefix and
    a digest of the whole."""
    src = actor.replace("%", "%25").replace("/", "%2F")
    if len(src) > _SOURCE_MAX:
        src = src[: _SOURCE_MAX - 17] + "~" + hashlib.sha256(actor.encode()).hexdigest()[:16]
    return src


def stored_key(source: str, request_id: str) -> str:
    """The unique key of a client's request id within its source (the bare id for tags
    stored before ids were namespaced, whose source is ``''``)."""
    return f"{source}/{request_id}" if source else request_id


# --- ingest -----------------------------------------------------------------------------


_TAGS = TypeAdapter(list[TagIn])


def _parse_tags(tags: Sequence[TagIn | dict[str, Any]]) -> list[TagIn]:
    """Tags as :class:`TagIn`, or as the :class:`FastTag` structs of the same shape that the
    HTTP edge decoded (``DecodedTags``); local callers may pass dicts, validated here in one
    call."""
    if not isinstance(tags, list | tuple):
        raise InvalidInput("tags must be a list", field="tags")
    if len(tags) > MAX_BATCH:
        raise InvalidInput(
            f"a batch holds at most {MAX_BATCH} tags, got {len(tags)}: split it", field="tags"
        )
    if type(tags) is DecodedTags or all(type(t) is TagIn for t in tags):
        return list(tags)  # type: ignore[arg-type]
    try:
        return _TAGS.validate_python(list(tags))
    except ValidationError as exc:
        err = exc.errors()[0]
        i, *rest = err.get("loc", ()) or (0,)
        loc = ".".join(str(p) for p in rest)
        raise InvalidInput(f"tags[{i}].{loc}: {err.get('msg')}", field=f"tags.{i}.{loc}") from exc


def _pair_ids(session: Session, digests: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for start in range(0, len(digests), _CHUNK):
        chunk = digests[start : start + _CHUNK]
        out.update(
            {
                d: i
                for d, i in session.execute(
                    select(Pair.pair_digest, Pair.id).where(Pair.pair_digest.in_(chunk))
                )
            }
        )
    return out


def _rows(
    session: Session, parsed: list[TagIn], prefix: str
) -> tuple[list[Row], list[str], list[TagConflict], dict[str, int]]:
    """Resolve names, fill in or check each tag's pair, digest it: one :class:`Row` per
    distinct request id, keyed ``prefix + id`` and sorted by key (plus the deployment names,
    sorted; the tags whose id an earlier tag of the batch holds with other content; and each
    key's position in the batch)."""
    dep_names = sorted({t.deployment for t in parsed})
    deps: dict[str, int] = {
        n: i
        for n, i in session.execute(
            select(Deployment.name, Deployment.id).where(Deployment.name.in_(dep_names))
        )
    }
    unknown = [n for n in dep_names if n not in deps]
    if unknown:
        raise InvalidInput(f"unknown deployment(s): {', '.join(unknown)}", field="deployment")
    digests = sorted({t.pair_digest for t in parsed if t.pair_digest})
    pair_ids = _pair_ids(session, digests)
    missing = [d for d in digests if d not in pair_ids]
    if missing:
        raise InvalidInput(
            f"unknown pair digest(s): {', '.join(missing[:20])}", field="pair_digest"
        )
    digest_of_pair = {i: d for d, i in pair_ids.items()}
    timelines = load_timelines(session, deps.values())
    need = {
        pid
        for tl in timelines.values()
        for pid in tl.pair_ids
        if pid is not None and pid not in digest_of_pair
    }
    if need:
        digest_of_pair.update(
            {
                i: d
                for i, d in session.execute(
                    select(Pair.id, Pair.pair_digest).where(Pair.id.in_(sorted(need)))
                )
            }
        )
    # Per deployment, once: its id, its name as JSON, its moves (for a binary search per tag).
    per_dep = {
        name: (dep_id, json_string(name), timelines[dep_id].times, timelines[dep_id].pair_ids)
        for name, dep_id in deps.items()
    }
    pair_json = {i: json_string(d) for i, d in digest_of_pair.items()}
    sha256, served_text = hashlib.sha256, time_texts()

    rows: dict[str, Row] = {}
    first: dict[str, int] = {}
    clashes: list[TagConflict] = []
    for i, tag in enumerate(parsed):
        dep_id, dep_text, times, live_ids = per_dep[tag.deployment]
        at = tag.served_at
        k = bisect.bisect_right(times, at) - 1  # Timeline.live_at, inlined
        live = live_ids[k] if k >= 0 else None
        if tag.pair_digest is None:
            if live is None:
                raise InvalidInput(
                    f"tags[{i}]: no pair was live on {tag.deployment} at "
                    f"{format_time(at)}, so the pair digest cannot be filled in",
                    field=f"tags.{i}.pair_digest",
                )
            pair_id, filled, consistent = live, True, True
        else:
            pair_id, filled = pair_ids[tag.pair_digest], False
            consistent = pair_id == live
        sp = tag.spec  # a validated SpecCounters: plain ints
        spec = (
            None
            if sp is None
            else validated_counters_json(
                sp.num_spec_steps,
                sp.num_draft_tokens,
                sp.num_accepted_draft_tokens,
                sp.acceptance_histogram,
            )
        )
        digest = sha256(
            tag_json(
                tag.request_id,
                dep_text,
                pair_json[pair_id],
                served_text(at),
                tag.input_tokens,
                tag.output_tokens,
                "null" if spec is None else spec,
            )
        ).hexdigest()
        key = prefix + tag.request_id
        prior = rows.get(key)
        if prior is not None:
            if prior.tag_digest != digest:
                clashes.append(TagConflict(index=i, request_id=tag.request_id, reason="batch"))
            continue  # the first tag under an id is the one the batch stands for
        first[key] = i
        rows[key] = Row(
            key,
            at,
            dep_id,
            pair_id,
            tag.input_tokens,
            tag.output_tokens,
            spec,
            filled,
            consistent,
            digest,
        )
    return [rows[r] for r in sorted(rows)], dep_names, clashes, first


def ingest_requests(
    session: Session,
    *,
    tags: Annotated[list[TagIn] | list[dict[str, Any]], Field(union_mode="left_to_right")],
    actor: str,
    home_dir: str | None = None,
) -> IngestResult:
    """Store a batch of tags; the same tags again change nothing (see the module docstring).
    ``home_dir`` (from the operation's context) is where the online monitors re-check a
    recovered pair's economics gates."""
    with gc_paused():  # the batch's objects all live until it ends: nothing to collect
        return _ingest(session, tags, actor, home_dir)


def _ingest(
    session: Session,
    tags: Sequence[TagIn | dict[str, Any]],
    actor: str,
    home_dir: str | None = None,
) -> IngestResult:
    parsed = _parse_tags(tags)
    source = source_of(actor)
    if not parsed:
        return IngestResult(received=0, stored=0, duplicates=0, inconsistent=0, source=source)
    prefix = stored_key(source, "")
    rows, dep_names, clashes, first = _rows(session, parsed, prefix)
    received_digest = digest_of([r.tag_digest for r in rows])
    batch_id, stored, taken = tag_store.store(
        session, rows, received_digest=received_digest, actor=actor, source=source
    )
    cut = len(prefix)
    clashes += [
        TagConflict(index=first[r.request_id], request_id=r.request_id[cut:], reason="recorded")
        for r in taken
    ]
    clashes.sort(key=lambda c: c.index)
    duplicates = len(parsed) - len(stored) - len(clashes)
    if batch_id is None:
        return IngestResult(
            received=len(parsed),
            stored=0,
            duplicates=duplicates,
            conflicted=len(clashes),
            conflicts=clashes,
            inconsistent=0,
            source=source,
        )
    inconsistent_ids = [r.request_id[cut:] for r in stored if not r.consistent]
    root = merkle_root([r.tag_digest for r in stored])
    times = [r.served_at for r in stored]
    observed = online.prepare(_observations(parsed, stored, cut))  # before the monitors' locks
    event = append_event(
        session,
        actor=actor,
        action="requests.ingested",
        entity_type="request_batch",
        entity_id=batch_id,
        payload={
            "batch_id": batch_id,
            "merkle_root": root,
            "received_digest": received_digest,
            "received": len(parsed),
            "stored": len(stored),
            "duplicates": duplicates,
            "conflicted": len(clashes),
            "inconsistent": len(inconsistent_ids),
            "source": source,
            "deployments": dep_names,
            "first_served_at": format_time(min(times)),
            "last_served_at": format_time(max(times)),
        },
    )
    session.execute(
        update(RequestBatch)
        .where(RequestBatch.id == batch_id)
        .values(
            merkle_root=root,
            stored=len(stored),
            duplicates=duplicates,
            inconsistent=len(inconsistent_ids),
            audit_seq=event.seq,
        )
    )
    # Online acceptance: each monitor's lock orders the concurrent batches feeding it.
    online.observe(session, observed, actor=actor, home_dir=home_dir)
    return IngestResult(
        received=len(parsed),
        stored=len(stored),
        duplicates=duplicates,
        conflicted=len(clashes),
        conflicts=clashes,
        inconsistent=len(inconsistent_ids),
        inconsistent_ids=inconsistent_ids[:100],
        source=source,
        batch_id=batch_id,
        audit_seq=event.seq,
        merkle_root=root,
    )


# --- reading ----------------------------------------------------------------------------


def _tag_select():  # type: ignore[no-untyped-def]
    return (
        select(
            RequestTag,
            RequestId.tag_digest,
            RequestId.batch_id,
            Pair.pair_digest,
            Deployment.name,
            RequestId.source,
            RequestId.client_request_id,
        )
        .join(
            RequestId,
            and_(
                RequestId.request_id == RequestTag.request_id,
                RequestId.served_at == RequestTag.served_at,
            ),
        )
        .join(Pair, Pair.id == RequestTag.pair_id)
        .join(Deployment, Deployment.id == RequestTag.deployment_id)
    )


_RECORD_COLUMNS = 7  # _tag_select's columns


def _to_record(row: Any) -> RequestTagRecord:
    tag, tag_digest, batch_id, pair_digest, dep_name, source, client_id = row
    return RequestTagRecord(
        request_id=tag.request_id if client_id is None else client_id,
        source=source or "",
        deployment=dep_name,
        pair_digest=pair_digest,
        served_at=tag.served_at,
        input_tokens=tag.input_tokens,
        output_tokens=tag.output_tokens,
        spec=tag.spec,
        pair_filled=tag.pair_filled,
        consistent=tag.consistent,
        tag_digest=tag_digest,
        batch_id=batch_id,
    )


def resolve_key(session: Session, request_id: str, source: str | None = None) -> str:
    """The stored key of a client's request id: within ``source`` when given (its key, by
    primary key); otherwise the one source that sent that id (or a stored key itself).
    Ids are unique per source only, so an id two sources sent is ambiguous: 409 naming the
    sources, to be asked again with one of them."""
    if source is not None:
        key = stored_key(source, request_id)
        if session.get(RequestId, key) is None:
            raise NotFound(
                f"no request tagged {request_id!r} from source {source!r}", field="request_id"
            )
        return key
    found = session.execute(
        select(RequestId.request_id, RequestId.source)
        .where(or_(RequestId.client_request_id == request_id, RequestId.request_id == request_id))
        .order_by(RequestId.source)
        .limit(51)
    ).all()
    if not found:
        raise NotFound(f"no request tagged {request_id!r}", field="request_id")
    keys = {k for k, _ in found}
    if len(keys) > 1:
        sources = sorted({s for _, s in found})
        raise Conflict(
            f"request id {request_id!r} was sent by {len(keys)} sources "
            f"({', '.join(repr(x) for x in sources[:10])}): name one with source",
            field="source",
            details={"sources": sources},
        )
    return found[0][0]


def load_tag(
    session: Session, request_id: str, source: str | None = None
) -> tuple[RequestTag, RequestTagRecord]:
    """One tag by id in one round trip: ``request_ids`` (its primary key, or the client-id
    index) supplies ``served_at``, which prunes ``request_tags`` to one partition at execution
    time. An id two sources sent is resolved by :func:`resolve_key` (and refused there)."""
    if source is not None:
        where = RequestId.request_id == stored_key(source, request_id)
    else:
        where = or_(RequestId.client_request_id == request_id, RequestId.request_id == request_id)
    rows = session.execute(_tag_select().where(where).limit(2)).all()
    if len(rows) != 1:
        resolve_key(session, request_id, source)  # raises: not found, or which sources
    return rows[0][0], _to_record(rows[0])


_SOURCE = Annotated[
    str | None,
    Field(
        max_length=_SOURCE_MAX,
        description="The source that sent the id (as shown in a tag's `source`); needed "
        "only when two sources sent the same id.",
    ),
]


def get_request_tag(
    session: Session, *, request_id: str, source: _SOURCE = None
) -> RequestTagRecord:
    return load_tag(session, request_id, source)[1]


def _event_record(ev: DeploymentEvent, digests: dict[int, str]) -> dict[str, Any]:
    return {
        "id": ev.id,
        "seq": ev.seq,
        "action": ev.action,
        "from_pair_id": ev.from_pair_id,
        "from_pair_digest": digests.get(ev.from_pair_id) if ev.from_pair_id else None,
        "to_pair_id": ev.to_pair_id,
        "to_pair_digest": digests.get(ev.to_pair_id) if ev.to_pair_id else None,
        "validation_id": ev.validation_id,
        "actor": ev.actor,
        "reason": ev.reason,
        "at": format_time(ev.at),
    }


def _validation_record(v: Validation) -> dict[str, Any]:
    return {
        "id": v.id,
        "pair_id": v.pair_id,
        "policy_name": v.policy_name,
        "policy_digest": v.policy_digest,
        "measurement_id": v.measurement_id,
        "deployment": v.deployment,
        "gates": v.gates,
        "passed": v.passed,
        "mlflow_run_id": v.mlflow_run_id,
        "actor": v.actor,
        "created_at": format_time(v.created_at),
    }


def _flag_record(f: DriftFlag) -> dict[str, Any]:
    return {
        "id": f.id,
        "kind": f.kind,
        "pair_id": f.pair_id,
        "artifact_id": f.artifact_id,
        "severity": f.severity,
        "state": f.state,
        "summary": f.summary,
        "opened_at": format_time(f.opened_at),
        "closed_at": format_time(f.closed_at) if f.closed_at else None,
    }


def pair_with_manifests(pair: Pair) -> dict[str, Any]:
    out = pair_record(pair).model_dump(mode="json")
    out["target"] = artifact_record(pair.target, with_manifest=True).model_dump(mode="json")
    if pair.drafter is not None:
        out["drafter"] = artifact_record(pair.drafter, with_manifest=True).model_dump(mode="json")
    return out


# audit_request's three statements, built once (constructing them is most of a small
# query's cost in Python); values are bound per call.
_FROM_PAIR, _TO_PAIR = aliased(Pair), aliased(Pair)
_AUDIT_TAG = (
    _tag_select()
    .add_columns(Pair, Deployment, RequestBatch)
    .join(RequestBatch, RequestBatch.id == RequestId.batch_id)
    .where(RequestId.request_id == bindparam("request_id"))
)
_AUDIT_MOVE = (
    select(_FROM_PAIR.pair_digest, _TO_PAIR.pair_digest, Validation)
    .select_from(DeploymentEvent)
    .outerjoin(_FROM_PAIR, _FROM_PAIR.id == DeploymentEvent.from_pair_id)
    .outerjoin(_TO_PAIR, _TO_PAIR.id == DeploymentEvent.to_pair_id)
    .outerjoin(Validation, Validation.id == DeploymentEvent.validation_id)
    .where(DeploymentEvent.id == bindparam("event_id"))
)
_AUDIT_FLAGS = (
    select(DriftFlag)
    .where(
        or_(
            DriftFlag.pair_id == bindparam("pair_id"),
            DriftFlag.artifact_id.in_(bindparam("artifact_ids", expanding=True)),
        ),
        DriftFlag.opened_at <= bindparam("at"),
        or_(DriftFlag.closed_at.is_(None), DriftFlag.closed_at > bindparam("at")),
    )
    .order_by(DriftFlag.id)
)


def audit_request(session: Session, *, request_id: str, source: _SOURCE = None) -> RequestAudit:
    """Which pair served this request, and everything needed to reconstruct that answer."""
    # The tag with its pair (and that pair's artifacts), deployment and batch; the move live
    # when it was served, with both pairs' digests and the validation it cited; the drift
    # flags open then.
    key = resolve_key(session, request_id, source)
    row = session.execute(_AUDIT_TAG, {"request_id": key}).one()
    tag, record = row[0], _to_record(row[:_RECORD_COLUMNS])
    pair, dep, batch = row[_RECORD_COLUMNS:]
    live = live_event(session, dep.id, tag.served_at)
    digests: dict[int, str] = {pair.id: pair.pair_digest}
    validation = None
    making_live = None
    if live is not None:
        from_digest, to_digest, cited = session.execute(_AUDIT_MOVE, {"event_id": live.id}).one()
        for pid, digest in ((live.from_pair_id, from_digest), (live.to_pair_id, to_digest)):
            if pid is not None and digest is not None:
                digests[pid] = digest
        if live.to_pair_id == pair.id:
            making_live = live
            if live.validation_id and cited is not None:
                validation = _validation_record(cited)
    artifact_ids = [pair.target_id] + ([pair.drafter_id] if pair.drafter_id else [])
    flags = session.scalars(
        _AUDIT_FLAGS, {"pair_id": pair.id, "artifact_ids": artifact_ids, "at": tag.served_at}
    ).all()
    live_pair_id = live.to_pair_id if live is not None else None
    return RequestAudit(
        tag=record,
        pair=pair_with_manifests(pair),
        deployment={"id": dep.id, "name": dep.name, "policy_name": dep.policy_name},
        deployment_event=_event_record(making_live, digests) if making_live else None,
        live_pair_digest=digests.get(live_pair_id) if live_pair_id else None,
        validation=validation,
        open_flags=[_flag_record(f) for f in flags],
        batch={
            "id": batch.id,
            "audit_seq": batch.audit_seq,
            "merkle_root": batch.merkle_root,
            "stored": batch.stored,
            "created_at": format_time(batch.created_at),
        },
    )


def _encode_cursor(served_at: datetime, request_id: str) -> str:
    raw = json.dumps([format_time(served_at), request_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode((cursor + "=" * (-len(cursor) % 4)).encode())
        at, rid = json.loads(raw)
        return datetime.fromisoformat(at.replace("Z", "+00:00")), str(rid)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError) as exc:
        raise InvalidInput("cursor is not one this service issued", field="cursor") from exc


def list_requests(
    session: Session,
    *,
    pair: Annotated[str | None, Field(description="Pair id or digest prefix.")] = None,
    deployment: str | None = None,
    since: Timestamp | None = None,
    until: Timestamp | None = None,
    inconsistent: Annotated[
        bool | None,
        Field(description="true: only tags whose pair was not live on the deployment then."),
    ] = None,
    cursor: RequestCursor = None,
    limit: Limit = 100,
) -> RequestPage:
    """Tags in (served_at, request_id) order, with counts over the whole filter."""
    check_limit(limit)
    conds = []
    if pair:
        conds.append(RequestTag.pair_id == resolve_pair(session, pair).id)
    if deployment:
        conds.append(RequestTag.deployment_id == resolve_deployment(session, deployment).id)
    for value, name in ((since, "since"), (until, "until")):
        if value is not None and value.tzinfo is None:
            raise InvalidInput(f"{name} must include a timezone (e.g. Z)", field=name)
    if since:
        conds.append(RequestTag.served_at >= since)
    if until:
        conds.append(RequestTag.served_at < until)
    if inconsistent is not None:
        conds.append(RequestTag.consistent.is_(not inconsistent))
    total, bad, tin, tout = session.execute(
        select(
            func.count(),
            func.coalesce(func.sum(case((RequestTag.consistent.is_(False), 1), else_=0)), 0),
            func.coalesce(func.sum(RequestTag.input_tokens), 0),
            func.coalesce(func.sum(RequestTag.output_tokens), 0),
        )
        .select_from(RequestTag)
        .where(*conds)
    ).one()
    stmt = _tag_select().where(*conds)
    if cursor:
        at, rid = _decode_cursor(cursor)
        stmt = stmt.where(
            or_(
                RequestTag.served_at > at,
                and_(RequestTag.served_at == at, RequestTag.request_id > rid),
            )
        )
    rows = session.execute(
        stmt.order_by(RequestTag.served_at, RequestTag.request_id).limit(limit + 1)
    ).all()
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        last = rows[-1][0]
        next_cursor = _encode_cursor(last.served_at, last.request_id)
    return RequestPage(
        items=[_to_record(r) for r in rows],
        next_cursor=next_cursor,
        counts=RequestCounts(
            total=int(total), inconsistent=int(bad), input_tokens=int(tin), output_tokens=int(tout)
        ),
    )


def maintain_partitions(session: Session, *, ahead: int = 3) -> dict[str, Any]:
    """PostgreSQL: create monthly tag partitions up to ``ahead`` months from now.

    Rows that landed in the DEFAULT partition for a month created now are moved into it.
    SQLite keeps one table and has nothing to do.
    """
    if not 0 <= ahead <= 120:
        raise InvalidInput("ahead must be 0..120 months", field="ahead")
    if session.get_bind().dialect.name != "postgresql":
        return {
            "created": [],
            "partitions": [],
            "default_rows": 0,
            "detail": "SQLite stores request tags in one table: nothing to do",
        }
    from registry.requests import partitions as tag_partitions

    conn = session.connection()
    created = tag_partitions.ensure_months(conn, before=0, ahead=ahead)
    parts = tag_partitions.existing_partitions(conn)
    default_rows = tag_partitions.default_partition_rows(conn)
    return {
        "created": created,
        "partitions": parts,
        "default_rows": default_rows,
        "detail": f"created {len(created)} partition(s); {len(parts)} in all; "
        f"{default_rows} row(s) in the default partition",
    }


def _observations(parsed: list[TagIn], stored: list[Row], cut: int) -> list[online.Observation]:
    """What online monitoring reads from the stored tags: the spec counters come from the
    validated tags (the stored spec is their canonical JSON, so they are the same values;
    ``cut`` strips the source from a stored key)."""
    counters: dict[str, Any] = {}
    for t in parsed:  # the first tag under an id is the one stored
        if t.request_id not in counters:
            counters[t.request_id] = t.spec
    out = []
    for r in stored:
        sp = counters.get(r.request_id[cut:])
        out.append(
            online.Observation(
                r.request_id,
                r.served_at,
                r.deployment_id,
                r.pair_id,
                None if sp is None else sp.num_draft_tokens,
                None if sp is None else sp.num_accepted_draft_tokens,
            )
        )
    return out
