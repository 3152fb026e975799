"""The audit log as a transparency log: inclusion and consistency proofs, C2SP checkpoints.

Proofs are computed from the stored subtrees (registry.trust.audit_tree), so they cost the same
at a million events as at a hundred. A checkpoint is signed only after the log has checked
that it extends the newest checkpoint it signed before (a consistency proof from the stored
tree) and that every leaf added since matches its event: a log must never sign two
inconsistent checkpoints (c2sp.org/tlog-checkpoint).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import Field
from sqlalchemy import event, select
from sqlalchemy.orm import Session

from registry.errors import Conflict, InvalidInput, NotFound
from registry.records.trust import (
    ConsistencyProofRecord,
    InclusionProofRecord,
    LogCheckpointRecord,
    TreeVerifyResult,
)
from registry.tables import AuditEvent, AuditLeaf, LogCheckpoint, utcnow
from registry.trust import audit, audit_tree, merkle, signed_note

logger = logging.getLogger("pairreg.transparency")


def _size_arg(session: Session, value: int | None, field: str, *, at_least: int = 0) -> int:
    audit.integrate(session)  # integrate before read
    current = audit_tree.tree_size(session)
    if value is None:
        return current
    if not at_least <= value <= current:
        raise InvalidInput(
            f"{field} must be between {at_least} and the log's size {current}, got {value}",
            field=field,
        )
    return value


def prove_inclusion(
    session: Session,
    *,
    seq: Annotated[int, Field(ge=1)],
    tree_size: Annotated[int | None, Field(ge=1)] = None,
) -> InclusionProofRecord:
    """Audit path from event ``seq`` (at its leaf ``leaf_index``) to the root of the tree of
    ``tree_size`` leaves (default: the whole log now); check it against a checkpoint of that
    size."""
    if seq < 1:
        raise InvalidInput("seq must be at least 1", field="seq")
    size = _size_arg(session, tree_size, "tree_size", at_least=1)
    event = session.get(AuditEvent, seq)
    if event is None:
        raise NotFound(f"no audit event {seq}", field="seq")
    index = session.scalar(select(AuditLeaf.idx).where(AuditLeaf.seq == seq))
    if index is None or index >= size:
        raise NotFound(f"event {seq} is not in a tree of {size} events", field="seq")
    proof = audit_tree.inclusion_proof(session, index, size)
    body = audit.event_body(event)
    data = audit_tree.event_leaf_data(body)
    return InclusionProofRecord(
        seq=seq,
        leaf_index=index,
        tree_size=size,
        event=body,
        leaf_data=data.decode("utf-8"),
        leaf_hash=merkle.leaf_hash(data).hex(),
        path=[h.hex() for h in proof.path],
        root_hash=proof.root.hex(),
    )


def prove_consistency(
    session: Session,
    *,
    old_size: Annotated[int, Field(ge=0)],
    new_size: Annotated[int | None, Field(ge=0)] = None,
) -> ConsistencyProofRecord:
    """RFC 9162 consistency proof that the tree of ``new_size`` events (default: now)
    extends the tree of ``old_size`` events."""
    new = _size_arg(session, new_size, "new_size")
    if not 0 <= old_size <= new:
        raise InvalidInput(
            f"old_size must be between 0 and {new}, got {old_size}", field="old_size"
        )
    proof = audit_tree.consistency_proof(session, old_size, new)
    return ConsistencyProofRecord(
        old_size=old_size,
        new_size=new,
        old_root=proof.old_root.hex(),
        new_root=proof.new_root.hex(),
        path=[h.hex() for h in proof.path],
    )


# --- checkpoints ------------------------------------------------------------------------


def log_origin(public: bytes, configured: str | None = None) -> str:
    """The checkpoints' origin line: the one configured (``origin`` in the operation's
    context, from the serving process's settings), else named by the log's public key."""
    if configured:
        return signed_note.check_name(configured)
    return f"pairreg/audit/{hashlib.sha256(public).hexdigest()[:16]}"


def key_file(key_path: str | None) -> Path:
    """The log's signing key: the one the operation's context names (the serving process's
    own, for every declared operation); only a direct caller that names none (a script, a
    test) gets the configured home's."""
    if key_path:
        return Path(key_path)
    from registry.settings import get_settings

    return get_settings().signing_key_path


