"""OpenSSF model signatures at registration and as a validate/promote gate, offline: keys
and a CA made in the test, signatures made with the ``model_signing`` library itself."""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from pathlib import Path

import model_signing
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from registry.db import session_scope
from registry.errors import Conflict, InvalidInput
from registry.records.core import SignatureIn
from registry.services import artifacts, deployments, policies, validation
from tests.fixtures import write_fake_model
from tests.governance.helpers import ACTOR, make_pair, store, synthetic_result

PEM = serialization.Encoding.PEM


def _pem_private(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _pem_public(key: ec.EllipticCurvePrivateKey) -> str:
    return (
        key.public_key().public_bytes(PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    )


def _fingerprint(key: ec.EllipticCurvePrivateKey) -> str:
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return "sha256:" + hashlib.sha256(der).hexdigest()


@dataclass
class Signer:
    key: ec.EllipticCurvePrivateKey
    key_file: Path

    @property
    def public(self) -> str:
        return _pem_public(self.key)

    @property
    def fingerprint(self) -> str:
        return _fingerprint(self.key)

    def sign(self, model: Path, sig: Path) -> Path:
        model_signing.signing.Config().use_elliptic_key_signer(private_key=self.key_file).sign(
            model, sig
        )
        return sig


def make_signer(tmp: Path, name: str) -> Signer:
    key = ec.generate_private_key(ec.SECP256R1())
    path = tmp / f"{name}.key"
    path.write_bytes(_pem_private(key))
    return Signer(key, path)


@dataclass
class CA:
    cert: x509.Certificate
    pem: str
    fingerprint: str
    leaf_key: Path
    leaf_cert: Path


def make_ca(tmp: Path, email: str) -> CA:
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"Test CA for {email}")])
    usage = dict(
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, **usage),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "acme releases")]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=10))
        .add_extension(x509.SubjectAlternativeName([x509.RFC822Name(email)]), critical=False)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False, **usage),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (tmp / "leaf.key").write_bytes(_pem_private(leaf_key))
    (tmp / "leaf.pem").write_bytes(leaf.public_bytes(PEM))
    pem = ca.public_bytes(PEM).decode()
    (tmp / "ca.pem").write_text(pem)
    fp = "sha256:" + hashlib.sha256(ca.public_bytes(serialization.Encoding.DER)).hexdigest()
    return CA(ca, pem, fp, tmp / "leaf.key", tmp / "leaf.pem")


def cert_sign(ca: CA, model: Path, sig: Path, tmp: Path) -> Path:
    model_signing.signing.Config().use_certificate_signer(
        private_key=ca.leaf_key,
        signing_certificate=ca.leaf_cert,
        certificate_chain=[tmp / "ca.pem"],
    ).sign(model, sig)
    return sig


def add(url: str, model: Path, name: str, role: str = "target", **kw):  # type: ignore[no-untyped-def]
    with session_scope(url) as s:
        return artifacts.add_artifact(s, source=str(model), name=name, role=role, actor=ACTOR, **kw)


def test_key_signature_is_verified_recorded_and_shown(sqlite_url: str, tmp_path: Path) -> None:
    model = write_fake_model(tmp_path / "m", weights=b"signed weights")
    alice = make_signer(tmp_path, "alice")
    sig = alice.sign(model, tmp_path / "m.sig")
    res = add(
        sqlite_url, model, "acme/t", signature=SignatureIn(path=str(sig), public_key=alice.public)
    )
    art = res.artifact
    assert art.signature is not None
    assert art.signature["kind"] == "key" and art.signature["signer"] == alice.fingerprint
    # model-signing's root digest over the files is the one pairreg computes itself.
    assert art.signature["subject_digest"] == art.signing_root
    assert art.signature_bundle == sig.read_text()
    with session_scope(sqlite_url) as s:
        shown = artifacts.get_artifact(s, ref="acme/t@v1")
        listed = artifacts.list_artifacts(s).items[0]
        events = [e for e in s.scalars(_events()) if e.action == "artifact.added"]
    assert shown.signature == art.signature and shown.signature_bundle == sig.read_text()
    assert listed.signature == art.signature and listed.signature_bundle is None
    assert '"signer":"' + alice.fingerprint in events[0].payload


def _events():  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    from registry.tables import AuditEvent

    return select(AuditEvent).order_by(AuditEvent.seq)


def test_bad_signatures_are_refused_with_a_clear_line(sqlite_url: str, tmp_path: Path) -> None:
    alice, mallory = make_signer(tmp_path, "alice"), make_signer(tmp_path, "mallory")

    def refused(model: Path, sig: SignatureIn, match: str) -> None:
        with pytest.raises(InvalidInput, match=match) as err:
            add(sqlite_url, model, "acme/x", signature=sig)
        assert err.value.field == "signature"

    changed = write_fake_model(tmp_path / "changed")
    sig = alice.sign(changed, tmp_path / "changed.sig")
    (changed / "model.safetensors").write_bytes(b"swapped after signing")
    refused(
        changed,
        SignatureIn(path=str(sig), public_key=alice.public),
        "signature refused: the signature does not match the files: .*model.safetensors",
    )
    extra = write_fake_model(tmp_path / "extra")
    sig = alice.sign(extra, tmp_path / "extra.sig")
    (extra / "notes.txt").write_text("slipped in later")
    refused(
        extra,
        SignatureIn(path=str(sig), public_key=alice.public),
        "does not match the files: .*Extra files.*notes.txt",
    )
    good = write_fake_model(tmp_path / "good")
    sig = alice.sign(good, tmp_path / "good.sig")
    refused(good, SignatureIn(path=str(sig), public_key=mallory.public), "does not verify")
    refused(good, SignatureIn(path=str(sig)), "give the signer's public key")
    refused(good, SignatureIn(public_key=alice.public), "no signature file at .*model.sig")
    (tmp_path / "junk.sig").write_text("{not json")
    refused(good, SignatureIn(path=str(tmp_path / "junk.sig")), "cannot read signature")
    with session_scope(sqlite_url) as s:
        assert artifacts.list_artifacts(s).items == []  # nothing was written


