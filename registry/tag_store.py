"""Writing one ingest batch: the new request ids, their tags and the batch row.

Input is the batch's tags already checked and digested, one :data:`Row` per distinct request
id, sorted by id. Output is the ids this call stored; ids already recorded with the same
digest are retries and are skipped, ids recorded with a different digest raise
:class:`~registry.errors.Conflict` naming them, and the caller's transaction rolls back, so a
conflict stores nothing.

PostgreSQL, the throughput path (no per-tag objects, three round trips for the data):

1. ``COPY`` the ids and digests into a session-local staging table (``pg_temp``, created
   once per connection, emptied at every commit);
2. one statement with data-modifying CTEs: insert the batch row, insert the staged ids into
   ``request_ids`` in id order with ``ON CONFLICT DO NOTHING RETURNING``, and return the ids
   it did not insert;
3. only when some were not inserted: compare their recorded digests with the staged ones in
   a new statement (READ COMMITTED: it sees a concurrent batch that won the race, since
   ``ON CONFLICT`` waited for that batch to commit); a clash is a 409 before any tag is
   written;
4. ``COPY`` the tags of exactly the ids step 2 inserted into ``request_tags`` (COPY routes
   each row to its partition and writes in bulk: less work, and less WAL to flush at commit
   while the registry's write lock is held, than ``INSERT … SELECT``).

Ids go in sorted, so two batches that share ids lock them in the same order and cannot
deadlock. SQLite serialises writers (``BEGIN IMMEDIATE``), so its path is the plain one:
look the ids up, insert the new ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import insert, select, text
from sqlalchemy.orm import Session

from registry.errors import Conflict
from registry.models import RequestBatch, RequestId, RequestTag
from registry.models.base import utcnow


class Row(NamedTuple):
    """One tag as stored; ``spec`` is its canonical JSON text (or None)."""

    request_id: str
    served_at: datetime
    deployment_id: int
    pair_id: int
    input_tokens: int
    output_tokens: int
    spec: str | None
    pair_filled: bool
    consistent: bool
    tag_digest: str


_CHUNK = 5000  # ids per IN (...) list on SQLite (its variable limit is 32766)
STAGE = "pairreg_ingest_ids"
_COLUMNS = Row._fields
_TAG_COLUMNS = ", ".join(_COLUMNS[:-1])
# Binary COPY. ``spec`` goes as text: it is already canonical JSON, which the server's json
# input parses (psycopg's json dumper would encode the string again, as a JSON string).
_TAG_TYPES = "text timestamptz int4 int4 int4 int4 text bool bool".split()
_STAGE_TYPES = ["text", "timestamptz", "text"]

_STAGE_DDL = (
    f"CREATE TEMP TABLE IF NOT EXISTS {STAGE} ("
    "request_id varchar(200) NOT NULL, served_at timestamptz NOT NULL, "
    "tag_digest varchar(64) NOT NULL"
    ") ON COMMIT DELETE ROWS; "
    f"DELETE FROM {STAGE}"  # a second batch in one transaction starts empty too
)

_STORE = text(
    f"""
WITH batch AS (
    INSERT INTO request_batches
        (merkle_root, received_digest, stored, duplicates, inconsistent, actor, created_at)
    VALUES ('', :received_digest, 0, 0, 0, :actor, :created_at)
    RETURNING id
), ids AS (
    INSERT INTO request_ids (request_id, served_at, tag_digest, batch_id)
    SELECT request_id, served_at, tag_digest, (SELECT id FROM batch)
    FROM {STAGE} ORDER BY request_id
    ON CONFLICT (request_id) DO NOTHING
    RETURNING request_id
)
SELECT (SELECT id FROM batch) AS batch_id,
       ARRAY(SELECT s.request_id FROM {STAGE} s
             WHERE NOT EXISTS (SELECT 1 FROM ids WHERE ids.request_id = s.request_id)
             ORDER BY s.request_id) AS skipped
