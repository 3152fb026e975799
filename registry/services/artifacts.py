"""Registering, reading and verifying artifacts.

Hashing happens before the first database statement, so the write transaction (and the
registry's write lock) is held only for the few rows it inserts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.artifacts import hub, model_facts, tokenizer_compat
from registry.artifacts.manifest import (
    Manifest,
    ManifestError,
    build_manifest,
    compare_manifests,
    hub_snapshot_root,
)
from registry.artifacts.source_paths import PathLimits, local_directory, local_file, resolve_literal
from registry.artifacts.tokenizer_digest import (
    TokenizerDigestError,
    tokenizer_files_digest,
    vocab_digest,
)
from registry.economics import facts as economic_facts
from registry.errors import Conflict, InvalidInput, NotFound, PairregError
from registry.params import Cursor, Limit
from registry.records.core import (
    PROVENANCE_FIELDS,
    ArtifactAddResult,
    ArtifactRecord,
    Page,
    Provenance,
    Role,
    SignatureIn,
    VerifyReport,
    from_row,
)
from registry.refs import resolve_artifact
from registry.services.base import page_query
from registry.tables import Artifact, Lineage
from registry.trust import model_signature
from registry.trust.audit import append_event, lock_writes

ROLES = ("target", "draft", "heads")


@dataclass
class _Content:
    """What hashing a source produced, before anything is written."""

    source: str
    source_kind: str
    manifest: Manifest
    local_path: str | None
    hub_repo: str | None = None
    hub_revision: str | None = None
    hub_commit: str | None = None
    content_dir: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _hash_source(
    source: str, workers: int | None, confine: PathLimits | None, access: hub.HubAccess
) -> _Content:
    if source.startswith("hf://"):
        try:
            resolved = hub.resolve(source, workers=workers, access=access)
        except hub.HubError as exc:
            raise _hub_error(exc) from exc
        manifest = Manifest.from_entries(resolved.entries)
        snapshot = Path(resolved.snapshot_dir) if resolved.snapshot_dir else None
        return _Content(
            source=resolved.uri,
            source_kind="hf",
            manifest=manifest,
            # Only a complete snapshot can stand in for the artifact's files when verifying.
            local_path=str(snapshot) if snapshot and resolved.complete_snapshot else None,
            hub_repo=resolved.repo_id,
            hub_revision=resolved.requested_revision,
            hub_commit=resolved.commit,
            content_dir=snapshot,
            extra={"offline": resolved.offline, "complete": resolved.complete_snapshot},
        )
    if "://" in source or source.startswith("models:/"):
        raise InvalidInput(
            f"source {source!r}: only local directories and hf://org/repo[@revision] are supported",
            field="source",
        )
    path = local_directory(source, field="source", limits=confine)
    try:
        manifest = build_manifest(path, workers, **_limits(confine))
    except ManifestError as exc:
        raise InvalidInput(f"source: {exc}", field="source") from exc
    if manifest.file_count == 0:
        raise InvalidInput(f"source path {source} contains no files", field="source")
    return _Content(str(path), "local", manifest, str(path), content_dir=path)


def _limits(confine: PathLimits | None) -> dict[str, int]:
    """``build_manifest``'s size limits for a confined (remote) caller; none for the local user."""
    if confine is None:
        return {}
    return {"max_files": confine.max_files, "max_bytes": confine.max_bytes}


class HubUnavailable(PairregError):
    """The Hub could not be asked (network, DNS, server error).

    Its own ``kind`` so clients can tell it from bad input and retry; the status stays in the
    documented 4xx set of ``POST /v1/artifacts`` (the API promises no 5xx for a request).
    """

    kind = "hub_unavailable"
    status = 422
    title = "Hub unreachable"


def _hub_error(exc: hub.HubError) -> PairregError:
    """Map each Hub failure to the error an API client can act on.

    Unknown repository, revision or file → 404; offline without the revision cached → 404
    (it is not available here); local bytes disagreeing with the Hub → 409 naming the paths;
    the Hub unreachable → 422 of kind ``hub_unavailable``; a malformed ``hf://`` reference or
    anything else → 422.
    """
    message = f"source: {exc}"
    if isinstance(exc, hub.RepoNotFound | hub.RevisionNotFound | hub.EntryNotFound):
        return NotFound(message, field="source")
    if isinstance(exc, hub.NotInCache):
        return NotFound(message, field="source")
    if isinstance(exc, hub.HubIntegrityError):
        return Conflict(message, field="source", details={"paths": exc.paths})
    if isinstance(exc, hub.HubUnreachable):
        return HubUnavailable(message, field="source")
    return InvalidInput(message, field="source")


