"""Records of the trust services: transparency-log proofs and checkpoints, retention,
request archives. Hashes in proofs are lowercase hex; the checkpoint note itself carries
its root in base64, as c2sp.org/tlog-checkpoint requires."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field


class InclusionProofRecord(BaseModel):
    """Event ``seq`` is leaf ``leaf_index`` of the tree of ``tree_size`` leaves (the
    sequencer assigns leaf indices in the order it integrates events)."""

    seq: int
    leaf_index: int
    tree_size: int
    event: dict[str, Any] = Field(description="The event body, parsed from leaf_data.")
    leaf_data: str = Field(
        description="The leaf's exact bytes (UTF-8): the event body's canonical JSON; "
        "leaf hash = SHA-256(0x00 || leaf_data)."
    )
    leaf_hash: str
    path: list[str] = Field(description="RFC 9162 §2.1.3 audit path, deepest sibling first.")
    root_hash: str


class ConsistencyProofRecord(BaseModel):
    old_size: int
    new_size: int
    old_root: str
    new_root: str
    path: list[str] = Field(description="RFC 9162 §2.1.4 consistency proof.")


class LogCheckpointRecord(BaseModel):
    origin: str
    tree_size: int
    root_hash: str = Field(description="Hex of the RFC 6962 root (base64 inside the note).")
    note: str = Field(description="The C2SP signed checkpoint, verbatim.")
    verifier_key: str = Field(description="The log's key as name+keyid+base64(0x01||key).")
    signed_by: str
    signed_at: datetime
    created: bool = Field(description="False when this size was already signed.")


class TreeVerifyResult(BaseModel):
    ok: bool
    tree_size: int
    root_hash: str | None = None
    first_bad_seq: int | None = None
    reason: str | None = None
    signed_size: int | None = Field(
        None, description="The newest checkpoint the log signed that the log was checked against."
    )
    signed_ok: bool | None = Field(
        None, description="False when the log diverges from any checkpoint it signed."
    )
    signed_detail: str | None = None
    verified_from: int = Field(
        0, description="Leaves before this size were verified by an earlier run (incremental)."
    )
    checkpoint_size: int | None = None
    checkpoint_ok: bool | None = None
    checkpoint_detail: str | None = None


RetentionKind = Literal["request_tags", "audit_events"]


class RetentionRecord(BaseModel):
    kind: RetentionKind
    months: int
    horizon: datetime = Field(description="Records older than this may be archived and dropped.")
    updated_by: str
    updated_at: datetime


class ArchiveResult(BaseModel):
    directory: str
    before: date
    manifest: dict[str, Any]
    manifest_sha256: str
    batches: int
    requests: int
    purged: bool
    dropped_partitions: list[str] = Field(default_factory=list)
    audit_seq: int | None = None


class ArchivedRequest(BaseModel):
    """A request reconstructed from an archive, with what proves it."""

    tag: dict[str, Any]
    tag_digest: str
    batch: dict[str, Any]
    inclusion: dict[str, Any] = Field(description="Tag digest → batch Merkle root.")
    checks: list[dict[str, Any]]
    ok: bool
