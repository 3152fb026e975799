"""Lineages, artifacts and pairs: the content-addressed core of the registry."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from registry.tables.base import Base, UTCDateTime, utcnow


class Lineage(Base):
    """A named line of versions (``acme/chat-8b``); its role is fixed by the first version."""

    __tablename__ = "lineages"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Artifact(Base):
    """One immutable version of a model, heads or tokenizer, identified by its manifest."""

    __tablename__ = "artifacts"
    __table_args__ = (
        UniqueConstraint("lineage", "version"),
        UniqueConstraint("lineage", "manifest_digest"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    lineage: Mapped[str] = mapped_column(ForeignKey("lineages.name"))
    version: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16))
    source: Mapped[str] = mapped_column(Text)
    source_kind: Mapped[str] = mapped_column(String(16))
    hub_repo: Mapped[str | None] = mapped_column(String(200))
    hub_revision: Mapped[str | None] = mapped_column(String(200))
    hub_commit: Mapped[str | None] = mapped_column(String(40))
    local_path: Mapped[str | None] = mapped_column(Text)
    manifest: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    manifest_digest: Mapped[str] = mapped_column(String(64), index=True)
    signing_root: Mapped[str] = mapped_column(String(64))
    total_size: Mapped[int] = mapped_column(BigInteger)
    file_count: Mapped[int] = mapped_column(Integer)
    tokenizer_digest: Mapped[str | None] = mapped_column(String(64))
    vocab_digest: Mapped[str | None] = mapped_column(String(64))
    vocab_size: Mapped[int | None] = mapped_column(Integer)
    facts: Mapped[dict[str, Any]] = mapped_column(JSON)
    provenance: Mapped[dict[str, Any]] = mapped_column(JSON)
    # A verified OpenSSF model-signing signature: who signed, the in-toto subject digest,
    # and the signature file itself (a Sigstore bundle, kept verbatim for re-verification).
    signature: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    signature_bundle: Mapped[str | None] = mapped_column(Text)
    registered_by: Mapped[str] = mapped_column(String(200))
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Pair(Base):
    """A target, an optional drafter and a normalised speculation config, named by digest."""

    __tablename__ = "pairs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pair_digest: Mapped[str] = mapped_column(String(64), unique=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id"), index=True)
    drafter_id: Mapped[int | None] = mapped_column(ForeignKey("artifacts.id"), index=True)
    method: Mapped[str] = mapped_column(String(32))
    k: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    lossy: Mapped[bool] = mapped_column(Boolean)
    status: Mapped[str] = mapped_column(String(16), index=True)
    warnings: Mapped[list[str]] = mapped_column(JSON)
    registered_by: Mapped[str] = mapped_column(String(200))
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    status_changed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    target: Mapped[Artifact] = relationship(foreign_keys=[target_id], lazy="joined")
    drafter: Mapped[Artifact | None] = relationship(foreign_keys=[drafter_id], lazy="joined")
