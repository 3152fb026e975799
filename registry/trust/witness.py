"""A witness for the audit log: co-sign a checkpoint only if it extends the last one seen.

The witness is a separate party with its own Ed25519 key and its own state file; it never
reads the registry's database. Given a new checkpoint from the log it

1. verifies the log's signature with the log's verifier key it was configured with;
2. loads the last checkpoint it co-signed for that origin (the state file);
3. if the new tree is larger, asks the log for a consistency proof from the old size and
   verifies it (RFC 9162 §2.1.4.2) against both roots; at the same size the roots must be
   equal; a smaller tree is refused;
4. only then saves the new checkpoint as its state (write, fsync, rename) and appends its
   cosignature line (c2sp.org/tlog-cosignature, Ed25519 ``cosignature/v1``).

Two checkpoints for the same origin that no consistency proof can join — a rewritten event,
a forked history — raise :class:`ForkDetected`, naming both roots, and the evidence (both
signed notes) is written beside the state file. The state is not advanced.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry.errors import Conflict, InvalidInput
from registry.trust import merkle, signed_note

ProveConsistency = Callable[[int, int], list[bytes]]
STATE_FORMAT = "pairreg.witness-state/1"


class ForkDetected(Conflict):
    """The log showed two histories: a checkpoint that does not extend the last one seen."""

    title = "Fork detected"


def ensure_key(path: Path) -> Ed25519PrivateKey:
    """The witness's Ed25519 key (PEM, mode 0600), created on first use."""
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise InvalidInput(f"{path} is not an Ed25519 private key", field="witness_key")
        return key
    key = Ed25519PrivateKey.generate()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return key


@dataclass
class CosignResult:
    note: str  # the checkpoint with the witness's cosignature appended
    origin: str
    old_size: int
    new_size: int
    timestamp: int
    detail: str


class Witness:
    def __init__(self, *, name: str, key_path: Path, state_path: Path, log_key: str):
        try:
            self.name = signed_note.check_name(name)
            self.log = signed_note.Verifier.parse(log_key)
        except signed_note.NoteError as exc:
            raise InvalidInput(str(exc), field="log_key") from exc
        if self.log.sig_type != signed_note.ED25519:
            raise InvalidInput("the log key must be an Ed25519 (0x01) key", field="log_key")
        self.key = ensure_key(key_path)
        self.state_path = state_path

    @property
    def verifier(self) -> signed_note.Verifier:
        """This witness's key as clients configure it (type 0x04)."""
        return signed_note.Verifier.of(self.name, self.key.public_key(), signed_note.COSIGNATURE_V1)

    def last_seen(self) -> tuple[signed_note.Checkpoint, str] | None:
        if not self.state_path.exists():
            return None
        try:
            state = json.loads(self.state_path.read_text())
            if state.get("format") != STATE_FORMAT:
                raise ValueError(f"not a {STATE_FORMAT} file")
            cp, _ = signed_note.open_checkpoint(state["note"], self.log)
        except (ValueError, KeyError, signed_note.NoteError) as exc:
            raise InvalidInput(
                f"witness state {self.state_path} is unreadable: {exc}", field="state"
            ) from exc
        return cp, state["note"]

    def _save(self, cp: signed_note.Checkpoint, note: str) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        data = {
            "format": STATE_FORMAT,
            "origin": cp.origin,
            "tree_size": cp.size,
            "root_hash": cp.root.hex(),
            "note": note,
        }
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.state_path)

    def _fork(self, seen: str, new: str, why: str) -> ForkDetected:
        evidence = self.state_path.with_name(
            f"{self.state_path.name}.fork-{time.strftime('%Y%m%dT%H%M%S')}.txt"
        )
        evidence.write_text(
            f"FORK: {why}\n\n# last checkpoint co-signed\n{seen}\n# checkpoint refused\n{new}"
        )
        return ForkDetected(
            f"FORK DETECTED for log {self.log.name}: {why}. Refusing to co-sign; both signed "
            f"checkpoints are kept as evidence in {evidence}",
            field="checkpoint",
            details={"evidence": str(evidence)},
        )

    def cosign(
        self, note_text: str, prove: ProveConsistency, *, now: int | None = None
    ) -> CosignResult:
        """Verify ``note_text`` against the last checkpoint seen and co-sign it."""
        try:
            cp, note = signed_note.open_checkpoint(note_text, self.log)
        except signed_note.NoteError as exc:
            raise InvalidInput(f"checkpoint refused: {exc}", field="checkpoint") from exc
        seen = self.last_seen()
        old_size = 0
        if seen is not None:
            old, old_note = seen
            old_size = old.size
            if cp.size < old.size:
                raise Conflict(
                    f"checkpoint of {cp.size} events is older than the {old.size} already "
                    "co-signed: refusing to go back",
                    field="checkpoint",
                )
            if cp.size == old.size and cp.root != old.root:
                raise self._fork(
                    old_note,
                    note_text,
                    f"two checkpoints of size {cp.size} with different roots "
                    f"{old.root.hex()[:16]}… and {cp.root.hex()[:16]}…",
                )
            if cp.size > old.size:
                proof = prove(old.size, cp.size)
                if not merkle.verify_consistency(old.size, cp.size, old.root, cp.root, proof):
                    raise self._fork(
                        old_note,
                        note_text,
                        f"the tree of {cp.size} events does not extend the {old.size} "
                        "co-signed before (consistency proof fails)",
                    )
        stamp = int(time.time()) if now is None else now
        # Drop an earlier cosignature of ours (re-cosigning the same checkpoint), keep others.
        mine = self.verifier
        note.signatures = [
            s for s in note.signatures if (s.name, s.key_id) != (mine.name, mine.key_id)
        ]
        note.signatures.append(signed_note.cosign(note.text, self.name, self.key, stamp))
        self._save(cp, note.render())
        detail = f"co-signed {cp.origin} at size {cp.size}" + (
            f" (consistent with {old_size})" if seen is not None else " (first checkpoint)"
        )
        return CosignResult(note.render(), cp.origin, old_size, cp.size, stamp, detail)
