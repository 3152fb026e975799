"""Records for request tags, ingest results, audit answers, telemetry and serving exports."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

import msgspec
from pydantic import BaseModel, ConfigDict, Field, field_validator

from registry.records.lifecycle import KSchedule

MAX_BATCH = 10_000


class SpecCounters(BaseModel):
    """vLLM's per-request ``metrics.speculative_decoding`` counters."""

    model_config = ConfigDict(extra="forbid")

    num_spec_steps: int = Field(ge=0)
    num_draft_tokens: int = Field(ge=0)
    num_accepted_draft_tokens: int = Field(ge=0)
    acceptance_histogram: list[int] | None = Field(
        default=None, description="Steps that accepted 0, 1, …, k draft tokens."
    )


class TagIn(BaseModel):
    """One served request as a client reports it."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "example": {
                "request_id": "req-7f3a",
                "deployment": "chat-prod",
                "pair_digest": None,
                "served_at": "2026-11-29T14:00:00.123456Z",
                "input_tokens": 42,
                "output_tokens": 128,
                "spec": {
                    "num_spec_steps": 40,
                    "num_draft_tokens": 160,
                    "num_accepted_draft_tokens": 88,
                    "acceptance_histogram": [5, 8, 10, 9, 8],
                },
            }
        },
    )

    request_id: str = Field(min_length=1, max_length=200)
    deployment: str = Field(min_length=1, max_length=100)
    pair_digest: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Omit to let the service fill in the pair live on the deployment then.",
    )
    served_at: datetime = Field(description="ISO-8601 with a timezone.")
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    spec: SpecCounters | None = None

    @field_validator("served_at")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("served_at must include a timezone (e.g. Z)")
        return value


# --- the ingest hot path's decoder ---------------------------------------------------------
#
# A 10,000-tag batch validated by pydantic into TagIn objects costs 30-45 ms of the API's CPU;
# msgspec decodes and checks the same bytes into the structs below in about 5 ms. They carry
# TagIn's constraints, and they are stricter where the two libraries differ: no lax coercion
# (a float, a numeric string or a bool for an int), ``served_at`` only in the RFC 3339 form
# with at most six fractional digits, parsed by ``datetime.fromisoformat`` (pydantic would
# accept more forms, and truncates a seventh digit where msgspec's own parser rounds it).
# Anything they refuse is validated by pydantic as before, so every error is reported as on
# any other route, and every accepted tag has exactly the values pydantic would have given it
# (``tests/requests/test_fast_tags.py`` compares the two on edge cases and random bodies).

_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?(?:Z|[+-]\d{2}:\d{2})", re.ASCII
)
_Count = Annotated[int, msgspec.Meta(ge=0)]


class FastSpec(msgspec.Struct, forbid_unknown_fields=True):
    """:class:`SpecCounters` as decoded on the hot path (same field names)."""

    num_spec_steps: _Count
    num_draft_tokens: _Count
    num_accepted_draft_tokens: _Count
    acceptance_histogram: list[int] | None = None


class FastTag(msgspec.Struct, forbid_unknown_fields=True):
    """:class:`TagIn` as decoded on the hot path (same field names and constraints).

    ``served_at`` arrives as text and :func:`decode_tags` replaces it with the parsed,
    timezone-aware ``datetime`` before anyone else sees the tag."""

    request_id: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    deployment: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    served_at: Any
    pair_digest: Annotated[str, msgspec.Meta(pattern=r"\A[0-9a-f]{64}\Z")] | None = None
    input_tokens: _Count = 0
    output_tokens: _Count = 0
    spec: FastSpec | None = None


class DecodedTags(list[FastTag]):
    """Tags :func:`decode_tags` checked: the ingest service takes them as they are (a plain
    list, of dicts or of structs built by hand, is validated by pydantic)."""


class _FastBody(msgspec.Struct, forbid_unknown_fields=True):
    tags: list[FastTag]


_FAST_BODY = msgspec.json.Decoder(_FastBody)


def decode_tags(body: bytes) -> dict[str, Any] | None:
    """An ingest body's fields (``{"tags": [FastTag, …]}``) from its JSON bytes, or None when
    the fast path is not sure: pydantic then validates the body and reports what is wrong."""
    try:
        tags = _FAST_BODY.decode(body).tags
    except msgspec.MsgspecError:
        return None
    match, parse = _RFC3339.fullmatch, datetime.fromisoformat
    try:
        for tag in tags:
            text = tag.served_at
            if type(text) is not str or match(text) is None:
                return None
            tag.served_at = parse(text)
    except ValueError:  # e.g. February 30th: pydantic names the field and the reason
        return None
    return {"tags": DecodedTags(tags)}


class TagConflict(BaseModel):
    """One tag of a batch that was not stored because its id is taken by a different tag."""

    index: int = Field(description="The tag's position in the batch.")
    request_id: str
    reason: str = Field(
        description="`recorded`: this source already recorded another tag under the id; "
        "`batch`: an earlier tag of this batch has the id with other content."
    )


class IngestResult(BaseModel):
    received: int = Field(description="stored + duplicates + conflicted.")
    stored: int = Field(description="New tags written by this call.")
    duplicates: int = Field(description="Tags already recorded identically (no-ops).")
    conflicted: int = Field(
        default=0, description="Tags not stored: their id holds a different tag (see conflicts)."
    )
    conflicts: list[TagConflict] = Field(
        default_factory=list, description="Every conflicting tag, in batch order."
    )
    source: str | None = Field(
        default=None, description="The namespace the batch's request ids were stored under."
    )
    inconsistent: int = Field(description="Stored tags whose pair was not live then.")
    inconsistent_ids: list[str] = Field(default_factory=list, description="Up to 100 of them.")
    batch_id: int | None = Field(default=None, description="None when nothing new was stored.")
    audit_seq: int | None = None
    merkle_root: str | None = None


class RequestTagRecord(BaseModel):
    request_id: str = Field(description="The id the client sent.")
    source: str = Field(
        default="",
        description="Who ingested it (its request id is unique within this source; '' for "
        "tags stored before ids were namespaced).",
    )
    deployment: str
    pair_digest: str
    served_at: datetime
    input_tokens: int
    output_tokens: int
    spec: dict[str, Any] | None = None
    pair_filled: bool = Field(description="True when the service filled in the pair digest.")
    consistent: bool = Field(description="False when that pair was not live on the deployment.")
    tag_digest: str
    batch_id: int


class RequestCounts(BaseModel):
    total: int
    inconsistent: int
    input_tokens: int
    output_tokens: int


class RequestPage(BaseModel):
    items: list[RequestTagRecord]
    next_cursor: str | None = None
    counts: RequestCounts


class RequestAudit(BaseModel):
    """Everything recorded about one request, for ``GET /v1/requests/{id}``."""

    tag: RequestTagRecord
    pair: dict[str, Any] = Field(description="The pair with both artifacts and manifests.")
    deployment: dict[str, Any]
    deployment_event: dict[str, Any] | None = Field(
        description="The move that made the tag's pair live (none for an inconsistent tag)."
    )
    live_pair_digest: str | None = Field(description="What was live on the deployment then.")
    validation: dict[str, Any] | None = None
    open_flags: list[dict[str, Any]] = Field(default_factory=list)
    batch: dict[str, Any]


class ServingDifference(BaseModel):
    field: str = Field(description="What differs (root, served_model, method, k, …).")
    expected: Any = Field(description="What the deployment's live pair is served as.")
    reported: Any = Field(description="What the engine (or the measurement) reports.")


class ServingCheck(BaseModel):
    """What a scraped engine reports about itself against the deployment's live pair."""

    reported: dict[str, Any] = Field(description="What the engine reported (None: not said).")
    expected: dict[str, Any] = Field(
        description="The live pair as exported, and the "
        "engine version of its validated measurement."
    )
    differences: list[ServingDifference]
    flagged: bool
    flag_id: int | None = None
    remeasure_job_id: int | None = Field(
        default=None,
        description="A re-measurement queued because the engine runs another version than "
        "the validated measurement was taken on.",
    )


