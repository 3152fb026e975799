"""Typed records the services return and the API serialises: one shape for CLI and HTTP.

The remote client parses responses back into these same classes, so a command renders
identically in embedded and remote mode.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from registry.governance.lifecycle import PairStatus
from registry.methods import Method

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

Role = Literal["target", "draft", "heads"]

PROVENANCE_FIELDS = (
    "publisher",
    "license",
    "source_url",
    "training_data",
    "base_model",
    "trained_against",
    "training_code_revision",
)


class _Row:
    """An ORM row seen through its attributes, with ``extra`` values it does not hold."""

    def __init__(self, row: Any, extra: dict[str, Any]):
        self._row, self._extra = row, extra

    def __getattr__(self, name: str) -> Any:
        if name in self._extra:
            return self._extra[name]
        return getattr(self._row, name)


def from_row(model: type[M], row: Any, **extra: Any) -> M:
    """A record from a database row's attributes (pydantic ``from_attributes``), plus the
    values the row does not hold itself (a digest joined from elsewhere, a derived field)."""
    return model.model_validate(_Row(row, extra), from_attributes=True)


class Page(BaseModel, Generic[T]):
    """One page of a list; pass ``next_cursor`` back as ``cursor`` for the next page."""

    items: list[T]
    next_cursor: str | None = None


class Provenance(BaseModel):
    """Where an artifact came from and what it was made for; every field is optional."""

    model_config = ConfigDict(extra="forbid")

    publisher: str | None = None
    license: str | None = None
    source_url: str | None = None
    training_data: str | None = None
    base_model: str | None = None
    trained_against: str | None = Field(
        default=None,
        description="Artifact reference or manifest digest of the target this was trained for.",
    )
    training_code_revision: str | None = None
    attestations: dict[str, Any] = Field(default_factory=dict)


class SignatureIn(BaseModel):
    """An OpenSSF model-signing signature to verify at registration (offline: key or
    certificate signatures)."""

    model_config = ConfigDict(extra="forbid")

    path: str | None = Field(
        default=None,
        description="The signature file (a path the server can read); default: model.sig "
        "in the artifact's directory.",
    )
    public_key: str | None = Field(
        default=None, description="PEM public key, for a signature made with a key."
    )
    certificate_chain: list[str] = Field(
        default_factory=list,
        description="PEM CA certificate(s), for a signature made with a certificate.",
    )


class ManifestEntry(BaseModel):
    path: str
    size: int
    sha256: str


class ArtifactRecord(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "id": 1,
                "lineage": "acme/chat-8b",
                "version": 1,
                "ref": "acme/chat-8b@v1",
                "role": "target",
                "source": "hf://acme/chat-8b@0123456789abcdef0123456789abcdef01234567",
            }
        }
    )

    id: int
    lineage: str
    version: int
    ref: str = Field(description="LINEAGE@vN")
    role: Role
    source: str
    source_kind: Literal["local", "hf"]
    hub_repo: str | None = None
    hub_revision: str | None = None
    hub_commit: str | None = None
    local_path: str | None = None
    manifest_digest: str
    signing_root: str
    total_size: int
    file_count: int
    tokenizer_digest: str | None = None
    vocab_digest: str | None = None
    vocab_size: int | None = None
    facts: dict[str, Any]
    provenance: Provenance
    provenance_missing: list[str]
    signature: dict[str, Any] | None = Field(
        default=None,
        description="The verified model signature: kind, signer, identities, key and root "
        "fingerprints, in-toto subject digest.",
    )
    registered_by: str
    registered_at: datetime
    manifest: list[ManifestEntry] | None = Field(
        default=None, description="Present on single-artifact reads, omitted in lists."
    )
    signature_bundle: str | None = Field(
        default=None, description="The signature file, verbatim (single-artifact reads)."
    )


class ArtifactAddResult(BaseModel):
    artifact: ArtifactRecord
    created: bool = Field(description="False when identical content was already registered.")
    target_changed: bool = Field(
        default=False, description="True when this is new content in an existing target lineage."
    )


class VerifyReport(BaseModel):
    """What re-hashing an artifact's files found. Strict: a worker hands it back in
    ``fail_job``, and ``"ok": 0`` is not a boolean (nested models do not inherit the body's
    strictness)."""

    model_config = ConfigDict(strict=True)

    artifact_id: int
    manifest_digest: str
    path: str
    ok: bool
    changed: list[str]
    missing: list[str]
    added: list[str]


class PairRecord(BaseModel):
    id: int
    pair_digest: str
    target: ArtifactRecord
    drafter: ArtifactRecord | None
    method: Method
    k: int
    config: dict[str, Any]
    lossy: bool
    status: PairStatus
    warnings: list[str]
    registered_by: str
    registered_at: datetime


class PairRegisterResult(BaseModel):
    pair: PairRecord
    created: bool


class PairProposal(BaseModel):
    """The pair a speculators-format drafter implies, checked against a target."""

    drafter: ArtifactRecord
    target: ArtifactRecord | None = Field(
        default=None, description="The target given, or the one the drafter names or pins."
    )
    candidates: list[str] = Field(
        default_factory=list, description="Registered targets matching the drafter's verifier."
    )
    method: Method | None = None
    k: int | None = None
    options: dict[str, Any] = Field(
        default_factory=dict, description="Config options to register with (e.g. tree)."
    )
    verifier: dict[str, Any] = Field(
        default_factory=dict, description="The verifier the drafter names (and any pin)."
    )
    errors: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    registrable: bool = Field(description="True when register_pair would accept this pair.")


class AuditEventRecord(BaseModel):
    seq: int
    occurred_at: datetime
    actor: str
    action: str
    entity_type: str
    entity_id: str
    payload: dict[str, Any]


class TokenRecord(BaseModel):
    id: int
    name: str
    role: str
    created_by: str
    created_at: datetime
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None


class Identity(BaseModel):
    """Who the caller is and what its role may do (for clients that hide what they cannot use)."""

    actor: str = Field(description="The identity recorded in audit events for this caller.")
    token: str | None = Field(description="The token's name; None when acting embedded.")
    role: str
    capabilities: list[str] = Field(
        description="Names of the role groups this role belongs to (registry.governance.roles)."
    )
    mlflow_ui: str | None = Field(
        default=None, description="Base URL of the MLflow UI when the tracking URI is a server."
    )


class TokenCreated(BaseModel):
    token: TokenRecord
    secret: str = Field(description="Shown once; only its SHA-256 is stored.")