def _describe(content: _Content) -> dict[str, Any]:
    """Tokenizer digests and architecture facts, read from the hashed files."""
    out: dict[str, Any] = {
        "tokenizer_digest": None,
        "vocab_digest": None,
        "vocab_size": None,
        "facts": {},
    }
    if content.content_dir is None:
        return out
    try:
        out["tokenizer_digest"] = tokenizer_files_digest(content.content_dir)
        vocab = vocab_digest(content.content_dir)
    except (TokenizerDigestError, ManifestError) as exc:
        raise InvalidInput(f"source: {exc}", field="source") from exc
    if vocab is not None:
        out["vocab_digest"] = vocab.digest
        out["vocab_size"] = vocab.vocab_size
    try:
        facts = model_facts.read_model_facts(content.content_dir)
    except model_facts.ModelFactsError as exc:
        raise InvalidInput(f"source: {exc}", field="source") from exc
    out["facts"] = facts.to_dict()
    try:  # parameters, weight bytes, KV bytes per token: headers and config only
        out["facts"]["economics"] = economic_facts.read_facts(content.content_dir).to_dict()
    except (economic_facts.FactsError, OSError) as exc:
        out["facts"]["economics_error"] = str(exc)
    if vocab is not None:
        # token→id blocks, special tokens and chat template: what pair checks compare
        out["facts"]["tokenizer"] = tokenizer_compat.profile(content.content_dir)
    return out


def _normalise_provenance(session: Session, provenance: Provenance) -> Provenance:
    """Resolve ``trained_against`` to a manifest digest when it names a registered artifact."""
    ref = provenance.trained_against
    if not ref:
        return provenance
    value = ref.strip().lower()
    if len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return provenance.model_copy(update={"trained_against": value})
    art = resolve_artifact(session, ref, field="trained_against")
    return provenance.model_copy(update={"trained_against": art.manifest_digest})


def missing_provenance(provenance: dict[str, Any]) -> list[str]:
    return [name for name in PROVENANCE_FIELDS if not provenance.get(name)]


def to_record(art: Artifact, *, with_manifest: bool = False) -> ArtifactRecord:
    return from_row(
        ArtifactRecord,
        art,
        ref=f"{art.lineage}@v{art.version}",
        provenance_missing=missing_provenance(art.provenance),
        manifest=art.manifest if with_manifest else None,
        signature_bundle=art.signature_bundle if with_manifest else None,
    )


def _check_name(name: str) -> str:
    name = name.strip()
    if not name or "@" in name or any(c.isspace() for c in name) or len(name) > 200:
        raise InvalidInput(
            f"name {name!r} must be 1-200 characters with no spaces or '@'", field="name"
        )
    return name


