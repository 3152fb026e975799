"""Records of online acceptance monitoring (registry/services/online.py)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class OnlineMonitorRecord(BaseModel):
    """The sequential test of one pair on one deployment, as it stands."""

    pair_digest: str
    live: bool = Field(description="This pair is the deployment's live pair now.")
    state: str = Field(
        description="`watching` (no drop shown), `alarmed` (a drop shown; a workload flag is "
        "open), or `no_baseline` (no validated rate to compare with: counted, not tested)."
    )
    validated_alpha: float | None = Field(
        description="Draft acceptance rate (accepted / drafted) of the measurement that "
        "validated the pair for this deployment (else its newest measurement)."
    )
    reference: float | None = Field(description="validated_alpha − tolerance: the null's mean.")
    level: float = Field(description="The test's false-alarm probability over all time.")
    tolerance: float
    e_value: float = Field(description="Evidence of a drop: the alarm fires at 1/level.")
    recovery_e_value: float | None = Field(
        description="While alarmed: evidence of recovery (resolves the flag at 1/level)."
    )
    requests: int = Field(description="Requests seen (with or without counters).")
    tested: int = Field(description="Requests with spec-decode counters fed to the test.")
    drafted: int
    accepted: int
    alpha: float | None = Field(description="accepted / drafted over all tested requests.")
    mean_request_alpha: float | None = Field(description="Mean per-request acceptance rate.")
    alarms: int = Field(description="Times the drop alarm fired for this pair here.")
    flag_id: int | None
    started_at: datetime
    updated_at: datetime
    alarm_at: datetime | None


class OnlineBucketRecord(BaseModel):
    """One time bucket of served requests."""

    start: datetime
    end: datetime
    pair_digest: str
    requests: int
    tested: int
    drafted: int
    accepted: int
    alpha: float | None = Field(description="accepted / drafted in the bucket.")
    mean_request_alpha: float | None = Field(description="Mean per-request rate in the bucket.")
    validated_alpha: float | None
    e_value: float = Field(description="The drop test's evidence at the bucket's end.")
    state: str = Field(description="The monitor's state at the bucket's end.")


class ScrapeRecord(BaseModel):
    """One scrape of the engine's spec-decode counters (``pairreg telemetry``), as deltas."""

    at: datetime
    pair_digest: str | None
    drafted: int = Field(description="Draft tokens since the previous scrape.")
    accepted: int
    alpha: float | None = Field(description="accepted / drafted over this scrape's delta.")
    reset: bool = Field(description="A counter went down: the engine restarted.")


class OnlineAlpha(BaseModel):
    """Online α of a deployment over time and the sequential test against the validated α."""

    deployment: str
    live_pair_digest: str | None
    bucket_seconds: int
    method: str
    monitors: list[OnlineMonitorRecord] = Field(description="Newest first; the live pair's first.")
    buckets: list[OnlineBucketRecord] = Field(description="Oldest first.")
    scrapes: list[ScrapeRecord] = Field(
        default_factory=list,
        description="Scraped engine counters in the window, oldest first (at most 2,000): "
        "no request boundary, so shown beside the test, not fed to it.",
    )
