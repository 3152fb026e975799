"""Writing one ingest batch: the new request ids, their tags and the batch row.

Input is the batch's tags already checked and digested, one :data:`Row` per distinct request
id (its stored key ``<source>/<client id>``), sorted by key. Output is the rows this call
stored and the rows it did not store because their key holds a *different* tag (conflicts,
reported per tag by the caller); keys already recorded with the same digest are retries and
are skipped. A conflict never stops the other tags of the batch from being stored.

PostgreSQL, the throughput path (no per-tag objects, bulk COPY for the data):

1. insert the batch row (its id goes into every id row);
2. the common case, every id new: under a savepoint, ``COPY`` the ids with their digests and
   the batch id straight into ``request_ids``. Its primary key refuses an id already
   recorded (or one a concurrent batch is inserting: COPY waits for that batch to end, then
   refuses the id if it committed), and the savepoint is rolled back;
3. only then, the careful path: ``COPY`` the ids into a session-local staging table
   (``pg_temp``, created once per connection, emptied at every commit), insert them into
   ``request_ids`` in id order with ``ON CONFLICT DO NOTHING RETURNING`` and return the ids
   it did not insert; compare those ids' recorded digests with the staged ones in a new
   statement (READ COMMITTED: it sees a concurrent batch that won the race, since
   ``ON CONFLICT`` waited for that batch to commit); a clash is left out of the tags
   written, and returned;
4. ``COPY`` the tags of exactly the ids stored into ``request_tags`` (COPY routes each row to
   its partition and writes in bulk: less work, and less WAL to flush at commit while the
   registry's write lock is held, than ``INSERT … SELECT``).

Step 2 is a plain bulk load: about a third of the database work of step 3's staging copy,
conflict-checking insert and anti-join (``bench/ingest_bench.py``); a retried batch pays
for the refused COPY and then takes step 3.

Ids go in sorted, so two batches that share ids lock them in the same order and cannot
deadlock. SQLite serialises writers (``BEGIN IMMEDIATE``), so its path is the plain one:
look the ids up, insert the new ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import psycopg.errors
from sqlalchemy import insert, select, text
from sqlalchemy.orm import Session

from registry.tables import RequestBatch, RequestId, RequestTag
from registry.tables.base import utcnow


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
    "request_id varchar(400) NOT NULL, served_at timestamptz NOT NULL, "
    "tag_digest varchar(64) NOT NULL"
    ") ON COMMIT DELETE ROWS; "
    f"DELETE FROM {STAGE}"  # a second batch in one transaction starts empty too
)

_NEW_BATCH = text(
    "INSERT INTO request_batches "
    "(merkle_root, received_digest, stored, duplicates, inconsistent, actor, created_at) "
    "VALUES ('', :received_digest, 0, 0, 0, :actor, :created_at) RETURNING id"
)
_COPY_IDS = (
    "COPY request_ids (request_id, served_at, tag_digest, batch_id, source, client_request_id) "
    "FROM STDIN (FORMAT BINARY)"
)
_ID_TYPES = ["text", "timestamptz", "text", "int4", "text", "text"]
_SAVEPOINT = "pairreg_ingest_ids"

_STORE = text(
    f"""
WITH ids AS (
    INSERT INTO request_ids (request_id, served_at, tag_digest, batch_id, source,
                             client_request_id)
    SELECT request_id, served_at, tag_digest, :batch_id, :source,
           substr(request_id, :cut + 1)
    FROM {STAGE} ORDER BY request_id
    ON CONFLICT (request_id) DO NOTHING
    RETURNING request_id
)
SELECT ARRAY(SELECT s.request_id FROM {STAGE} s
             WHERE NOT EXISTS (SELECT 1 FROM ids WHERE ids.request_id = s.request_id)
             ORDER BY s.request_id) AS skipped
"""
)

_CLASHES = text(
    f"SELECT s.request_id FROM {STAGE} s JOIN request_ids i USING (request_id) "
    "WHERE i.tag_digest <> s.tag_digest AND s.request_id = ANY(:ids) ORDER BY s.request_id"
)
_COPY_TAGS = f"COPY request_tags ({_TAG_COLUMNS}) FROM STDIN (FORMAT BINARY)"


def store(
    session: Session, rows: Sequence[Row], *, received_digest: str, actor: str, source: str
) -> tuple[int | None, list[Row], list[Row]]:
    """Store what is new; (batch id, stored rows in key order, conflicting rows in key
    order). No batch when nothing is new. Every row's key starts with ``source/`` (or is the
    client's id itself when ``source`` is ``''``)."""
    if session.get_bind().dialect.name == "postgresql":
        return _store_postgres(
            session, rows, received_digest=received_digest, actor=actor, source=source
        )
    return _store_sqlite(session, rows, received_digest=received_digest, actor=actor, source=source)