"""
)

_CLASHES = text(
    f"SELECT s.request_id FROM {STAGE} s JOIN request_ids i USING (request_id) "
    "WHERE i.tag_digest <> s.tag_digest AND s.request_id = ANY(:ids) ORDER BY s.request_id"
)
_COPY_TAGS = f"COPY request_tags ({_TAG_COLUMNS}) FROM STDIN (FORMAT BINARY)"


def conflict(ids: list[str]) -> Conflict:
    shown = ", ".join(ids[:50]) + (f" and {len(ids) - 50} more" if len(ids) > 50 else "")
    return Conflict(
        f"{len(ids)} request id(s) already recorded with a different tag: {shown}",
        field="request_id",
        details={"request_ids": ids},
    )


def store(
    session: Session, rows: Sequence[Row], *, received_digest: str, actor: str
) -> tuple[int | None, list[Row]]:
    """Store what is new; (batch id, stored rows in id order). No batch when nothing is new."""
    if session.get_bind().dialect.name == "postgresql":
        return _store_postgres(session, rows, received_digest=received_digest, actor=actor)
    return _store_sqlite(session, rows, received_digest=received_digest, actor=actor)


def _store_postgres(
    session: Session, rows: Sequence[Row], *, received_digest: str, actor: str
) -> tuple[int | None, list[Row]]:
    raw = session.connection().connection.driver_connection
    with raw.cursor() as cur:  # type: ignore[union-attr]
        cur.execute(_STAGE_DDL)
        with cur.copy(
            f"COPY {STAGE} (request_id, served_at, tag_digest) FROM STDIN (FORMAT BINARY)"
        ) as copy:
            copy.set_types(_STAGE_TYPES)
            for row in rows:
                copy.write_row((row.request_id, row.served_at, row.tag_digest))
    batch_id, skipped = session.execute(
        _STORE, {"received_digest": received_digest, "actor": actor, "created_at": utcnow()}
    ).one()
    fresh = list(rows)
    if skipped:
        clashes = list(session.execute(_CLASHES, {"ids": skipped}).scalars())
        if clashes:
            raise conflict(clashes)
        if len(skipped) == len(rows):  # every tag was a retry: no batch, no event
            session.execute(text("DELETE FROM request_batches WHERE id = :id"), {"id": batch_id})
            return None, []
        gone = set(skipped)
        fresh = [r for r in rows if r.request_id not in gone]
    # The tags of exactly the ids this batch inserted, straight into their table (COPY routes
    # each row to its month's partition and writes in bulk).
    with raw.cursor() as cur, cur.copy(_COPY_TAGS) as copy:  # type: ignore[union-attr]
        copy.set_types(_TAG_TYPES)
        for row in fresh:
            copy.write_row(row[:9])
    return batch_id, fresh


def _chunks(items: Sequence[str], n: int = _CHUNK) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _store_sqlite(
    session: Session, rows: Sequence[Row], *, received_digest: str, actor: str
) -> tuple[int | None, list[Row]]:
    found: dict[str, str] = {}
    for chunk in _chunks([r.request_id for r in rows]):
        found.update(
            {
                r: d
                for r, d in session.execute(
                    select(RequestId.request_id, RequestId.tag_digest).where(
                        RequestId.request_id.in_(chunk)
                    )
                )
            }
        )
    clashes = [r.request_id for r in rows if found.get(r.request_id, r.tag_digest) != r.tag_digest]
    if clashes:
        raise conflict(clashes)
    fresh = [r for r in rows if r.request_id not in found]
    if not fresh:
        return None, []
    batch = RequestBatch(
        merkle_root="",
        received_digest=received_digest,
        stored=0,
        duplicates=0,
        inconsistent=0,
        actor=actor,
    )
    session.add(batch)
    session.flush()
    session.execute(
        insert(RequestId),
        [
            {
                "request_id": r.request_id,
                "served_at": r.served_at,
                "tag_digest": r.tag_digest,
                "batch_id": batch.id,
            }
            for r in fresh
        ],
    )
    session.execute(insert(RequestTag), [_tag_dict(r) for r in fresh])
    return batch.id, fresh


def _tag_dict(row: Row) -> dict[str, Any]:
    out: dict[str, Any] = row._asdict()
    del out["tag_digest"]
    out["spec"] = None if row.spec is None else json.loads(row.spec)
    return out
