"""Audit bundles: built from the registry, verified offline, and tampering caught with a reason."""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from registry.bundle_verify import verify_bundle
from registry.db import session_scope
from registry.services import bundles
from registry.services import requests as svc
from registry.settings import Settings, get_settings
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
        "audit chain",
        "checkpoint signature",
        "pair registered event",
        "ingest batch event",
        "promotion event",
    } <= names
    assert bundle["tag"]["pair_digest"] == served.pair_b
    assert bundle["inclusion"]["size"] == 7 and len(bundle["inclusion"]["path"]) == 3
    assert bundle["deployment_event"]["to_pair_digest"] == served.pair_b
    # the segment runs from the earliest cited event to the checkpoint, with no gaps
    seqs = [e["seq"] for e in bundle["chain"]["events"]]
    assert seqs == list(range(min(bundle["events"].values()), bundle["checkpoint"]["seq"] + 1))


def test_weights_rehashed(bundle: dict, served: Served, tmp_path: Path) -> None:
    ok = _pinned(bundle, weights=[str(served.target_dir), f"drafter={served.draft_dir}"])
    assert ok.ok, _failed(ok)
    (served.draft_dir / "model.safetensors").write_bytes(b"swapped weights")
    bad = _pinned(bundle, weights=[f"drafter={served.draft_dir}"])
    assert not bad.ok
    assert "changed ['model.safetensors']" in _failed(bad)[f"weights {served.draft_dir}"]


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
        (
            lambda b: b["chain"]["events"][1]["payload"].__setitem__("x", 1),
            "audit chain",
            "chain hash mismatch",
        ),
        (lambda b: b["chain"]["events"].pop(1), "audit chain", "sequence gap"),
        (
            lambda b: b["checkpoint"].__setitem__("signed_at", "2020-01-01T00:00:00.000000Z"),
            "checkpoint signature",
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


def test_forged_pair_with_consistent_digests_is_caught_by_the_chain(bundle: dict) -> None:
    """Rewriting the pair and its digest everywhere still fails: the chain holds the old one."""
    from registry.bundle_verify import tag_digest
    from registry.canonical import digest_of

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

    from registry import audit
    from registry.bundle_verify import canonical_json

    plain = verify_bundle(json.loads(json.dumps(bundle)))
    assert not plain.ok and plain.verdict == "unpinned"
    assert [c.name for c in plain.failures] == ["pinned key"]
    assert plain.failures[0].detail.startswith("UNPINNED")

    forged = copy.deepcopy(bundle)
    forged.pop("log", None)
    mallory = Ed25519PrivateKey.generate()
    cp = forged["checkpoint"]
    body = {k: cp[k] for k in ("seq", "chain_hash", "signed_at")}
    import base64

    cp["signature"] = base64.b64encode(mallory.sign(canonical_json(body))).decode()
    cp["public_key"] = forged["public_key"] = audit.public_pem(mallory.public_key())
    assert verify_bundle(forged).verdict == "unpinned"
    pinned = _pinned(forged)
    assert pinned.verdict == "failed"
    assert {c.name: c.detail for c in pinned.failures} == {
        "trusted key": "signed by a key you do not trust"
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
