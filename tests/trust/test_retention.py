"""Retention (database-enforced), archiving whole batches to a verifiable archive, purging
past retention (partitions dropped on PostgreSQL), and reconstructing from the archive."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError

from registry.artifacts.manifest import hash_file
from registry.db import get_engine, session_scope
from registry.errors import InvalidInput
from registry.requests import archive as request_archive
from registry.requests import partitions as tag_partitions
from registry.services import requests as req_svc
from registry.services import retention, transparency
from registry.settings import Settings
from registry.tables import AuditEvent, RequestId, RequestTag
from registry.trust import merkle
from registry.trust.bundle_verify import UNPINNED, merkle_verify, tag_digest
from tests.requests.conftest import ACTOR, build_registry, promote_at


def _log_key() -> str:
    """The log's verifier key, as an auditor pins it."""
    from registry.services.transparency import published_verifier

    own = published_verifier()
    assert own is not None
    return own.vkey


def _tags(prefix: str, n: int, at: datetime, dep: str, pair: str) -> list[dict]:
    return [
        {
            "request_id": f"{prefix}-{i:03d}",
            "deployment": dep,
            "pair_digest": pair,
            "served_at": (at + timedelta(seconds=i)).isoformat(),
            "input_tokens": 10 + i,
            "output_tokens": 20 + i,
            "spec": {"num_spec_steps": 4, "num_draft_tokens": 16, "num_accepted_draft_tokens": 9}
            if i % 2
            else None,
        }
        for i in range(n)
    ]


def _old_month(now: datetime) -> datetime:
    """Mid-month, nine months ago: a whole month past a six-month retention."""
    month = tag_partitions.add_months(now.date().replace(day=1), -9)
    return datetime(month.year, month.month, 15, 12, tzinfo=UTC)


def test_retention_is_at_least_six_months_and_enforced_by_the_database(
    home: Settings, tmp_path: Path
) -> None:
    url = home.db_url
    reg = build_registry(url, tmp_path)
    now = datetime.now(UTC)
    old = _old_month(now)
    with session_scope(url) as s:
        assert retention.get_retention(s).months == 6
        assert retention.get_retention(s, kind="audit_events").months == 6
        with pytest.raises(InvalidInput) as low:
            retention.set_retention(s, kind="request_tags", months=5, actor=ACTOR)
        assert low.value.field == "months"
        req_svc.ingest_requests(
            s,
            tags=_tags("new", 2, now - timedelta(days=1), reg.deployment, reg.pair_a),
            actor=ACTOR,
        )
        req_svc.ingest_requests(
            s, tags=_tags("old", 2, old, reg.deployment, reg.pair_a), actor=ACTOR
        )
    engine = get_engine(url)
    # Anyone deleting a recent tag directly is refused by the database itself.
    for table in ("request_tags", "request_ids"):
        with pytest.raises(DBAPIError, match="retention"), engine.begin() as conn:
            conn.execute(text(f"DELETE FROM {table} WHERE request_id = '{ACTOR}/new-000'"))
    # A tag past retention may go.
    with engine.begin() as conn:
        conn.execute(text(f"DELETE FROM request_tags WHERE request_id = '{ACTOR}/old-000'"))
    # Lengthening the period protects more: now the nine-month-old tag is kept too.
    with session_scope(url) as s:
        rec = retention.set_retention(s, kind="request_tags", months=12, actor=ACTOR)
        assert rec.months == 12 and rec.horizon < now - timedelta(days=360)
        ev = s.scalars(select(AuditEvent).order_by(AuditEvent.seq.desc()).limit(1)).one()
        assert ev.action == "retention.changed" and '"previous_months":6' in ev.payload
    with pytest.raises(DBAPIError, match="retention"), engine.begin() as conn:
        conn.execute(text(f"DELETE FROM request_tags WHERE request_id = '{ACTOR}/old-001'"))