def test_signature_inside_the_model_and_certificate_identity(
    sqlite_url: str, tmp_path: Path
) -> None:
    ca = make_ca(tmp_path, "releases@acme.example")
    model = write_fake_model(tmp_path / "m")
    # As the model_signing CLI does: the signature lives in the directory and is ignored.
    model_signing.signing.Config().set_hashing_config(
        model_signing.hashing.Config().set_ignored_paths(paths=["model.sig"])
    ).use_certificate_signer(
        private_key=ca.leaf_key,
        signing_certificate=ca.leaf_cert,
        certificate_chain=[tmp_path / "ca.pem"],
    ).sign(model, model / "model.sig")
    art = add(
        sqlite_url, model, "acme/t", signature=SignatureIn(certificate_chain=[ca.pem])
    ).artifact
    sig = art.signature or {}
    assert sig["kind"] == "certificate" and sig["signer"] == "releases@acme.example"
    assert "acme releases" in sig["identities"] and sig["root_fingerprint"] == ca.fingerprint
    # A different CA does not anchor the chain.
    (tmp_path / "o").mkdir()
    other = make_ca(tmp_path / "o", "releases@acme.example")
    with pytest.raises(InvalidInput, match="does not verify"):
        add(sqlite_url, model, "acme/t2", signature=SignatureIn(certificate_chain=[other.pem]))


SIGNED_POLICY = """
name = "signed"
[suite]
name = "tiny"
max_new_tokens = 16
[alpha]
min_overall = 0.5
min_per_category = 0.4
[provenance]
require_signature = true
allowed_signers = [{allowed}]
trusted_roots = [{roots}]
"""


def test_signature_gate_in_validate_promote_and_registration(db_url: str, tmp_path: Path) -> None:
    alice, mallory = make_signer(tmp_path, "alice"), make_signer(tmp_path, "mallory")
    ca = make_ca(tmp_path, "releases@acme.example")
    with session_scope(db_url) as s:
        policies.put_policy(
            s,
            text=SIGNED_POLICY.format(
                allowed=f'"{alice.fingerprint}", "releases@acme.example"',
                roots=f'"{ca.fingerprint}"',
            ),
            actor=ACTOR,
        )
        deployments.create_deployment(s, name="prod", policy="signed", actor=ACTOR)

    def model(name: str, weights: bytes) -> Path:
        return write_fake_model(tmp_path / name, weights=weights)

    t = model("t", b"target")
    target = add(
        db_url,
        t,
        "acme/t",
        signature=SignatureIn(path=str(alice.sign(t, tmp_path / "t.sig")), public_key=alice.public),
    ).artifact
    d1 = model("d1", b"draft one")
    by_ca = add(
        db_url,
        d1,
        "acme/d",
        role="draft",
        signature=SignatureIn(
            path=str(cert_sign(ca, d1, tmp_path / "d1.sig", tmp_path)), certificate_chain=[ca.pem]
        ),
    ).artifact
    d2 = model("d2", b"draft two")
    by_mallory = add(
        db_url,
        d2,
        "acme/d",
        role="draft",
        signature=SignatureIn(
            path=str(mallory.sign(d2, tmp_path / "d2.sig")), public_key=mallory.public
        ),
    ).artifact
    unsigned = add(db_url, model("d3", b"draft three"), "acme/d", role="draft").artifact

    def gates(draft_id: int) -> dict[str, tuple[bool, str]]:
        digest = make_pair(db_url, target.id, draft_id)
        store(db_url, digest, synthetic_result({"code": 0.8}), policy="signed")
        with session_scope(db_url) as s:
            res = validation.validate_pair(
                s, ref=digest, policy="signed", runner_version="test-1", actor=ACTOR
            )
        assert res.validation is not None
        return {g.name: (g.passed, g.measured) for g in res.validation.gates}

    ok = gates(by_ca.id)
    assert ok["signature"][0] and "by releases@acme.example" in ok["signature"][1]
    bad = gates(by_mallory.id)
    assert not bad["signature"][0]
    assert (
        f"drafter acme/d@v2: signed by {mallory.fingerprint}, not an allowed signer"
        in bad["signature"][1]
    )
    none = gates(unsigned.id)
    assert not none["signature"][0] and "drafter acme/d@v3: unsigned" in none["signature"][1]

    # Promotion re-checks the gate inside its transaction: tightening the policy (drop the
    # CA's identity) blocks the pair that validated before.
    good_digest = make_pair(db_url, target.id, by_ca.id)
    with session_scope(db_url) as s:
        policies.put_policy(
            s, text=SIGNED_POLICY.format(allowed=f'"{alice.fingerprint}"', roots=""), actor=ACTOR
        )
    refused = pytest.raises(
        Conflict, match="refused: gate signature: required signed by sha256:.*not an allowed"
    )
    with session_scope(db_url) as s, refused:
        deployments.promote(s, ref=good_digest, deployment="prod", reason="ship", actor=ACTOR)

    # At registration, a policy that requires signatures refuses an unsigned artifact.
    with pytest.raises(InvalidInput, match="refused by policy signed: unsigned"):
        add(db_url, model("d4", b"draft four"), "acme/d", role="draft", policy="signed")
