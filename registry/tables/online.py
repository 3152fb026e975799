"""Online acceptance monitoring: one sequential test per (deployment, pair), and its buckets.

A monitor holds the whole state of the anytime-valid tests (registry/stats/online.py) so
they resume exactly where they stopped: the log wealth, the next bet and the ONS sum of the
drop test, and of the recovery test while an alarm stands. Buckets are fixed five-minute
windows of ``served_at`` with the counters summed and the drop test's evidence at the
bucket's end: enough to draw online α over time without reading request tags again.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from registry.tables.base import Base, UTCDateTime, utcnow


class OnlineMonitor(Base):
    """The sequential comparison of a live pair's served acceptance with its validated rate."""

    __tablename__ = "online_monitors"
    __table_args__ = (UniqueConstraint("deployment_id", "pair_id", name="uq_online_monitor"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"))
    pair_id: Mapped[int] = mapped_column(ForeignKey("pairs.id"))
    validated_alpha: Mapped[float | None] = mapped_column(Float)
    reference: Mapped[float | None] = mapped_column(Float)
    level: Mapped[float] = mapped_column(Float)
    tolerance: Mapped[float] = mapped_column(Float)
    min_drafted: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    drop_test: Mapped[dict[str, Any]] = mapped_column(JSON)
    recovery_test: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    flag_id: Mapped[int | None] = mapped_column(ForeignKey("drift_flags.id"))
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    tested: Mapped[int] = mapped_column(BigInteger, default=0)
    drafted: Mapped[int] = mapped_column(BigInteger, default=0)
    accepted: Mapped[int] = mapped_column(BigInteger, default=0)
    rate_sum: Mapped[float] = mapped_column(Float, default=0.0)
    alarms: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    alarm_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class OnlineBucket(Base):
    """Five minutes of one monitor's requests (by ``served_at``)."""

    __tablename__ = "online_buckets"

    monitor_id: Mapped[int] = mapped_column(ForeignKey("online_monitors.id"), primary_key=True)
    start: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    requests: Mapped[int] = mapped_column(Integer, default=0)
    tested: Mapped[int] = mapped_column(Integer, default=0)
    drafted: Mapped[int] = mapped_column(BigInteger, default=0)
    accepted: Mapped[int] = mapped_column(BigInteger, default=0)
    rate_sum: Mapped[float] = mapped_column(Float, default=0.0)
    log_e: Mapped[float] = mapped_column(Float, default=0.0)
    state: Mapped[str] = mapped_column(String(16))