def _log_key(
    key_path: str | None, origin: str | None
) -> tuple[Ed25519PrivateKey, signed_note.Verifier]:
    path = key_file(key_path)
    if not path.exists():
        raise InvalidInput(f"no signing key at {path}: run `pairreg init`", field="key")
    key = audit.load_private_key(path)
    return key, log_verifier(key.public_key(), origin)


def log_verifier(public_key: Ed25519PublicKey, origin: str | None = None) -> signed_note.Verifier:
    """The log's checkpoint key: named by the origin, Ed25519 (0x01)."""
    raw = signed_note.raw_public(public_key)
    return signed_note.Verifier(log_origin(raw, origin), signed_note.ED25519, raw)


def _key_dir(key_path: str | None) -> Path:
    """Where the log's keys (and the copies kept outside the database) live: beside the
    signing key the operation's context names."""
    return key_file(key_path).parent


def published_verifier(
    key_path: str | None = None, origin: str | None = None
) -> signed_note.Verifier | None:
    """The log's verifier from the public key file written at ``pairreg init`` beside the
    signing key ``key_path`` (``audit-signing.pub``)."""
    path = key_file(key_path).with_suffix(".pub")
    if not path.exists():
        return None
    pub = serialization.load_pem_public_key(path.read_bytes())
    return log_verifier(pub, origin) if isinstance(pub, Ed25519PublicKey) else None


# --- the newest signed checkpoint, kept outside the database too -------------------------


def _outside_path(session: Session, key_dir: Path) -> Path:
    """Where the newest checkpoint signed over this database is kept, beside the log's key:
    one file per database (named by a digest of its URL, password hidden)."""
    url = session.get_bind().engine.url.render_as_string(hide_password=True)
    return key_dir / "log-checkpoints" / f"{hashlib.sha256(url.encode()).hexdigest()[:16]}.note"


def _keep_outside(session: Session, key_path: str | None, note: str) -> None:
    """Keep a copy of the checkpoint just signed outside the database (write, fsync, rename),
    so that someone who can rewrite the database, checkpoints table included, but not the
    key's directory, cannot make the log forget what it signed. A copy that cannot be
    written is logged, not fatal: the database row is the checkpoint of record."""
    path = _outside_path(session, _key_dir(key_path))
    # After the commit only: a checkpoint whose row was rolled back was never signed.
    event.listen(session, "after_commit", lambda _s: _write_note(path, note), once=True)


def _size_of(note: str) -> int:
    lines = note.split("\n")
    return int(lines[1]) if len(lines) > 1 and lines[1].isdigit() else -1


