"""Audit bundles: built from the registry, verified offline, and tampering caught with a reason."""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from registry.db import session_scope
from registry.services import bundles
from registry.services import requests as svc
from registry.settings import Settings, get_settings
from registry.trust.bundle_verify import verify_bundle
from tests.requests.conftest import ACTOR, Served

runner = CliRunner()


def _failed(report) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {c.name: c.detail for c in report.failures}


@pytest.fixture
def bundle(home: Settings, served: Served) -> dict:
    s = served
    at = s.t_b + timedelta(minutes=3)
    tags = [
        {
            "request_id": f"b-{i}",
            "deployment": s.deployment,
            "served_at": at.isoformat(),
            "input_tokens": i,
            "output_tokens": 2 * i,
        }
        for i in range(7)
    ]
    with session_scope(s.url) as session:
        svc.ingest_requests(session, tags=tags, actor=ACTOR)
    with session_scope(s.url) as session:
        return bundles.build_bundle(session, request_id="b-4")


def _pinned(bundle: dict, **kw):  # type: ignore[no-untyped-def]
    """Verify with the log's public key pinned, as an auditor who obtained it out of band."""
    return verify_bundle(
        bundle, trusted_public_key=get_settings().public_key_path.read_text(), **kw
    )


def test_bundle_verifies_offline_and_names_everything(bundle: dict, served: Served) -> None:
    report = _pinned(json.loads(json.dumps(bundle)))
    assert report.ok, _failed(report)
    names = {c.name for c in report.checks}
    assert {
        "target manifest",
        "drafter manifest",
        "pair digest",
        "tag digest",
        "tag in batch",
        "pinned key",
        "log checkpoint",
        "log checkpoint key",
        "log inclusion",
        "pair registered event",
        "ingest batch event",
        "promotion event",
    } <= names
    assert bundle["tag"]["pair_digest"] == served.pair_b
    assert bundle["inclusion"]["size"] == 7 and len(bundle["inclusion"]["path"]) == 3
    assert bundle["deployment_event"]["to_pair_digest"] == served.pair_b
    # Only the cited events travel, each with its inclusion path up to the checkpoint.
    assert "chain" not in bundle and "checkpoint" not in bundle
    assert set(bundle["log"]["events"]) == {str(v) for v in bundle["events"].values()}
    size = int(bundle["log"]["checkpoint"].splitlines()[1])
    assert all(len(e["path"]) <= size.bit_length() for e in bundle["log"]["events"].values())


def test_bundle_size_is_bounded_by_the_cited_events(bundle: dict, served: Served) -> None:
    """Format 1 carried every audit event since the artifact's registration (one per ingest
    batch); now a thousand later events add only a few hashes per cited event."""
    from registry.trust import audit

    with session_scope(served.url) as session:
        for i in range(1000):
            audit.append_event(
                session,
                actor="test:filler",
                action="test.event",
                entity_type="test",
                entity_id=i,
                payload={"i": i, "note": "an unrelated event of about a hundred bytes"},
            )
    with session_scope(served.url) as session:
        later = bundles.build_bundle(session, request_id="b-4")
    before, after = len(json.dumps(bundle)), len(json.dumps(later))
    cited = len(later["log"]["events"])
    assert cited <= 6
    # A few more sibling hashes per cited event (log2 of the size grew by ~5; 64 hex digits,
    # quotes and a comma each), nothing per added event: format 1 would have grown by the
    # thousand events themselves (over 100 kB).
    old_size = int(bundle["log"]["checkpoint"].splitlines()[1])
    new_size = int(later["log"]["checkpoint"].splitlines()[1])
    extra_hashes = new_size.bit_length() - old_size.bit_length() + 1
    assert after - before <= cited * extra_hashes * 70, (before, after)
    assert after < 20_000
    assert _pinned(later).ok


def test_weights_rehashed(bundle: dict, served: Served, tmp_path: Path) -> None:
    ok = _pinned(bundle, weights=[str(served.target_dir), f"drafter={served.draft_dir}"])
    assert ok.ok, _failed(ok)
    (served.draft_dir / "model.safetensors").write_bytes(b"swapped weights")
    bad = _pinned(bundle, weights=[f"drafter={served.draft_dir}"])
    assert not bad.ok
    assert "changed ['model.safetensors']" in _failed(bad)[f"weights {served.draft_dir}"]