def add_artifact(
    session: Session,
    *,
    source: Annotated[
        str, Field(min_length=1, description="Server-local directory or hf://org/repo[@rev].")
    ],
    name: Annotated[str, Field(min_length=1, max_length=200, description="Lineage name.")],
    role: Role,
    provenance: Provenance | None = None,
    actor: str,
    hash_workers: int | None = None,
    signature: SignatureIn | None = None,
    policy: str | None = None,
    confine: PathLimits | None = None,
    hub_access: hub.HubAccess | None = None,
) -> ArtifactAddResult:
    """Register a directory or Hub revision; identical content returns the existing record.

    With ``signature``, an OpenSSF model signature over the files is verified first and
    recorded (refused: a digest that does not match, an unsigned extra file, a bad key or
    chain). With ``policy``, that policy's signature rules apply here already. A local
    ``source`` is taken literally (no ``~``); ``confine`` (filled by the edge for a remote
    caller) keeps it, and the signature file, under the server's artifact roots.
    ``hub_access`` (filled by the edge) picks the token an ``hf://`` source is read with and
    caps what it may fetch; without it, no token and no cap. ``hash_workers`` (filled by
    the edge from its settings) is how many threads hash files; None: one per core.
    """
    name = _check_name(name)
    if role not in ROLES:
        raise InvalidInput(f"role must be one of {', '.join(ROLES)}", field="role")
    content = _hash_source(source, hash_workers, confine, hub_access or hub.HubAccess())
    described = _describe(content)
    checked = _verify_signature(content, signature, confine) if signature is not None else None

    lock_writes(session)
    if policy is not None:
        _enforce_signature_policy(session, policy, checked)
    provenance = _normalise_provenance(session, provenance or Provenance())
    lineage = session.get(Lineage, name)
    if lineage is not None and lineage.role != role:
        raise Conflict(
            f"lineage {name} holds {lineage.role} artifacts; cannot add a {role}", field="role"
        )
    if content.extra.get("offline") and not content.extra.get("complete"):
        return ArtifactAddResult(
            artifact=to_record(_offline_partial(session, name, content)), created=False
        )
    existing = session.scalar(
        select(Artifact).where(
            Artifact.lineage == name, Artifact.manifest_digest == content.manifest.digest
        )
    )
    if existing is not None:
        if checked is not None and existing.signature is None:
            _attach_signature(session, existing, checked, actor)
        return ArtifactAddResult(artifact=to_record(existing), created=False)

    if lineage is None:
        session.add(Lineage(name=name, role=role))
        session.flush()
    previous = session.scalar(
        select(Artifact).where(Artifact.lineage == name).order_by(Artifact.version.desc()).limit(1)
    )
    version = 1 if previous is None else previous.version + 1
    art = Artifact(
        lineage=name,
        version=version,
        role=role,
        source=content.source,
        source_kind=content.source_kind,
        hub_repo=content.hub_repo,
        hub_revision=content.hub_revision,
        hub_commit=content.hub_commit,
        local_path=content.local_path,
        manifest=content.manifest.entries,
        manifest_digest=content.manifest.digest,
        signing_root=content.manifest.signing_root,
        total_size=content.manifest.total_size,
        file_count=content.manifest.file_count,
        tokenizer_digest=described["tokenizer_digest"],
        vocab_digest=described["vocab_digest"],
        vocab_size=described["vocab_size"],
        facts=described["facts"],
        provenance=provenance.model_dump(),
        signature=checked.to_record() if checked else None,
        signature_bundle=checked.bundle if checked else None,
        registered_by=actor,
    )
    session.add(art)
    session.flush()
    payload: dict[str, Any] = {
        "lineage": name,
        "version": version,
        "role": role,
        "source": art.source,
        "manifest_digest": art.manifest_digest,
    }
    if checked is not None:
        payload["signature"] = _signature_event(checked)
    append_event(
        session,
        actor=actor,
        action="artifact.added",
        entity_type="artifact",
        entity_id=art.id,
        payload=payload,
    )
    target_changed = previous is not None and role == "target"
    if target_changed:
        assert previous is not None
        append_event(
            session,
            actor=actor,
            action="target.changed",
            entity_type="lineage",
            entity_id=name,
            payload={
                "previous_artifact_id": previous.id,
                "previous_manifest_digest": previous.manifest_digest,
                "artifact_id": art.id,
                "manifest_digest": art.manifest_digest,
            },
        )
        for listener in TARGET_CHANGE_LISTENERS:
            listener(session, previous, art, actor)
    return ArtifactAddResult(
        artifact=to_record(art, with_manifest=True), created=True, target_changed=target_changed
    )


# Governance subscribes here (re-measure candidate pairs) without this module importing it.
TARGET_CHANGE_LISTENERS: list[Any] = []


def _verify_signature(
    content: _Content, signature: SignatureIn, confine: PathLimits | None
) -> model_signature.SignatureCheck:
    """Check the signature against the hashed files before anything is written."""
    if content.content_dir is None:
        raise InvalidInput(
            "signature: the artifact's files are not available here to check it against",
            field="signature",
        )
    if signature.path:
        sig_path = local_file(signature.path, field="signature", limits=confine)
    else:
        sig_path = content.content_dir / model_signature.DEFAULT_NAME
        if not sig_path.is_file():
            raise InvalidInput(f"signature: no signature file at {sig_path}", field="signature")
    try:
        return model_signature.verify(
            content.content_dir,
            sig_path,
            public_key=signature.public_key,
            certificate_chain=signature.certificate_chain,
            manifest=content.manifest.entries,
        )
    except model_signature.SignatureError as exc:
        raise InvalidInput(f"signature refused: {exc}", field="signature") from exc


def _enforce_signature_policy(
    session: Session, policy: str, checked: model_signature.SignatureCheck | None
) -> None:
    from registry.services.policies import load_policy  # policies is imported by validation

    prov = load_policy(session, policy).parsed["provenance"]
    why = model_signature.signer_refusal(
        checked.to_record() if checked else None,
        require=prov["require_signature"],
        allowed=prov["allowed_signers"],
        trusted_roots=prov["trusted_roots"],
    )
    if why is not None:
        raise InvalidInput(f"signature refused by policy {policy}: {why}", field="signature")


def _signature_event(checked: model_signature.SignatureCheck) -> dict[str, Any]:
    return {
        "kind": checked.kind,
        "signer": checked.signer,
        "key_fingerprint": checked.key_fingerprint,
        "subject_digest": checked.subject_digest,
        "bundle_sha256": hashlib.sha256(checked.bundle.encode()).hexdigest(),
    }


