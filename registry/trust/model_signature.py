"""Verifying an OpenSSF model-signing signature (PyPI ``model-signing`` 1.x) offline.

A model signature is a Sigstore bundle holding a DSSE envelope around an in-toto statement
(predicate ``https://model_signing/signature/v1.0``) that lists every file's SHA-256. Two
offline kinds are supported:

* **key**: signed with an elliptic-curve private key; the caller supplies the public key
  (PEM). The signer's identity is the key's fingerprint, ``sha256:<hex of SHA-256 over the
  DER SubjectPublicKeyInfo>`` (``openssl pkey -pubin -outform DER | sha256sum``).
* **certificate**: signed with a key whose X.509 certificate is in the bundle; the caller
  supplies the CA certificate(s) to verify the chain against. Identities are the signing
  certificate's subject alternative names (e-mail, URI, DNS), its subject common name, and
  its key fingerprint; ``root_fingerprint`` is the SHA-256 of the CA certificate (DER) the
  chain ends at, which a policy pins with ``trusted_roots``.

Sigstore keyless bundles need the public-good instance's trust root and transparency log,
which cannot be reached here: they are refused with that reason.

The library re-hashes the directory and compares every digest; the signed file list is then
compared with the registry's own manifest too, so "an unsigned extra file", "a missing file"
and "a changed file" are each reported by path.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

PREDICATE = "https://model_signing/signature/v1.0"
DEFAULT_NAME = "model.sig"


class SignatureError(ValueError):
    """The signature is malformed, does not verify, or does not match the files."""


@dataclass
class SignatureCheck:
    kind: str  # "key" | "certificate"
    signer: str  # the main identity: key fingerprint, or the certificate's first SAN / CN
    identities: list[str]
    key_fingerprint: str
    subject_digest: str  # the in-toto subject's sha256 (model-signing's root digest)
    resources: list[dict[str, str]]
    ignored: list[str]
    root_fingerprint: str | None = None
    bundle: str = field(default="", repr=False)

    def to_record(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "signer": self.signer,
            "identities": self.identities,
            "key_fingerprint": self.key_fingerprint,
            "root_fingerprint": self.root_fingerprint,
            "subject_digest": self.subject_digest,
            "predicate": PREDICATE,
            "files": len(self.resources),
            "ignored": self.ignored,
        }


def key_fingerprint(public_key: Any) -> str:
    der = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return "sha256:" + hashlib.sha256(der).hexdigest()


def cert_fingerprint(cert: x509.Certificate) -> str:
    return "sha256:" + hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def _statement(bundle: dict[str, Any]) -> dict[str, Any]:
    try:
        payload = base64.b64decode(bundle["dsseEnvelope"]["payload"])
        statement = json.loads(payload)
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise SignatureError(f"the signature has no readable in-toto statement: {exc}") from exc
    if statement.get("predicateType") != PREDICATE:
        raise SignatureError(
            f"the signature's predicate is {statement.get('predicateType')!r}, not a "
            f"model-signing {PREDICATE}"
        )
    return statement


def _identities(cert: x509.Certificate) -> list[str]:
    out: list[str] = []
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        for kind in (x509.RFC822Name, x509.UniformResourceIdentifier, x509.DNSName):
            out.extend(str(v) for v in san.get_values_for_type(kind))
    except x509.ExtensionNotFound:
        pass
    out.extend(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME))
    return out


def _root_of(leaf: x509.Certificate, pool: list[x509.Certificate]) -> x509.Certificate | None:
    """Follow issuers from the signing certificate to a self-issued CA in ``pool``."""
    current, seen = leaf, 0
    while current.issuer != current.subject and seen < 10:
        parent = next((c for c in pool if c.subject == current.issuer), None)
        if parent is None:
            return None
        current, seen = parent, seen + 1
    return current if current is not leaf else None


def _library_verify(model_dir: Path, sig_path: Path, config: Any) -> None:
    try:
        config.verify(model_dir, sig_path)
    except ValueError as exc:
        text = str(exc)
        if text.startswith("Signature mismatch"):
            raise SignatureError(
                "the signature does not match the files: " + text.split(":", 1)[1].strip()
            ) from exc
        raise SignatureError(f"the signature does not verify: {text}") from exc
    except Exception as exc:  # noqa: BLE001 - any library failure is a refusal, with its reason
        name = type(exc).__name__
        raise SignatureError(f"the signature does not verify ({name}): {exc}") from exc


def verify(
    model_dir: Path,
    signature_path: Path,
    *,
    public_key: str | None = None,
    certificate_chain: list[str] | None = None,
    manifest: list[dict[str, Any]] | None = None,
) -> SignatureCheck:
    """Verify ``signature_path`` over ``model_dir``; raise :class:`SignatureError` with the
    reason on any failure. ``manifest`` (the registry's ``{path, sha256}`` entries for the
    same files) is cross-checked against the signed file list."""
    try:
        text = signature_path.read_text(encoding="utf-8")
        bundle = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SignatureError(f"cannot read signature {signature_path}: {exc}") from exc
    if not isinstance(bundle, dict):
        raise SignatureError(f"{signature_path} is not a Sigstore bundle")
    statement = _statement(bundle)
    material = bundle.get("verificationMaterial") or {}

    import model_signing  # heavy; only when a signature is checked

    with tempfile.TemporaryDirectory(prefix="pairreg-sig-") as tmp:
        if "publicKey" in material:
            if not public_key:
                raise SignatureError(
                    "this is a key signature: give the signer's public key (PEM) to verify it"
                )
            try:
                pub = serialization.load_pem_public_key(public_key.encode())
            except ValueError as exc:
                raise SignatureError(f"the public key is not a PEM public key: {exc}") from exc
            key_file = Path(tmp) / "key.pub"
            key_file.write_text(public_key)
            try:
                config = model_signing.verifying.Config().use_elliptic_key_verifier(
                    public_key=key_file
                )
            except ValueError as exc:
                raise SignatureError(f"unsupported public key: {exc}") from exc
            _library_verify(model_dir, signature_path, config)
            fp = key_fingerprint(pub)
            kind, signer, identities, root_fp = "key", fp, [fp], None
        elif "x509CertificateChain" in material:
            if not certificate_chain:
                raise SignatureError(
                    "this is a certificate signature: give the CA certificate(s) to verify "
                    "its chain against"
                )
            try:
                pool = [
                    c
                    for pem in certificate_chain
                    for c in x509.load_pem_x509_certificates(pem.encode())
                ]
                in_bundle = [
                    x509.load_der_x509_certificate(base64.b64decode(c["rawBytes"]))
                    for c in material["x509CertificateChain"]["certificates"]
                ]
            except (ValueError, KeyError, TypeError, binascii.Error) as exc:
                raise SignatureError(f"unreadable certificate: {exc}") from exc
            chain_file = Path(tmp) / "chain.pem"
            chain_file.write_text("\n".join(certificate_chain))
            config = model_signing.verifying.Config().use_certificate_verifier(
                certificate_chain=[chain_file]
            )
            _library_verify(model_dir, signature_path, config)
            leaf = in_bundle[0]
            root = _root_of(leaf, pool + in_bundle[1:])
            fp = key_fingerprint(leaf.public_key())
            names = _identities(leaf)
            kind, signer = "certificate", (names[0] if names else fp)
            identities = [*names, fp]
            root_fp = cert_fingerprint(root) if root is not None else None
        else:
            raise SignatureError(
                "Sigstore keyless signatures need the public Sigstore trust root and log, "
                "which this registry cannot reach: sign with a key or a certificate"
            )

    predicate = statement.get("predicate") or {}
    resources = [{"name": r["name"], "digest": r["digest"]} for r in predicate.get("resources", [])]
    ignored = [str(p) for p in (predicate.get("serialization") or {}).get("ignore_paths", [])]
    subjects = statement.get("subject") or [{}]
    subject_digest = str((subjects[0].get("digest") or {}).get("sha256", ""))
    method = (predicate.get("serialization") or {}).get("method")
    if manifest is not None and method == "files":  # shard names are "path:start:end"
        _cross_check(resources, ignored, manifest, signature_path, model_dir)
    return SignatureCheck(
        kind=kind,
        signer=signer,
        identities=identities,
        key_fingerprint=fp,
        subject_digest=subject_digest,
        resources=resources,
        ignored=ignored,
        root_fingerprint=root_fp,
        bundle=text,
    )


def _cross_check(
    resources: list[dict[str, str]],
    ignored: list[str],
    manifest: list[dict[str, Any]],
    signature_path: Path,
    model_dir: Path,
) -> None:
    """The signed files are exactly the registered files (less the signature itself)."""
    skip = set(ignored)
    try:
        skip.add(str(signature_path.resolve().relative_to(model_dir.resolve())))
    except ValueError:
        pass
    ours = {e["path"]: e["sha256"] for e in manifest if e["path"] not in skip}
    signed = {r["name"]: r["digest"] for r in resources}
    extra = sorted(set(ours) - set(signed))
    missing = sorted(set(signed) - set(ours))
    changed = sorted(p for p in set(ours) & set(signed) if ours[p] != signed[p])
    problems = []
    if extra:
        problems.append("unsigned file(s) " + ", ".join(extra))
    if missing:
        problems.append("signed file(s) missing " + ", ".join(missing))
    if changed:
        problems.append("file(s) differ from their signed digest " + ", ".join(changed))
    if problems:
        raise SignatureError("the signature does not cover these files: " + "; ".join(problems))


def signer_refusal(
    signature: dict[str, Any] | None,
    *,
    require: bool,
    allowed: list[str],
    trusted_roots: list[str],
) -> str | None:
    """Why an artifact's recorded signature does not satisfy a policy (None: it does).

    ``allowed`` holds key fingerprints (``sha256:…``, any kind of signature) and certificate
    identities; an identity counts only for a certificate whose chain ends at one of
    ``trusted_roots`` (CA certificate fingerprints), since anyone can issue a certificate
    naming anyone from a CA of their own.
    """
    if signature is None:
        return "unsigned" if require or allowed else None
    if not allowed:
        return None
    if signature["key_fingerprint"] in allowed:
        return None
    if signature["kind"] == "certificate":
        named = [i for i in signature["identities"] if i in allowed]
        if named and signature.get("root_fingerprint") in trusted_roots:
            return None
        if named:
            return (
                f"signed by {named[0]} under CA {signature.get('root_fingerprint')}, which is "
                "not in provenance.trusted_roots"
            )
    return f"signed by {signature['signer']}, not an allowed signer"