def _rename_actor_in_log(b: dict) -> None:
    entry = b["log"]["events"][str(b["events"]["pair_registered"])]
    body = json.loads(entry["leaf_data"])
    body["actor"] = "local:mallory"
    entry["leaf_data"] = json.dumps(body, sort_keys=True, separators=(",", ":"))


@pytest.mark.parametrize(
    ("mutate", "check", "reason"),
    [
        (lambda b: b["tag"].__setitem__("output_tokens", 1), "tag digest", "recomputed"),
        (
            lambda b: b["inclusion"]["path"].__setitem__(0, "ab" * 32),
            "tag in batch",
            "does not prove",
        ),
        (
            lambda b: b["inclusion"].__setitem__("root", "cd" * 32),
            "ingest batch event",
            "records root",
        ),
        (
            lambda b: b["pair"]["config"].__setitem__("num_speculative_tokens", 9),
            "pair digest",
            "recomputed",
        ),
        (
            lambda b: b["pair"]["target"]["manifest"][0].__setitem__("size", 1),
            "target manifest",
            "recomputed",
        ),
        (_rename_actor_in_log, "log inclusion", "does not prove into the checkpoint"),
        (
            lambda b: b["log"]["events"].pop(str(b["events"]["pair_registered"])),
            "pair registered event",
            "not among the verified events",
        ),
        (
            lambda b: b["log"].__setitem__(
                "checkpoint", b["log"]["checkpoint"].replace("\n", "\n\n", 1)
            ),
            "log checkpoint",
            "does not verify",
        ),
        (lambda b: b.__setitem__("format", "other"), "format", "not a"),
    ],
)
def test_tampering_fails_with_reason(bundle: dict, mutate, check: str, reason: str) -> None:  # type: ignore[no-untyped-def]
    tampered = copy.deepcopy(bundle)
    mutate(tampered)
    report = _pinned(tampered)
    assert not report.ok
    assert reason in _failed(report)[check]


def test_forged_pair_with_consistent_digests_is_caught_by_the_log(bundle: dict) -> None:
    """Rewriting the pair and its digest everywhere still fails: the signed log holds the
    old one."""
    from registry.canonical import digest_of
    from registry.trust.bundle_verify import tag_digest

    b = copy.deepcopy(bundle)
    b["pair"]["config"]["num_speculative_tokens"] = 9
    pair = b["pair"]
    pair["pair_digest"] = digest_of(
        {
            "target": pair["target"]["manifest_digest"],
            "drafter": pair["drafter"]["manifest_digest"],
            "config": pair["config"],
        }
    )
    t = b["tag"]
    t["pair_digest"] = pair["pair_digest"]
    t["tag_digest"] = tag_digest(
        **{
            k: t[k]
            for k in (
                "request_id",
                "deployment",
                "pair_digest",
                "served_at",
                "input_tokens",
                "output_tokens",
                "spec",
            )
        }
    )
    report = _pinned(b)
    failed = _failed(report)
    assert "tag in batch" in failed and "pair registered event" in failed


