"""Request tags, their idempotency index, ingest batches and serving telemetry.

Why three tables for tags:

* ``request_tags`` holds the data. On PostgreSQL it is partitioned by month on
  ``served_at`` (the migration creates it ``PARTITION BY RANGE``), so its primary key must
  contain the partition key: ``(request_id, served_at)``. That key alone would let the same
  request id be stored twice under two different times.
* ``request_ids`` is a small, non-partitioned table with ``request_id`` as its primary key.
  Ingest inserts there first with ``ON CONFLICT DO NOTHING``; the row it fails to insert is
  a retry (same ``tag_digest``) or a conflict (different digest). It also carries the
  ``served_at`` that routes a lookup to one partition, and the batch the tag arrived in.
* ``request_batches`` is one row per accepted ingest call: the Merkle root over the tags it
  stored, and the sequence number of the audit event that records that root. A bundle proves
  one tag's membership with a Merkle inclusion path instead of shipping the whole batch.

SQLite gets the same tables, unpartitioned.

References without per-row foreign keys (migration 0008): ``request_tags.deployment_id``,
``request_tags.pair_id`` and ``request_ids.batch_id`` are checked once per batch instead of
once per row. Ingest is the only writer and takes every id from the same transaction
(deployments and pairs looked up by name and digest, the batch row inserted by the statement
that inserts its ids); the database keeps the referenced rows in place: ``pairs`` and
``deployments`` refuse ``DELETE`` and id changes, ``request_batches`` refuses them while
request ids name the batch (triggers, both dialects).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
)
from sqlalchemy.orm import Mapped, mapped_column

from registry.tables.base import Base, UTCDateTime, utcnow


class RequestBatch(Base):
    """One accepted ingest call; ``audit_seq`` is the event carrying its ``merkle_root``."""

    __tablename__ = "request_batches"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    audit_seq: Mapped[int | None] = mapped_column(Integer)
    merkle_root: Mapped[str] = mapped_column(String(64))
    received_digest: Mapped[str] = mapped_column(String(64))
    stored: Mapped[int] = mapped_column(Integer)
    duplicates: Mapped[int] = mapped_column(Integer)
    inconsistent: Mapped[int] = mapped_column(Integer)
    actor: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class RequestId(Base):
    """The idempotency index: one row per request id ever accepted."""

    __tablename__ = "request_ids"
    __table_args__ = (
        Index("ix_request_ids_batch", "batch_id", "request_id"),
        Index("ix_request_ids_client", "client_request_id"),
    )

    # The stored key: ``<source>/<client id>`` (the bare client id for tags stored before
    # migration 0011, whose source is ``''``); see ``registry.services.requests.stored_key``.
    request_id: Mapped[str] = mapped_column(String(400), primary_key=True)
    served_at: Mapped[datetime] = mapped_column(UTCDateTime())
    tag_digest: Mapped[str] = mapped_column(String(64))
    batch_id: Mapped[int] = mapped_column(Integer)  # request_batches.id (see module notes)
    source: Mapped[str] = mapped_column(String(120), server_default="")
    client_request_id: Mapped[str | None] = mapped_column(String(200))


class RequestTag(Base):
    """One served request and the pair that served it (partitioned by month on PostgreSQL)."""

    __tablename__ = "request_tags"
    __table_args__ = (
        Index("ix_request_tags_pair_served", "pair_id", "served_at"),
        Index("ix_request_tags_deployment_served", "deployment_id", "served_at"),
        {"postgresql_partition_by": "RANGE (served_at)"},
    )

    request_id: Mapped[str] = mapped_column(String(400), primary_key=True)  # the stored key
    served_at: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    deployment_id: Mapped[int] = mapped_column(Integer)  # deployments.id (see module notes)
    pair_id: Mapped[int] = mapped_column(Integer)  # pairs.id (see module notes)
    input_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    pair_filled: Mapped[bool] = mapped_column(Boolean)
    consistent: Mapped[bool] = mapped_column(Boolean)


class TelemetrySample(Base):
    """One scrape of a serving engine's spec-decode counters, with deltas from the previous."""

    __tablename__ = "telemetry_samples"
    __table_args__ = (Index("ix_telemetry_samples_deployment_id", "deployment_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"))
    pair_id: Mapped[int | None] = mapped_column(ForeignKey("pairs.id"))
    source: Mapped[str] = mapped_column(String(500))
    scraped_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    counters: Mapped[dict[str, Any]] = mapped_column(JSON)
    deltas: Mapped[dict[str, Any]] = mapped_column(JSON)
    reset: Mapped[bool] = mapped_column(Boolean)
    drafted: Mapped[int] = mapped_column(BigInteger)
    accepted: Mapped[int] = mapped_column(BigInteger)
    online_acceptance: Mapped[float | None] = mapped_column(Float)
    baseline_acceptance: Mapped[float | None] = mapped_column(Float)
    drift_flag_id: Mapped[int | None] = mapped_column(ForeignKey("drift_flags.id"))
