"""Offline verification of an audit bundle: no database, no server, no registry state.

Imports only the stdlib, ``cryptography`` and the pure hashing modules
(``registry.canonical``, ``registry.artifacts.manifest``, ``registry.trust.merkle``,
``registry.trust.signed_note``), so an auditor can run it on a copy of the code and a bundle file
alone. What it checks, in order, and the reason it gives on failure:

1. every artifact's manifest digest, recomputed from its manifest entries;
2. the pair digest, recomputed from both manifest digests and the config;
3. the tag digest, recomputed from the tag's fields, and that the tag names that pair;
4. the tag's Merkle inclusion path up to the batch root (RFC 6962 hashing);
5. the C2SP checkpoint of the audit log's Merkle tree (``log``): its Ed25519 signature, and
   that its key is one you trust: without a pinned key or trust file the verdict is
   ``unpinned``, never verified (the key inside the bundle proves only that whoever made the
   file signed it);
6. each cited event's RFC 6962 inclusion proof into that checkpoint: the event's exact leaf
   bytes hash, with log2(n) sibling hashes, to the signed root, so a bundle's size does not
   grow with the log (format ``pairreg.audit-bundle/2``). A version 1 bundle (issued while
   the hash chain was kept) is checked as it was: its chain segment link by link up to its
   Ed25519 chain checkpoint, then the same log proofs;
7. that the events in the segment say what the bundle says: the artifacts were added with
   those manifest digests, the pair registered with that digest, the batch event carries
   that Merkle root, the promotion moved the deployment to that pair;
8. optionally, weight directories re-hashed against the artifacts' manifests.

Also home of the tag digest and the Merkle tree, which the ingest service uses, so the
writer and the verifier cannot disagree on the byte form.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from registry.artifacts.manifest import (
    ManifestError,
    build_manifest,
    compare_manifests,
    hub_snapshot_root,
    manifest_digest,
)
from registry.canonical import canonical_json, digest_of, sha256_hex
from registry.trust import merkle, signed_note

BUNDLE_FORMAT = "pairreg.audit-bundle/2"
# Bundles issued before the log proofs replaced the chain segment still verify.
BUNDLE_FORMAT_V1 = "pairreg.audit-bundle/1"
GENESIS_HASH = "0" * 64


# --- shared byte forms ----------------------------------------------------------------


def format_time(value: datetime) -> str:
    """The audit log's time form: UTC, microseconds, ``Z``."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def tag_body(
    *,
    request_id: str,
    deployment: str,
    pair_digest: str,
    served_at: datetime | str,
    input_tokens: int,
    output_tokens: int,
    spec: dict[str, Any] | None,
) -> dict[str, Any]:
    """The fields a tag digest covers (exactly these, in canonical JSON)."""
    if isinstance(served_at, str):
        served_at = datetime.fromisoformat(served_at.replace("Z", "+00:00"))
    return {
        "request_id": request_id,
        "deployment": deployment,
        "pair_digest": pair_digest,
        "served_at": format_time(served_at),
        "input_tokens": int(input_tokens),
        "output_tokens": int(output_tokens),
        "spec": spec,
    }


def tag_digest(**fields: Any) -> str:
    return digest_of(tag_body(**fields))


def chain_step(prev_hash: str, body: dict[str, Any]) -> str:
    """``SHA-256(bytes(prev) || canonical(event))``, identical to ``registry.trust.audit``."""
    return sha256_hex(bytes.fromhex(prev_hash) + canonical_json(body))