def _attach_signature(
    session: Session, art: Artifact, checked: model_signature.SignatureCheck, actor: str
) -> None:
    """A signature arriving for content registered unsigned: recorded once, audited."""
    art.signature = checked.to_record()
    art.signature_bundle = checked.bundle
    session.flush()
    append_event(
        session,
        actor=actor,
        action="artifact.signature_added",
        entity_type="artifact",
        entity_id=art.id,
        payload={"manifest_digest": art.manifest_digest, "signature": _signature_event(checked)},
    )


def _offline_partial(session: Session, name: str, content: _Content) -> Artifact:
    """Offline, from a cache that may lack some files (weights never downloaded).

    Hashing only what is cached would record a *different*, incomplete manifest and so a
    spurious new version. The commit pins the content, so the record registered online for
    the same commit stands in, after checking every cached file against it; without one the
    source cannot be registered offline.
    """
    art = session.scalar(
        select(Artifact).where(
            Artifact.lineage == name,
            Artifact.hub_repo == content.hub_repo,
            Artifact.hub_commit == content.hub_commit,
        )
    )
    if art is None:
        raise NotFound(
            f"source: offline, and the cached snapshot of {content.hub_repo}@{content.hub_commit} "
            "may be incomplete (no tree listing): download it in full (`hf download "
            f"{content.hub_repo} --revision {content.hub_commit}`) or register it online first",
            field="source",
        )
    recorded = {e["path"]: e for e in art.manifest}
    bad = sorted(
        e["path"]
        for e in content.manifest.entries
        if (recorded.get(e["path"]) or {}).get("sha256") != e["sha256"]
    )
    if bad:
        raise Conflict(
            f"source: cached files of {content.hub_repo}@{content.hub_commit} differ from "
            f"{art.lineage}@v{art.version}'s manifest: {', '.join(bad)}",
            field="source",
            details={"paths": bad},
        )
    return art


def get_artifact(session: Session, *, ref: str) -> ArtifactRecord:
    return to_record(resolve_artifact(session, ref), with_manifest=True)


def list_artifacts(
    session: Session,
    *,
    lineage: str | None = None,
    role: Role | None = None,
    cursor: Cursor = None,
    limit: Limit = 100,
) -> Page[ArtifactRecord]:
    stmt = select(Artifact)
    if lineage:
        stmt = stmt.where(Artifact.lineage == lineage)
    if role:
        if role not in ROLES:
            raise InvalidInput(f"role must be one of {', '.join(ROLES)}", field="role")
        stmt = stmt.where(Artifact.role == role)
    rows, next_cursor = page_query(session, stmt, Artifact.id, cursor, limit)
    return Page[ArtifactRecord](items=[to_record(a) for a in rows], next_cursor=next_cursor)


def verify_artifact(
    session: Session,
    *,
    ref: str,
    path: Annotated[
        str | None, Field(description="Directory to check; default its source.")
    ] = None,
    actor: str = "system",
    confine: PathLimits | None = None,
    hash_workers: int | None = None,
) -> VerifyReport:
    """Re-hash the artifact's files (its local path, or ``path``) against the manifest.

    A ``path`` the caller names is taken literally and, for a remote caller (``confine``,
    filled by the edge), must lie under the server's artifact roots; the artifact's own
    recorded path is the registry's, not the caller's, and is not confined.
    ``hash_workers`` (filled by the edge) as for :func:`add_artifact`.
    """
    art = resolve_artifact(session, ref)
    where = path or art.local_path
    if not where:
        raise InvalidInput(
            f"artifact {art.lineage}@v{art.version} has no local copy: pass --path", field="path"
        )
    named = confine if path else None
    directory = resolve_literal(where, field="path", limits=named)
    if not directory.is_dir():
        raise InvalidInput(f"path {where} is not a directory", field="path")
    symlink_root: Path | None = hub_snapshot_root(directory)
    if named is not None and symlink_root is not None:
        symlink_root = named.symlink_root(symlink_root)
    try:
        actual = build_manifest(
            directory,
            hash_workers,
            symlink_root=symlink_root,
            **_limits(named),
        )
    except ManifestError as exc:
        raise InvalidInput(f"path: {exc}", field="path") from exc
    diff = compare_manifests(art.manifest, actual)
    report = VerifyReport(
        artifact_id=art.id,
        manifest_digest=art.manifest_digest,
        path=str(directory),
        ok=diff.ok,
        changed=list(diff.changed),
        missing=list(diff.missing),
        added=list(diff.added),
    )
    report_verification(session, art, report, actor)
    return report


def report_verification(session: Session, art: Artifact, report: VerifyReport, actor: str) -> None:
    """Tell subscribers (governance opens integrity flags) what a re-hash found, whether the
    server re-hashed (``verify_artifact``) or a worker did before loading the files."""
    for listener in VERIFY_LISTENERS:
        listener(session, art, report, actor)


# Governance subscribes here (integrity flags) without this module importing it.
VERIFY_LISTENERS: list[Any] = []