def _write_note(path: Path, note: str) -> None:
    """Keep ``note`` unless a larger checkpoint is already kept (several servers on one
    database sign in turn; their commits may reach this point out of order)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and _size_of(path.read_text(encoding="utf-8")) >= _size_of(note):
            return
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(note)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning("could not keep the signed checkpoint at %s: %s", path, exc)


@dataclass
class SignedCheck:
    """How the log compares with every checkpoint it signed."""

    ok: bool
    size: int | None
    detail: str


def check_signed_checkpoints(
    session: Session,
    report: audit_tree.TreeReport,
    verifier: signed_note.Verifier | None,
    key_path: str | None = None,
) -> SignedCheck:
    """Compare the recomputed log with every checkpoint the log signed: each stored row must
    carry the log's signature over its own size and root, no signed checkpoint may be
    larger than the log, and the log's root at each signed size must be the signed root.

    The first checkpoint the log no longer matches names the divergence: an event between
    the last size that still matches and that size was changed after it was signed, even if
    whoever changed it recomputed the tree (the signature over the old root cannot be
    recomputed without the key). The newest checkpoint is also read from its copy outside
    the database, so deleting checkpoint rows does not hide a rewrite."""
    rows = session.scalars(select(LogCheckpoint).order_by(LogCheckpoint.tree_size)).all()
    outside = _read_outside(session, key_path)
    if not rows and outside is None:
        return SignedCheck(True, None, "no checkpoint signed yet: nothing to compare with")
    if verifier is None:
        return SignedCheck(
            False, None, "no log public key here to check the signed checkpoints with"
        )
    signed: list[tuple[int, bytes, str]] = []
    for row in rows:
        try:
            cp, _ = signed_note.open_checkpoint(row.note, verifier)
        except signed_note.NoteError as exc:
            return SignedCheck(
                False, row.tree_size, f"stored checkpoint {row.tree_size} does not verify: {exc}"
            )
        if cp.size != row.tree_size or cp.root.hex() != row.root_hash:
            return SignedCheck(
                False,
                row.tree_size,
                f"stored checkpoint {row.tree_size} differs from the note its signature covers",
            )
        signed.append((cp.size, cp.root, "stored"))
    if outside is not None:
        try:
            cp, _ = signed_note.open_checkpoint(outside, verifier)
        except signed_note.NoteError as exc:
            return SignedCheck(False, None, f"the checkpoint kept outside the database: {exc}")
        newest = signed[-1][0] if signed else 0
        if cp.size > newest:
            return _compare(
                session,
                report,
                [*signed, (cp.size, cp.root, "kept outside the database")],
                missing=f"the newest checkpoint signed (size {cp.size}, kept outside the "
                f"database) is missing from the database (newest there: {newest}): "
                "checkpoints were removed",
            )
        signed.append((cp.size, cp.root, "kept outside the database"))
    return _compare(session, report, signed)


def _compare(
    session: Session,
    report: audit_tree.TreeReport,
    signed: list[tuple[int, bytes, str]],
    *,
    missing: str | None = None,
) -> SignedCheck:
    good = 0
    for size, root, where in sorted(signed, key=lambda s: s[0]):
        if size > report.size:
            return SignedCheck(
                False,
                size,
                f"a checkpoint of {size} events was signed ({where}) but the log has only "
                f"{report.size}: events were removed",
            )
        if audit_tree.root(session, size) != root:
            span = f"event {size}" if size == good + 1 else f"one of events {good + 1}..{size}"
            return SignedCheck(
                False,
                size,
                f"the log diverges from its signed checkpoint at size {size} ({where}): "
                f"{span} was changed after it was signed (the log up to {good} matches)",
            )
        good = size
    if missing is not None:
        return SignedCheck(False, signed[-1][0], missing)
    return SignedCheck(
        True, good, f"the log ({report.size} events) extends its newest signed checkpoint ({good})"
    )


def _outside_checkpoint(
    session: Session, key_path: str | None, verifier: signed_note.Verifier
) -> signed_note.Checkpoint | None:
    """The checkpoint kept outside the database beside ``key_path``, if it verifies."""
    note = _read_outside(session, key_path)
    if note is None:
        return None
    try:
        return signed_note.open_checkpoint(note, verifier)[0]
    except signed_note.NoteError as exc:
        raise Conflict(
            f"the checkpoint kept outside the database does not verify: {exc}", field="audit"
        ) from exc


def _read_outside(session: Session, key_path: str | None = None) -> str | None:
    path = _outside_path(session, _key_dir(key_path))
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.warning("could not read the signed checkpoint kept at %s: %s", path, exc)
        return None


def _record(row: LogCheckpoint, verifier: str, *, created: bool) -> LogCheckpointRecord:
    return LogCheckpointRecord(
        origin=row.origin,
        tree_size=row.tree_size,
        root_hash=row.root_hash,
        note=row.note,
        verifier_key=verifier,
        signed_by=row.signed_by,
        signed_at=row.signed_at,
        created=created,
    )


def _check_new_leaves(session: Session, after: int, size: int) -> None:
    """Every leaf stored since the last checkpoint is the hash of its event."""
    stored = audit_tree.stream_level(session, 0, start=after)
    recomputed = audit_tree.leaves_from_events(session, after=after)
    for index in range(after, size):
        got, leaf = next(stored, None), next(recomputed, None)
        if leaf is None or got != (index, leaf):
            raise Conflict(
                f"the audit event at leaf {index} does not match its stored leaf: the log was "
                "altered; refusing to sign a checkpoint over it",
                field="audit",
            )


def sign_log_checkpoint(
    session: Session, *, key_path: str | None = None, origin: str | None = None, actor: str
) -> LogCheckpointRecord:
    """Sign a C2SP checkpoint of the whole log as it stands, after proving it extends the
    newest checkpoint signed before. Signing the same size again returns that checkpoint.

    ``key_path`` and ``origin`` come from the operation's context (the serving process's
    own key and configured origin), never from the caller."""
    key, verifier = _log_key(key_path, origin)
    audit.integrate(session)  # the sequencer first: sign every event committed by now
    audit.lock_checkpoints(session)
    size = audit_tree.tree_size(session)
    root = audit_tree.root(session, size)
    last = session.scalar(select(LogCheckpoint).order_by(LogCheckpoint.tree_size.desc()).limit(1))
    outside = _outside_checkpoint(session, key_path, verifier)
    if outside is not None and outside.size > (last.tree_size if last else 0):
        # The database forgot a checkpoint it signed (rows deleted): sign only what extends
        # the copy kept outside it, as a witness would insist.
        if outside.size > size:
            raise Conflict(
                f"the log has {size} events but checkpoint {outside.size} was signed (kept "
                "outside the database): events were removed; refusing to sign",
                field="audit",
            )
        proof = audit_tree.consistency_proof(session, outside.size, size)
        if not merkle.verify_consistency(outside.size, size, outside.root, root, proof.path):
            raise Conflict(
                f"the log does not extend its checkpoint at size {outside.size} (kept outside "
                "the database): history was rewritten; refusing to sign",
                field="audit",
            )
    if last is not None:
        if last.tree_size > size:
            raise Conflict(
                f"the log has {size} events but checkpoint {last.tree_size} was signed: "
                "events were removed; refusing to sign",
                field="audit",
            )
        if last.tree_size == size:
            if last.root_hash != root.hex():
                raise Conflict(
                    f"the tree of {size} events no longer has the root signed before: "
                    "refusing to sign a second history",
                    field="audit",
                )
            return _record(last, verifier.vkey, created=False)
        proof = audit_tree.consistency_proof(session, last.tree_size, size)
        if not merkle.verify_consistency(
            last.tree_size, size, bytes.fromhex(last.root_hash), root, proof.path
        ):
            raise Conflict(
                f"the log does not extend its checkpoint at size {last.tree_size}: "
                "history was rewritten; refusing to sign",
                field="audit",
            )
    _check_new_leaves(session, last.tree_size if last else 0, size)
    text = signed_note.Checkpoint(verifier.name, size, root).text
    note = signed_note.Note(text, [signed_note.sign(text, verifier.name, key)]).render()
    row = LogCheckpoint(
        tree_size=size,
        root_hash=root.hex(),
        origin=verifier.name,
        key_id=verifier.key_id.hex(),
        note=note,
        signed_by=actor,
        signed_at=utcnow(),
    )
    session.add(row)
    session.flush()
    _keep_outside(session, key_path, note)
    return _record(row, verifier.vkey, created=True)


def get_log_checkpoint(
    session: Session,
    *,
    tree_size: Annotated[int | None, Field(ge=0)] = None,
    key_path: str | None = None,
    origin: str | None = None,
) -> LogCheckpointRecord:
    """The newest signed checkpoint (or the one at ``tree_size``), as a witness fetches it."""
    stmt = select(LogCheckpoint)
    if tree_size is not None:
        stmt = stmt.where(LogCheckpoint.tree_size == tree_size)
    row = session.scalar(stmt.order_by(LogCheckpoint.tree_size.desc()).limit(1))
    if row is None:
        what = f"at size {tree_size}" if tree_size is not None else "yet"
        raise NotFound(f"no checkpoint signed {what}", field="tree_size")
    verifier = published_verifier(key_path, origin)
    return _record(row, verifier.vkey if verifier else "", created=False)


def verify_audit_log(
    session: Session,
    *,
    checkpoint: str | None = None,
    witness_keys: list[str] | None = None,
    incremental: bool = False,
    key_path: str | None = None,
    origin: str | None = None,
) -> TreeVerifyResult:
    """Recompute the log's tree from the events and compare it with every checkpoint the
    log signed (fails on any divergence, naming where); with a checkpoint note (e.g. one a
    witness co-signed), also check its signature with this log's key, each of
    ``witness_keys``' cosignatures on it, and that the log extends it.

    ``incremental``: recompute only the events after the checkpoint the last successful
    run verified (kept beside the log's key, signature re-checked), after checking that the
    stored tree still has that checkpoint's root; every signed checkpoint is compared either
    way. An edit to an older event's row that leaves the tree alone is found only by a full
    run (or by that event's inclusion proof failing)."""
    verifier = published_verifier(key_path, origin)
    marker = _verified_marker(session, verifier, key_path) if incremental else None
    after = marker.size if marker is not None else 0
    audit.integrate(session)
    report = audit_tree.verify_tree(session, after=after)
    if report.ok and marker is not None and audit_tree.root(session, marker.size) != marker.root:
        report = audit_tree.TreeReport(
            False,
            report.size,
            b"",
            None,
            f"the stored tree no longer has the root of the checkpoint verified last "
            f"(size {marker.size}): run a full verification",
        )
    result = TreeVerifyResult(
        ok=report.ok,
        tree_size=report.size,
        root_hash=report.root.hex() if report.ok else None,
        first_bad_seq=report.first_bad_seq,
        reason=report.reason,
        verified_from=after,
    )
    if report.ok:
        signed = check_signed_checkpoints(session, report, verifier, key_path)
        result.signed_size, result.signed_ok = signed.size, signed.ok
        result.signed_detail = signed.detail
        result.ok = signed.ok
        if signed.ok:
            _remember_verified(session, key_path)
    if checkpoint is None:
        if witness_keys:
            raise InvalidInput("witness keys need a checkpoint note", field="witness_keys")
        return result
    if verifier is None:
        raise InvalidInput("no audit public key here to check the checkpoint with", field="key")
    witnesses = []
    for vkey in witness_keys or []:
        try:
            witnesses.append(signed_note.Verifier.parse(vkey))
        except signed_note.NoteError as exc:
            raise InvalidInput(f"witness key {vkey!r}: {exc}", field="witness_keys") from exc
    try:
        cp, note = signed_note.open_checkpoint(checkpoint, verifier)
    except signed_note.NoteError as exc:
        raise InvalidInput(f"checkpoint: {exc}", field="checkpoint") from exc
    result.checkpoint_size = cp.size
    unsigned = [w.name for w in witnesses if not _cosigned(note, w)]
    if unsigned:
        result.checkpoint_ok = False
        result.checkpoint_detail = f"no valid cosignature from witness {', '.join(unsigned)}"
    elif not report.ok:
        result.checkpoint_ok, result.checkpoint_detail = False, "the tree itself does not verify"
    elif cp.size > report.size:
        result.checkpoint_ok = False
        result.checkpoint_detail = (
            f"checkpoint covers {cp.size} events, the log has only {report.size}: truncated"
        )
    else:
        proof = audit_tree.consistency_proof(session, cp.size, report.size)
        ok = merkle.verify_consistency(cp.size, report.size, cp.root, report.root, proof.path)
        result.checkpoint_ok = ok
        cosigned = f", co-signed by {len(witnesses)} witness(es)" if witnesses else ""
        result.checkpoint_detail = (
            f"the log ({report.size} events) extends the checkpoint at size {cp.size}{cosigned}"
            if ok
            else f"the log does not extend the checkpoint at size {cp.size}: history differs"
        )
    result.ok = result.ok and bool(result.checkpoint_ok)
    return result


def _marker_path(session: Session, key_path: str | None) -> Path:
    return _outside_path(session, _key_dir(key_path)).with_suffix(".verified")


def _verified_marker(
    session: Session, verifier: signed_note.Verifier | None, key_path: str | None
) -> signed_note.Checkpoint | None:
    """The checkpoint the last successful verification reached, if its note still verifies
    with the log's key (a marker nobody can forge without the key)."""
    path = _marker_path(session, key_path)
    if verifier is None or not path.exists():
        return None
    try:
        return signed_note.open_checkpoint(path.read_text(encoding="utf-8"), verifier)[0]
    except (OSError, signed_note.NoteError) as exc:
        logger.warning("ignoring the verification marker %s: %s", path, exc)
        return None


def _remember_verified(session: Session, key_path: str | None) -> None:
    """After a successful run, the newest signed checkpoint is where the next incremental
    run starts (a signed size, so the marker carries its own proof)."""
    newest = session.scalar(select(LogCheckpoint).order_by(LogCheckpoint.tree_size.desc()))
    if newest is not None:
        _write_note(_marker_path(session, key_path), newest.note)


def _cosigned(note: signed_note.Note, witness: signed_note.Verifier) -> bool:
    try:
        return witness.name in signed_note.verify(note, [witness])
    except signed_note.NoteError:
        return False
