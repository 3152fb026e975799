"""Request archives: a self-describing directory of request tags, verifiable with no database.

Format ``pairreg.request-archive/1``; a directory holding

* ``requests.jsonl.gz``: one JSON object per request tag (gzip, UTF-8, one per line), whole
  ingest batches only, ordered by batch then request id: ``request_id``, ``deployment``,
  ``pair_digest``, ``served_at``, ``input_tokens``, ``output_tokens``, ``spec``,
  ``pair_filled``, ``consistent``, ``tag_digest``, ``batch_id``.
* ``batches.jsonl``: one object per archived batch: ``batch_id``, ``audit_seq``,
  ``merkle_root`` (RFC 6962 root over the batch's tag digests in request-id order, as
  recorded at ingest), ``stored``, ``created_at``, and ``event``: the ``requests.ingested``
  audit event's exact leaf bytes (``leaf_data``) with its leaf ``index`` and inclusion
  ``path`` in the log.
* ``checkpoint.txt``: the log's C2SP checkpoint the event proofs lead to.
* ``manifest.json``: format, cut-off date, counts, the SHA-256 and size of every file, the
  log's verifier key and checkpoint size/root, and ``merkle_root``: the RFC 6962 root over
  every archived tag digest in file order, which the file must reproduce.

:func:`verify_archive` re-derives every one of those facts from the files; a request is then
reconstructed (:func:`find_request`) with its tag digest, its path to the batch root and
the batch event's path to the signed checkpoint. Stdlib, ``cryptography`` and the pure
hashing modules only.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.artifacts.manifest import hash_file
from registry.trust import merkle, signed_note
from registry.trust.bundle_verify import PINNED, merkle_path, merkle_root, pin, tag_digest

FORMAT = "pairreg.request-archive/1"
REQUESTS = "requests.jsonl.gz"
BATCHES = "batches.jsonl"
CHECKPOINT = "checkpoint.txt"
MANIFEST = "manifest.json"
TAG_FIELDS = (
    "request_id",
    "deployment",
    "pair_digest",
    "served_at",
    "input_tokens",
    "output_tokens",
    "spec",
)


def read_requests(directory: Path) -> Iterator[dict[str, Any]]:
    with gzip.open(directory / REQUESTS, "rt", encoding="utf-8") as fh:
        for line in fh:
            yield json.loads(line)


def read_batches(directory: Path) -> list[dict[str, Any]]:
    with open(directory / BATCHES, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@dataclass
class ArchiveReport:
    checks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c["ok"] for c in self.checks)

    def add(self, name: str, ok: bool, detail: str) -> bool:
        self.checks.append({"name": name, "ok": ok, "detail": detail})
        return ok

    def failures(self) -> list[str]:
        return [f"{c['name']}: {c['detail']}" for c in self.checks if not c["ok"]]

    @property
    def verdict(self) -> str:
        """``verified``, ``unpinned`` (all else passed, no trusted key given) or ``failed``."""
        if self.ok:
            return "verified"
        bad = [c for c in self.checks if not c["ok"]]
        if all(c["name"] == PINNED and c["detail"].startswith("UNPINNED") for c in bad):
            return "unpinned"
        return "failed"


def _check_event(batch: dict[str, Any], cp: signed_note.Checkpoint | None) -> tuple[bool, str]:
    ev = batch.get("event") or {}
    try:
        body = json.loads(ev["leaf_data"])
        leaf = merkle.leaf_hash(ev["leaf_data"].encode("utf-8"))
        path = [bytes.fromhex(h) for h in ev["path"]]
    except (KeyError, TypeError, ValueError) as exc:
        return False, f"batch {batch.get('batch_id')}: unreadable event: {exc}"
    if body.get("seq") != batch["audit_seq"] or body.get("action") != "requests.ingested":
        return False, f"batch {batch['batch_id']}: event is not its ingest event"
    if body["payload"].get("merkle_root") != batch["merkle_root"]:
        return False, f"batch {batch['batch_id']}: event records another Merkle root"
    if body["payload"].get("batch_id") != batch["batch_id"]:
        return (
            False,
            f"batch {batch['batch_id']}: event names batch {body['payload'].get('batch_id')}",
        )
    if cp is None:
        return False, "no verified checkpoint to prove the event against"
    # The leaf index travels with the path (archives made before the sequencer have none;
    # there leaf i was event i + 1).
    index = ev.get("index", body["seq"] - 1)
    if not isinstance(index, int) or not merkle.verify_inclusion(
        leaf, index, cp.size, path, cp.root
    ):
        return (
            False,
            f"batch {batch['batch_id']}: event {body['seq']} does not prove into the checkpoint",
        )
    return True, ""


def verify_archive(directory: Path, *, trusted_log_key: str | None = None) -> ArchiveReport:
    """Every fact the manifest states, re-derived from the files (see the module doc).

    ``trusted_log_key``: the log's verifier key, PEM key or a trust file's text, obtained
    out of band. Without it the archive is at best ``unpinned`` (the manifest names its own
    key), never ``ok``."""
    report = ArchiveReport()
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        report.add("manifest", False, f"unreadable: {exc}")
        return report
    if manifest.get("format") != FORMAT:
        report.add("manifest", False, f"not a {FORMAT} archive")
        return report
    for name, meta in sorted(manifest.get("files", {}).items()):
        path = directory / name
        ok = path.is_file() and hash_file(path).sha256 == meta.get("sha256")
        report.add(f"file {name}", ok, "sha256 matches" if ok else "missing or altered")
    if not report.ok:
        return report
    cp = None
    trusted = pin(report, trusted_log_key)
    try:
        log = signed_note.Verifier.parse(manifest.get("verifier_key", ""))
        if trusted is not None and log.public not in trusted:
            raise signed_note.NoteError(f"signed by {log.name}, a key you do not trust")
        cp, _ = signed_note.open_checkpoint((directory / CHECKPOINT).read_text(), log)
        same = (
            cp.size == manifest["checkpoint"]["tree_size"]
            and cp.root.hex() == manifest["checkpoint"]["root_hash"]
        )
        report.add(
            "checkpoint",
            same,
            f"signed by {log.name} at size {cp.size}"
            + ("" if same else ", but not the one the manifest names"),
        )
    except (signed_note.NoteError, OSError, KeyError) as exc:
        report.add("checkpoint", False, str(exc))

    batches = read_batches(directory)
    by_batch: dict[int, list[str]] = {b["batch_id"]: [] for b in batches}
    order: dict[int, list[str]] = {b["batch_id"]: [] for b in batches}
    digests: list[str] = []
    bad_tags = 0
    cutoff = manifest["before"] + "T00:00:00.000000Z"
    late = 0
    for row in read_requests(directory):
        recomputed = tag_digest(**{k: row[k] for k in TAG_FIELDS})
        if recomputed != row["tag_digest"]:
            bad_tags += 1
        if row["served_at"] >= cutoff:
            late += 1
        digests.append(recomputed)
        if row["batch_id"] in by_batch:
            by_batch[row["batch_id"]].append(recomputed)
            order[row["batch_id"]].append(row["request_id"])
    report.add("tag digests", bad_tags == 0, f"{len(digests) - bad_tags}/{len(digests)} recompute")
    report.add("cut-off", late == 0, f"{late} request(s) served on or after {manifest['before']}")
    root = merkle_root(digests)
    report.add(
        "archive root",
        root == manifest.get("merkle_root") and len(digests) == manifest["counts"]["requests"],
        f"{len(digests)} tags hash to {root[:16]}…, manifest says "
        f"{str(manifest.get('merkle_root'))[:16]}…",
    )
    wrong = []
    for b in batches:
        ids = order[b["batch_id"]]
        ok = (
            ids == sorted(ids)
            and len(ids) == b["stored"]
            and merkle_root(by_batch[b["batch_id"]]) == b["merkle_root"]
        )
        if not ok:
            wrong.append(f"batch {b['batch_id']}: its tags do not hash to its Merkle root")
            continue
        ok, why = _check_event(b, cp)
        if not ok:
            wrong.append(why)
    report.add(
        "batches",
        not wrong,
        "; ".join(wrong[:5])
        if wrong
        else f"{len(batches)} batch roots recompute and their "
        "ingest events prove into the checkpoint",
    )
    return report


def find_request(
    directory: Path, request_id: str, *, trusted_log_key: str | None = None
) -> dict[str, Any]:
    """Reconstruct one archived request: the tag, its digest, its path to its batch root,
    the batch's ingest event and that event's path to the signed checkpoint — after
    verifying the whole archive. Raises KeyError when the archive does not hold it."""
    report = verify_archive(directory, trusted_log_key=trusted_log_key)
    tag = None
    for row in read_requests(directory):
        if row["request_id"] == request_id:
            tag = row
            break
    if tag is None:
        raise KeyError(request_id)
    batch = next(b for b in read_batches(directory) if b["batch_id"] == tag["batch_id"])
    members = [r for r in read_requests(directory) if r["batch_id"] == tag["batch_id"]]
    digests = [r["tag_digest"] for r in members]
    index = [r["request_id"] for r in members].index(request_id)
    return {
        "tag": {k: tag[k] for k in (*TAG_FIELDS, "pair_filled", "consistent", "batch_id")},
        "tag_digest": tag_digest(**{k: tag[k] for k in TAG_FIELDS}),
        "batch": {k: v for k, v in batch.items() if k != "event"},
        "inclusion": {
            "index": index,
            "size": len(digests),
            "path": merkle_path(digests, index),
            "root": batch["merkle_root"],
        },
        "event": batch["event"],
        "checks": report.checks,
        "ok": report.ok,
        "verdict": report.verdict,
    }