def _cut(source: str) -> int:
    """Characters of a stored key before the client's id."""
    return len(source) + 1 if source else 0


def _store_postgres(
    session: Session, rows: Sequence[Row], *, received_digest: str, actor: str, source: str
) -> tuple[int | None, list[Row], list[Row]]:
    params = {"received_digest": received_digest, "actor": actor, "created_at": utcnow()}
    batch_id = session.execute(_NEW_BATCH, params).scalar_one()
    raw = session.connection().connection.driver_connection
    taken: list[Row] = []
    if _copy_ids(raw, rows, batch_id, source):
        fresh = list(rows)
    else:
        fresh, taken = _store_ids_careful(session, raw, rows, batch_id, source)
        if not fresh:  # every tag was a retry or a conflict: no batch, no event
            session.execute(text("DELETE FROM request_batches WHERE id = :id"), {"id": batch_id})
            return None, [], taken
    # The tags of exactly the ids this batch inserted, straight into their table (COPY routes
    # each row to its month's partition and writes in bulk).
    with raw.cursor() as cur, cur.copy(_COPY_TAGS) as copy:  # type: ignore[union-attr]
        copy.set_types(_TAG_TYPES)
        for row in fresh:
            copy.write_row(row[:9])
    return batch_id, fresh, taken


def _copy_ids(raw: Any, rows: Sequence[Row], batch_id: int, source: str) -> bool:
    """Step 2: every id new? Bulk-load them under a savepoint; False (and nothing stored)
    when the primary key refuses one."""
    with raw.cursor() as cur:
        cur.execute(f"SAVEPOINT {_SAVEPOINT}")
        try:
            with cur.copy(_COPY_IDS) as copy:
                copy.set_types(_ID_TYPES)
                cut = _cut(source)
                for row in rows:
                    key = row.request_id
                    copy.write_row(
                        (key, row.served_at, row.tag_digest, batch_id, source, key[cut:])
                    )
        except psycopg.errors.UniqueViolation:
            cur.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            return False
        cur.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
    return True


def _store_ids_careful(
    session: Session, raw: Any, rows: Sequence[Row], batch_id: int, source: str
) -> tuple[list[Row], list[Row]]:
    """Step 3: store the new ids, skip retries, set clashes aside; returns the rows stored
    and the rows whose key holds a different tag."""
    with raw.cursor() as cur:
        cur.execute(_STAGE_DDL)
        with cur.copy(
            f"COPY {STAGE} (request_id, served_at, tag_digest) FROM STDIN (FORMAT BINARY)"
        ) as copy:
            copy.set_types(_STAGE_TYPES)
            for row in rows:
                copy.write_row((row.request_id, row.served_at, row.tag_digest))
    params = {"batch_id": batch_id, "source": source, "cut": _cut(source)}
    skipped = session.execute(_STORE, params).scalar_one()
    if not skipped:
        return list(rows), []
    clashes = set(session.execute(_CLASHES, {"ids": skipped}).scalars())
    gone = set(skipped)
    return (
        [r for r in rows if r.request_id not in gone],
        [r for r in rows if r.request_id in clashes],
    )


def _chunks(items: Sequence[str], n: int = _CHUNK) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _store_sqlite(
    session: Session, rows: Sequence[Row], *, received_digest: str, actor: str, source: str
) -> tuple[int | None, list[Row], list[Row]]:
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
    taken = [r for r in rows if found.get(r.request_id, r.tag_digest) != r.tag_digest]
    fresh = [r for r in rows if r.request_id not in found]
    if not fresh:
        return None, [], taken
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
    cut = _cut(source)
    session.execute(
        insert(RequestId),
        [
            {
                "request_id": r.request_id,
                "served_at": r.served_at,
                "tag_digest": r.tag_digest,
                "batch_id": batch.id,
                "source": source,
                "client_request_id": r.request_id[cut:],
            }
            for r in fresh
        ],
    )
    session.execute(insert(RequestTag), [_tag_dict(r) for r in fresh])
    return batch.id, fresh, taken


def _tag_dict(row: Row) -> dict[str, Any]:
    out: dict[str, Any] = row._asdict()
    del out["tag_digest"]
    out["spec"] = None if row.spec is None else json.loads(row.spec)
    return out