def _leaf(digest_hex: str) -> bytes:
    return hashlib.sha256(b"\x00" + bytes.fromhex(digest_hex)).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """Largest power of two strictly less than ``n`` (RFC 6962 §2.1)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def _root(leaves: list[bytes]) -> bytes:
    if len(leaves) == 1:
        return leaves[0]
    k = _split(len(leaves))
    return _node(_root(leaves[:k]), _root(leaves[k:]))


def merkle_root(digests: list[str]) -> str:
    """RFC 6962 Merkle tree hash over tag digests in the given order (empty: SHA-256 of b'')."""
    if not digests:
        return hashlib.sha256(b"").hexdigest()
    return merkle.root_from_leaves([_leaf(d) for d in digests]).hex()  # bottom-up: no recursion


def merkle_path(digests: list[str], index: int) -> list[str]:
    """The audit path for leaf ``index`` (RFC 6962 §2.1.1), deepest sibling first."""

    def path(leaves: list[bytes], m: int) -> list[bytes]:
        if len(leaves) <= 1:
            return []
        k = _split(len(leaves))
        if m < k:
            return path(leaves[:k], m) + [_root(leaves[k:])]
        return path(leaves[k:], m - k) + [_root(leaves[:k])]

    return [h.hex() for h in path([_leaf(d) for d in digests], index)]


def merkle_verify(leaf_digest: str, index: int, size: int, path: list[str], root: str) -> bool:
    """Recompute the root from one leaf and its audit path (RFC 9162 §2.1.3.2)."""
    if not 0 <= index < size:
        return False
    fn, sn = index, size - 1
    r = _leaf(leaf_digest)
    for sibling_hex in path:
        sibling = bytes.fromhex(sibling_hex)
        if sn == 0:
            return False
        if fn % 2 == 1 or fn == sn:
            r = _node(sibling, r)
            while fn % 2 == 0 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = _node(r, sibling)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r.hex() == root


# --- the verifier ---------------------------------------------------------------------

PINNED = "pinned key"
UNPINNED = (
    "UNPINNED: the signatures were checked only against the key carried inside the file, "
    "which whoever wrote the file chose; pass the log's public key (--public-key) or a trust "
    "file (--trust-file) obtained out of band"
)


def pin(report: Any, trusted: str | None) -> set[bytes] | None:
    """The trusted keys (a PEM key or a trust file's text), recorded as the ``pinned key``
    check; None (and a failed, plainly ``UNPINNED`` check) when none was given."""
    if trusted is None:
        report.add(PINNED, False, UNPINNED)
        return None
    try:
        keys = signed_note.trusted_keys(trusted)
    except signed_note.NoteError as exc:
        report.add(PINNED, False, str(exc))
        return set()
    report.add(PINNED, True, f"{len(keys)} trusted key(s) given")
    return keys


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class BundleReport:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def add(self, name: str, ok: bool, detail: str) -> bool:
        self.checks.append(Check(name, ok, detail))
        return ok

    @property
    def verdict(self) -> str:
        """``verified``; ``unpinned`` when every check passed but the signing key came only
        from inside the file (nothing is verified then: whoever forged the file could have
        signed it with a key of their own); else ``failed``."""
        if self.ok:
            return "verified"
        if all(c.name == PINNED and c.detail.startswith("UNPINNED") for c in self.failures):
            return "unpinned"
        return "failed"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "verdict": self.verdict,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
        }


def _pair_artifacts(pair: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = [("target", pair["target"])]
    if pair.get("drafter"):
        out.append(("drafter", pair["drafter"]))
    return out


def _check_artifacts(report: BundleReport, pair: dict[str, Any]) -> None:
    for role, art in _pair_artifacts(pair):
        try:
            recomputed = manifest_digest(art.get("manifest") or [])
        except ManifestError as exc:
            report.add(f"{role} manifest", False, f"malformed manifest: {exc}")
            continue
        report.add(
            f"{role} manifest",
            recomputed == art.get("manifest_digest"),
            f"recomputed {recomputed} vs recorded {art.get('manifest_digest')}",
        )


def _check_pair(report: BundleReport, pair: dict[str, Any]) -> None:
    drafter = pair.get("drafter")
    recomputed = digest_of(
        {
            "target": pair["target"]["manifest_digest"],
            "drafter": drafter["manifest_digest"] if drafter else None,
            "config": pair["config"],
        }
    )
    report.add(
        "pair digest",
        recomputed == pair["pair_digest"],
        f"recomputed {recomputed} vs recorded {pair['pair_digest']}",
    )


def _check_tag(report: BundleReport, bundle: dict[str, Any]) -> None:
    tag = bundle["tag"]
    recomputed = tag_digest(
        request_id=tag["request_id"],
        deployment=tag["deployment"],
        pair_digest=tag["pair_digest"],
        served_at=tag["served_at"],
        input_tokens=tag["input_tokens"],
        output_tokens=tag["output_tokens"],
        spec=tag.get("spec"),
    )
    report.add(
        "tag digest",
        recomputed == tag["tag_digest"],
        f"recomputed {recomputed} vs recorded {tag['tag_digest']}",
    )
    report.add(
        "tag names the pair",
        tag["pair_digest"] == bundle["pair"]["pair_digest"],
        f"tag pair {tag['pair_digest']} vs bundle pair {bundle['pair']['pair_digest']}",
    )
    inc = bundle["inclusion"]
    ok = merkle_verify(recomputed, int(inc["index"]), int(inc["size"]), inc["path"], inc["root"])
    report.add(
        "tag in batch",
        ok,
        f"leaf {inc['index']} of {inc['size']} {'proves' if ok else 'does not prove'} "
        f"root {inc['root']}",
    )


def _check_chain(report: BundleReport, bundle: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Recompute the segment; returns events by seq when it is intact (else empty)."""
    segment = bundle["chain"]
    events = segment["events"]
    checkpoint = bundle["checkpoint"]
    prev = segment["prev_hash"]
    expected = int(segment["start_seq"])
    if not events:
        report.add("audit chain", False, "the bundle's chain segment is empty")
        return {}
    for event in events:
        body = {
            k: event[k]
            for k in ("seq", "occurred_at", "actor", "action", "entity_type", "entity_id")
        }
        body["payload"] = event["payload"]
        if event["seq"] != expected:
            detail = f"sequence gap: expected {expected}, got {event['seq']}"
            report.add("audit chain", False, detail)
            return {}
        if event["prev_hash"] != prev:
            report.add("audit chain", False, f"event {expected}: prev_hash does not link")
            return {}
        if chain_step(prev, body) != event["chain_hash"]:
            report.add("audit chain", False, f"event {expected}: chain hash mismatch (altered)")
            return {}
        prev = event["chain_hash"]
        expected += 1
    last = events[-1]
    if last["seq"] != int(checkpoint["seq"]) or last["chain_hash"] != checkpoint["chain_hash"]:
        report.add(
            "audit chain",
            False,
            f"segment ends at {last['seq']} {last['chain_hash'][:12]}, checkpoint is "
            f"{checkpoint['seq']} {str(checkpoint['chain_hash'])[:12]}",
        )
        return {}
    report.add(
        "audit chain",
        True,
        f"{len(events)} events {segment['start_seq']}..{last['seq']} link to the checkpoint",
    )
    return {e["seq"]: e for e in events}


def _check_signature(
    report: BundleReport, checkpoint: dict[str, Any], trusted: set[bytes] | None
) -> None:
    try:
        body = {
            "seq": int(checkpoint["seq"]),
            "chain_hash": str(checkpoint["chain_hash"]),
            "signed_at": format_time(
                datetime.fromisoformat(str(checkpoint["signed_at"]).replace("Z", "+00:00"))
            ),
        }
        pub = serialization.load_pem_public_key(str(checkpoint["public_key"]).encode())
        signature = base64.b64decode(str(checkpoint["signature"]))
    except (KeyError, ValueError, TypeError) as exc:
        report.add("checkpoint signature", False, f"malformed checkpoint: {exc}")
        return
    if not isinstance(pub, Ed25519PublicKey):
        report.add("checkpoint signature", False, "checkpoint key is not Ed25519")
        return
    try:
        pub.verify(signature, canonical_json(body))
    except InvalidSignature:
        report.add("checkpoint signature", False, "signature does not verify")
        return
    report.add("checkpoint signature", True, f"Ed25519 signature over head {body['seq']} verifies")
    if trusted is not None:
        same = signed_note.raw_public(pub) in trusted
        report.add(
            "trusted key",
            same,
            "checkpoint signed by a trusted key" if same else "signed by a key you do not trust",
        )


def _check_events(
    report: BundleReport, bundle: dict[str, Any], by_seq: dict[int, dict[str, Any]]
) -> None:
    """The events the bundle cites exist in the verified segment and say the same thing."""
    refs = bundle["events"]
    pair = bundle["pair"]

    def event(name: str, key: str) -> dict[str, Any] | None:
        seq = refs.get(key)
        if seq is None:
            report.add(name, False, f"the bundle cites no {key} event")
            return None
        ev = by_seq.get(int(seq))
        if ev is None:
            report.add(name, False, f"event {seq} is not among the verified events")
        return ev

    for role, art in _pair_artifacts(pair):
        ev = event(f"{role} added event", f"{role}_added")
        if ev is not None:
            got = ev["payload"].get("manifest_digest")
            report.add(
                f"{role} added event",
                ev["action"] == "artifact.added" and got == art["manifest_digest"],
                f"event {ev['seq']} {ev['action']} records manifest {got}",
            )
    ev = event("pair registered event", "pair_registered")
    if ev is not None:
        p = ev["payload"]
        drafter = pair.get("drafter")
        drafter_digest = drafter["manifest_digest"] if drafter else None
        ok = (
            ev["action"] == "pair.registered"
            and p.get("pair_digest") == pair["pair_digest"]
            and p.get("target_manifest_digest") == pair["target"]["manifest_digest"]
            and p.get("drafter_manifest_digest") == drafter_digest
            and p.get("config") == pair["config"]
        )
        report.add("pair registered event", ok, f"event {ev['seq']} records {p.get('pair_digest')}")
    ev = event("ingest batch event", "ingest_batch")
    if ev is not None:
        root = ev["payload"].get("merkle_root")
        report.add(
            "ingest batch event",
            root == bundle["inclusion"]["root"]
            and ev["payload"].get("stored") == bundle["inclusion"]["size"],
            f"event {ev['seq']} records root {root}",
        )
    if bundle["tag"].get("consistent"):
        ev = event("promotion event", "promotion")
        if ev is not None:
            text = json.dumps(ev["payload"], sort_keys=True)
            report.add(
                "promotion event",
                pair["pair_digest"] in text,
                f"event {ev['seq']} {ev['action']} names the pair",
            )
    else:
        report.add(
            "tag consistency",
            True,
            "the tag is recorded as INCONSISTENT: its pair was not live on the deployment then",
        )


def _check_weights(report: BundleReport, pair: dict[str, Any], weights: list[str]) -> None:
    arts = dict(_pair_artifacts(pair))
    for spec in weights:
        role, _, where = spec.partition("=") if "=" in spec else ("", "", spec)
        try:
            directory = Path(where).expanduser()
            actual = build_manifest(directory, symlink_root=hub_snapshot_root(directory))
        except ManifestError as exc:
            report.add(f"weights {where}", False, str(exc))
            continue
        if role:
            if role not in arts:
                report.add(f"weights {where}", False, f"no {role} in this pair")
                continue
            candidates = [(role, arts[role])]
        else:
            candidates = list(arts.items())
        match = [r for r, a in candidates if a["manifest_digest"] == actual.digest]
        if match:
            report.add(f"weights {where}", True, f"files match the {match[0]} manifest")
            continue
        # Report the difference against the artifact these files most resemble.
        names = {e["path"] for e in actual.entries}
        best_role, best = max(
            candidates, key=lambda ra: len(names & {e["path"] for e in ra[1]["manifest"]})
        )
        diff = compare_manifests(best["manifest"], actual)
        report.add(
            f"weights {where}",
            False,
            f"files differ from the {best_role} manifest: changed {diff.changed}, "
            f"missing {diff.missing}, added {diff.added}",
        )


def _check_log(
    report: BundleReport,
    bundle: dict[str, Any],
    by_seq: dict[int, dict[str, Any]],
    trusted: set[bytes] | None,
) -> dict[int, dict[str, Any]]:
    """The cited events prove into the log's signed Merkle-tree checkpoint (and, in a
    version 1 bundle, each proven leaf is the event the chain segment holds). Returns the
    proven event bodies by sequence number (empty when the checkpoint does not verify)."""
    log = bundle["log"]
    try:
        verifier = signed_note.Verifier.parse(log["verifier_key"])
        cp, _ = signed_note.open_checkpoint(log["checkpoint"], verifier)
    except (signed_note.NoteError, KeyError) as exc:
        report.add("log checkpoint", False, f"checkpoint does not verify: {exc}")
        return {}
    report.add("log checkpoint", True, f"{cp.origin} signed size {cp.size}")
    if trusted is not None:
        same = verifier.public in trusted
        report.add(
            "log checkpoint key",
            same,
            "signed by a trusted key" if same else "signed by a key you do not trust",
        )
    bad = []
    proven: dict[int, dict[str, Any]] = {}
    for seq_text, entry in sorted(log["events"].items(), key=lambda kv: int(kv[0])):
        seq = int(seq_text)
        data = entry["leaf_data"]
        leaf = merkle.leaf_hash(data.encode("utf-8"))
        path = [bytes.fromhex(h) for h in entry["path"]]
        body = json.loads(data)
        # The leaf's index travels with its path; bundles made before the sequencer have
        # none, and there leaf i was event i + 1.
        index = entry.get("index", seq - 1)
        if (
            body.get("seq") != seq
            or not isinstance(index, int)
            or not merkle.verify_inclusion(leaf, index, cp.size, path, cp.root)
        ):
            bad.append(f"event {seq} does not prove into the checkpoint")
            continue
        proven[seq] = body
        chained = by_seq.get(seq)
        if chained is not None and any(body.get(k) != chained.get(k) for k in body):
            bad.append(f"event {seq} in the tree differs from the chain segment's")
    report.add(
        "log inclusion",
        not bad,
        "; ".join(bad) if bad else f"{len(log['events'])} cited events are in the signed log",
    )
    return proven


def verify_bundle(
    bundle: dict[str, Any],
    *,
    weights: list[str] | None = None,
    trusted_public_key: str | None = None,
) -> BundleReport:
    """Every check above; a malformed bundle is a failed check, never an exception.

    ``trusted_public_key``: the log's PEM public key or a trust file's text. Without it the
    report is at best ``unpinned``, never ``ok``."""
    report = BundleReport()
    trusted = pin(report, trusted_public_key)
    if bundle.get("format") == BUNDLE_FORMAT_V1:
        return _verify_v1(report, bundle, weights, trusted)
    if bundle.get("format") != BUNDLE_FORMAT:
        report.add("format", False, f"not a {BUNDLE_FORMAT} bundle: {bundle.get('format')!r}")
        return report
    try:
        _check_artifacts(report, bundle["pair"])
        _check_pair(report, bundle["pair"])
        _check_tag(report, bundle)
        proven = _check_log(report, bundle, {}, trusted)
        if proven:
            _check_events(report, bundle, proven)
        if weights:
            _check_weights(report, bundle["pair"], weights)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        report.add("structure", False, f"malformed bundle: {type(exc).__name__}: {exc}")
    return report


def _verify_v1(
    report: BundleReport,
    bundle: dict[str, Any],
    weights: list[str] | None,
    trusted: set[bytes] | None,
) -> BundleReport:
    """A version 1 bundle: the audit chain segment and its Ed25519 checkpoint, plus the log
    proofs when present (bundles issued while the hash chain was kept)."""
    try:
        _check_artifacts(report, bundle["pair"])
        _check_pair(report, bundle["pair"])
        _check_tag(report, bundle)
        by_seq = _check_chain(report, bundle)
        _check_signature(report, bundle["checkpoint"], trusted)
        if by_seq:
            _check_events(report, bundle, by_seq)
        if "log" in bundle:
            _check_log(report, bundle, by_seq, trusted)
        if weights:
            _check_weights(report, bundle["pair"], weights)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        report.add("structure", False, f"malformed bundle: {type(exc).__name__}: {exc}")
    return report