class TelemetryResult(BaseModel):
    deployment: str
    pair_digest: str | None
    sample_id: int
    reset: bool = Field(description="A counter went down: the engine restarted.")
    deltas: dict[str, Any]
    window_drafted: int = Field(description="Draft tokens since the pair went live.")
    window_accepted: int
    online_acceptance: float | None = Field(description="accepted / drafted over the window.")
    baseline_acceptance: float | None = Field(description="From the validating measurement.")
    margin: float
    min_drafted: int
    flagged: bool
    flag_id: int | None = None
    serving: ServingCheck | None = Field(
        default=None,
        description="What the engine reported about itself (/v1/models, /version, its info "
        "gauges) checked against the live pair; a difference opens a serving flag.",
    )


class SpeculatorsExport(BaseModel):
    """A pair's drafter as a speculators config.json with the verifier pinned."""

    pair_digest: str
    drafter_ref: str
    drafter_manifest_digest: str
    target_ref: str
    config: dict[str, Any]
    files: list[str] = Field(description="The drafter's other files, to copy beside config.json.")


class ExportResult(BaseModel):
    engine: str
    deployment: str
    pair_digest: str
    args: list[str]
    command: str
    speculative_config: dict[str, Any] | None = None
    serving_config: dict[str, Any] | None = Field(
        default=None,
        description="The serving configuration the deployment checks against: method, k, "
        "dtype, acceptance, the target's chat-template digest, EAGLE-3 auxiliary layer ids "
        "(those the validated measurement ran with), and that measurement's engine.",
    )
    k_schedule: KSchedule | None = Field(
        default=None,
        description="With a hardware profile: the draft length per batch size the launch "
        "arguments carry, with its predicted throughput (docs/lifecycle.md).",
    )