def test_archive_verify_purge_and_reconstruct(home: Settings, tmp_path: Path) -> None:
    url = home.db_url
    reg = build_registry(url, tmp_path)
    now = datetime.now(UTC)
    old = _old_month(now)
    promote_at(url, "archive-prod", reg.pair_a, old - timedelta(days=30))
    pg = get_engine(url).dialect.name == "postgresql"
    if pg:
        with get_engine(url).begin() as conn:
            tag_partitions.ensure_month(conn, old.date())
    with session_scope(url) as s:
        for i in range(3):
            req_svc.ingest_requests(
                s,
                tags=_tags(f"old{i}", 5, old + timedelta(hours=i), "archive-prod", reg.pair_a),
                actor=ACTOR,
            )
        recent = req_svc.ingest_requests(
            s,
            tags=_tags("recent", 4, now - timedelta(days=2), reg.deployment, reg.pair_b),
            actor=ACTOR,
        )
        original = req_svc.get_request_tag(s, request_id="old1-003")
    cut = tag_partitions.add_months(old.date().replace(day=1), 1)  # the month after

    # Inside the retention period, purging is refused before anything is written.
    with session_scope(url) as s, pytest.raises(InvalidInput, match="retention period") as err:
        retention.archive_requests(
            s,
            before=(now - timedelta(days=30)).date(),
            directory=str(tmp_path / "x"),
            purge=True,
            actor=ACTOR,
        )
    assert err.value.field == "before" and not (tmp_path / "x").exists()

    # An archive without purging: written, verified, nothing deleted.
    with session_scope(url) as s:
        kept = retention.archive_requests(
            s, before=cut, directory=str(tmp_path / "a1"), actor=ACTOR
        )
        assert s.scalar(select(func.count()).select_from(RequestTag)) == 19
    assert (kept.batches, kept.requests, kept.purged) == (3, 15, False)
    report = request_archive.verify_archive(tmp_path / "a1", trusted_log_key=_log_key())
    assert report.ok, report.failures()
    # Without a pinned key the manifest's own key is all there is: unpinned, not verified.
    unpinned = request_archive.verify_archive(tmp_path / "a1")
    assert not unpinned.ok and unpinned.verdict == "unpinned"
    assert unpinned.failures() == [f"pinned key: {UNPINNED}"]

    # Purge: the archived rows go, the recent batch stays, the archive still proves them.
    with session_scope(url) as s:
        done = retention.archive_requests(
            s, before=cut, directory=str(tmp_path / "a2"), purge=True, actor=ACTOR
        )
    assert done.purged and done.requests == 15
    assert done.manifest["merkle_root"] == kept.manifest["merkle_root"]
    if pg:
        assert done.dropped_partitions == [tag_partitions.partition_name(old.date())]
    with session_scope(url) as s:
        assert s.scalar(select(func.count()).select_from(RequestTag)) == 4
        assert s.scalar(select(func.count()).select_from(RequestId)) == 4
        assert req_svc.get_request_tag(s, request_id="recent-000").batch_id == recent.batch_id
        ev = s.get(AuditEvent, done.audit_seq)
        assert ev is not None and ev.action == "requests.archived"
        payload = json.loads(ev.payload)
        assert payload["manifest_sha256"] == done.manifest_sha256 and payload["purged"]
        # The audit log itself was not touched and still verifies.
        assert transparency.verify_audit_log(s).ok
        # Nothing left before the cut: a second archive finds nothing.
        found = retention.get_archived_request(
            s, directory=str(tmp_path / "a2"), request_id="old1-003"
        )
    assert found["ok"], found["checks"]
    tag = found["tag"]
    assert tag["served_at"].startswith(original.served_at.strftime("%Y-%m-%dT%H:%M:%S"))
    assert (tag["input_tokens"], tag["output_tokens"], tag["spec"]) == (
        original.input_tokens,
        original.output_tokens,
        original.spec,
    )
    assert found["tag_digest"] == original.tag_digest
    assert found["pair"]["pair_digest"] == reg.pair_a and found["verdict"] == "verified"
    # From the CLI: pinned to the registry's key by default, or to the key you give; a key
    # that did not sign the archive's checkpoint fails it.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from registry.trust.audit import public_pem
    from tests.api.conftest import run_cli

    archive = str(tmp_path / "a2")
    assert run_cli("requests", "archived", archive, "old1-003").exit_code == 0
    pinned = run_cli(
        "requests", "archived", archive, "old1-003", "--public-key", str(home.public_key_path)
    )
    assert pinned.exit_code == 0 and "verified" in pinned.output
    other = tmp_path / "other.pub"
    other.write_text(public_pem(Ed25519PrivateKey.generate().public_key()))
    wrong = run_cli("requests", "archived", archive, "old1-003", "--trust-file", str(other))
    assert wrong.exit_code == 1 and "a key you do not trust" in " ".join(wrong.output.split())
    inc = found["inclusion"]
    assert merkle_verify(found["tag_digest"], inc["index"], inc["size"], inc["path"], inc["root"])
    body = json.loads(found["event"]["leaf_data"])
    assert body["payload"]["merkle_root"] == inc["root"]
    cp_root = bytes.fromhex(done.manifest["checkpoint"]["root_hash"])
    assert merkle.verify_inclusion(
        merkle.leaf_hash(found["event"]["leaf_data"].encode()),
        body["seq"] - 1,
        done.manifest["checkpoint"]["tree_size"],
        [bytes.fromhex(h) for h in found["event"]["path"]],
        cp_root,
    )