def test_cli_bundle_roundtrip(home: Settings, served: Served, tmp_path: Path) -> None:
    s = served
    at = s.t_a + timedelta(minutes=1)
    with session_scope(s.url) as session:
        svc.ingest_requests(
            session,
            tags=[
                {
                    "request_id": "cli-1",
                    "deployment": s.deployment,
                    "served_at": at.isoformat(),
                    "output_tokens": 5,
                }
            ],
            actor=ACTOR,
        )
    shown = runner.invoke(app, ["audit", "request", "cli-1", "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["tag"]["pair_digest"] == s.pair_a
    listed = runner.invoke(app, ["audit", "requests", "--deployment", s.deployment, "--json"])
    assert json.loads(listed.output)["counts"]["total"] == 1
    out = tmp_path / "b.json"
    made = runner.invoke(app, ["audit", "bundle", "cli-1", "-o", str(out)])
    assert made.exit_code == 0, made.output
    ok = runner.invoke(
        app,
        [
            "audit",
            "verify-bundle",
            str(out),
            "--weights",
            str(s.target_dir),
            "--public-key",
            str(home.public_key_path),
        ],
    )
    assert ok.exit_code == 0 and "bundle VERIFIED" in ok.output, ok.output
    data = json.loads(out.read_text())
    data["tag"]["served_at"] = (at + timedelta(seconds=1)).isoformat()
    out.write_text(json.dumps(data))
    bad = runner.invoke(app, ["audit", "verify-bundle", str(out)])
    assert bad.exit_code == 1 and "FAIL tag digest" in bad.output


def test_unpinned_bundle_is_never_called_verified(bundle: dict, tmp_path: Path) -> None:
    """Without a pinned key the verdict is "unpinned"; a bundle forged and re-signed with a
    key of the forger's own passes every other check, which is why that is not enough."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from registry.trust import signed_note

    plain = verify_bundle(json.loads(json.dumps(bundle)))
    assert not plain.ok and plain.verdict == "unpinned"
    assert [c.name for c in plain.failures] == ["pinned key"]
    assert plain.failures[0].detail.startswith("UNPINNED")

    # Mallory re-signs the checkpoint with a key of her own under the same origin.
    forged = copy.deepcopy(bundle)
    mallory = Ed25519PrivateKey.generate()
    note = signed_note.parse_note(forged["log"]["checkpoint"])
    origin = note.text.splitlines()[0]
    forged["log"]["checkpoint"] = signed_note.Note(
        note.text, [signed_note.sign(note.text, origin, mallory)]
    ).render()
    forged["log"]["verifier_key"] = signed_note.Verifier.of(origin, mallory.public_key()).vkey
    assert verify_bundle(forged).verdict == "unpinned"
    pinned = _pinned(forged)
    assert pinned.verdict == "failed"
    assert {c.name: c.detail for c in pinned.failures} == {
        "log checkpoint key": "signed by a key you do not trust"
    }

    # CLI: no key → exit 1 saying UNPINNED, never VERIFIED; a trust file pins it.
    out = tmp_path / "b.json"
    out.write_text(json.dumps(bundle))
    said = runner.invoke(app, ["audit", "verify-bundle", str(out)])
    assert said.exit_code == 1 and "UNPINNED" in said.output and "VERIFIED" not in said.output
    trust = tmp_path / "trust"
    trust.write_text("# the registry's audit key\n" + get_settings().public_key_path.read_text())
    good = runner.invoke(app, ["audit", "verify-bundle", str(out), "--trust-file", str(trust)])
    assert good.exit_code == 0 and "bundle VERIFIED" in good.output, good.output
    as_json = runner.invoke(app, ["audit", "verify-bundle", str(out), "--json"])
    assert json.loads(as_json.output)["verdict"] == "unpinned"


def test_version_1_bundles_still_verify(bundle: dict, served: Served) -> None:
    """A bundle issued in format 1 (chain segment + Ed25519 chain checkpoint + log proofs)
    keeps verifying offline, and its chain is still checked link by link. The chain is
    retired from the database, so the bundle is rebuilt here as the old builder made it."""
    import base64

    from sqlalchemy import select

    from registry.canonical import canonical_json
    from registry.tables import AuditEvent, utcnow
    from registry.trust import audit
    from registry.trust.bundle_verify import chain_step, format_time

    with session_scope(served.url) as session:
        rows = session.scalars(select(AuditEvent).order_by(AuditEvent.seq)).all()
        bodies = [audit.event_body(e) for e in rows]
    prev, chained = "0" * 64, []
    for body in bodies:
        h = chain_step(prev, body)
        chained.append({**body, "prev_hash": prev, "chain_hash": h})
        prev = h
    start = min(bundle["events"].values())
    key = audit.load_private_key(get_settings().signing_key_path)
    cp = {"seq": len(bodies), "chain_hash": prev, "signed_at": format_time(utcnow())}
    checkpoint = {
        **cp,
        "signature": base64.b64encode(key.sign(canonical_json(cp))).decode(),
        "public_key": audit.public_pem(key.public_key()),
        "algorithm": "ed25519",
    }
    v1 = {
        **json.loads(json.dumps(bundle)),
        "format": "pairreg.audit-bundle/1",
        "chain": {
            "start_seq": start,
            "prev_hash": chained[start - 1]["prev_hash"],
            "events": chained[start - 1 :],
        },
        "checkpoint": checkpoint,
        "public_key": checkpoint["public_key"],
    }
    report = _pinned(v1)
    assert report.ok, _failed(report)
    assert {"audit chain", "checkpoint signature", "log inclusion"} <= {
        c.name for c in report.checks
    }
    v1["chain"]["events"][1]["payload"]["x"] = 1
    assert "chain hash mismatch" in _failed(_pinned(v1))["audit chain"]