def test_a_tampered_archive_fails_verification(home: Settings, tmp_path: Path) -> None:
    url = home.db_url
    reg = build_registry(url, tmp_path)
    old = _old_month(datetime.now(UTC))
    promote_at(url, "archive-prod", reg.pair_a, old - timedelta(days=30))
    with session_scope(url) as s:
        req_svc.ingest_requests(
            s, tags=_tags("old", 6, old, "archive-prod", reg.pair_a), actor=ACTOR
        )
        retention.archive_requests(
            s, before=(old + timedelta(days=1)).date(), directory=str(tmp_path / "a"), actor=ACTOR
        )
    a = tmp_path / "a"
    assert request_archive.verify_archive(a, trusted_log_key=_log_key()).ok
    lines = [json.loads(x) for x in gzip.open(a / "requests.jsonl.gz", "rt")]
    lines[2]["output_tokens"] += 100  # someone "fixes" a record
    with gzip.open(a / "requests.jsonl.gz", "wt") as fh:
        fh.writelines(json.dumps(x) + "\n" for x in lines)
    broken = request_archive.verify_archive(a, trusted_log_key=_log_key())
    assert not broken.ok and "file requests.jsonl.gz: missing or altered" in broken.failures()
    # ...and updating the manifest's file hash to match does not help.
    manifest = json.loads((a / "manifest.json").read_text())
    manifest["files"]["requests.jsonl.gz"]["sha256"] = hash_file(a / "requests.jsonl.gz").sha256
    (a / "manifest.json").write_text(json.dumps(manifest))
    failures = " | ".join(request_archive.verify_archive(a, trusted_log_key=_log_key()).failures())
    assert "tag digests: 5/6 recompute" in failures
    assert "batches: batch" in failures and "Merkle root" in failures
    # Recomputing the tag digest too still leaves the batch root (in the signed log) wrong.
    lines[2]["tag_digest"] = tag_digest(**{k: lines[2][k] for k in request_archive.TAG_FIELDS})
    with gzip.open(a / "requests.jsonl.gz", "wt") as fh:
        fh.writelines(json.dumps(x) + "\n" for x in lines)
    manifest["files"]["requests.jsonl.gz"]["sha256"] = hash_file(a / "requests.jsonl.gz").sha256
    (a / "manifest.json").write_text(json.dumps(manifest))
    failures = " | ".join(request_archive.verify_archive(a, trusted_log_key=_log_key()).failures())
    assert "archive root" in failures and "do not hash to its Merkle root" in failures
