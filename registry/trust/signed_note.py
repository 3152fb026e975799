"""C2SP signed notes and transparency-log checkpoints (c2sp.org/signed-note,
c2sp.org/tlog-checkpoint, c2sp.org/tlog-cosignature), with Ed25519 keys.

A checkpoint is the note text::

    <origin>\\n
    <tree size, decimal>\\n
    <base64 RFC 6962 root hash>\\n

then a blank line and one signature line per signer: ``— <key name> <base64(key ID ||
signature)>``. The log signs the note text with Ed25519 (signature type 0x01, key ID
``SHA-256(name || 0x0A || 0x01 || public key)[:4]``). A witness appends a timestamped
cosignature (type 0x04): it signs ``"cosignature/v1\\ntime <T>\\n" || note text`` and its
line carries ``key ID || u64 big-endian T || signature``. Verifier keys are written
``<name>+<8 hex key ID>+<base64(type || public key)>``. Verifiers ignore signatures from
keys they were not given, which is what lets witnesses add theirs.

Stdlib and ``cryptography`` only: this is what an auditor re-implements.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ED25519 = 0x01
COSIGNATURE_V1 = 0x04
DASH = "\u2014"
_RAW = (serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class NoteError(ValueError):
    """A malformed note, checkpoint or key, or a signature that does not verify."""


def raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(*_RAW)


def check_name(name: str) -> str:
    if not name or any(c.isspace() for c in name) or "+" in name:
        raise NoteError(f"key name {name!r} must be non-empty, without spaces or '+'")
    return name


def key_id(name: str, sig_type: int, public: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + bytes([sig_type]) + public).digest()[:4]


@dataclass(frozen=True)
class Verifier:
    """A trusted key: name, signature type and raw Ed25519 public key."""

    name: str
    sig_type: int
    public: bytes

    @property
    def key_id(self) -> bytes:
        return key_id(self.name, self.sig_type, self.public)

    @property
    def vkey(self) -> str:
        data = base64.b64encode(bytes([self.sig_type]) + self.public).decode()
        return f"{self.name}+{self.key_id.hex()}+{data}"

    @classmethod
    def of(cls, name: str, key: Ed25519PublicKey, sig_type: int = ED25519) -> Verifier:
        return cls(check_name(name), sig_type, raw_public(key))

    @classmethod
    def parse(cls, vkey: str) -> Verifier:
        """Read ``name+hexid+base64(type||key)`` and check that the ID matches the key."""
        try:
            # The base64 key may itself contain "+": split at the first two only.
            name, hex_id, data = vkey.strip().split("+", 2)
            raw = base64.b64decode(data, validate=True)
            claimed = bytes.fromhex(hex_id)
        except (ValueError, binascii.Error) as exc:
            raise NoteError(f"verifier key {vkey!r} is not name+keyid+base64") from exc
        if len(raw) != 33 or raw[0] not in (ED25519, COSIGNATURE_V1) or len(claimed) != 4:
            raise NoteError(f"verifier key {vkey!r}: not an Ed25519 (0x01 or 0x04) key")
        out = cls(check_name(name), raw[0], raw[1:])
        if out.key_id != claimed:
            raise NoteError(f"verifier key {vkey!r}: key ID does not match the key")
        return out


_PEM_BLOCK = re.compile(r"-----BEGIN PUBLIC KEY-----.+?-----END PUBLIC KEY-----", re.DOTALL)


def trusted_keys(text: str) -> set[bytes]:
    """The raw Ed25519 public keys a pinned key or trust file names.

    A trust file is text holding any number of PEM public keys and of verifier keys
    (``name+keyid+base64``, one a line); blank lines and ``#`` comments are ignored; a
    single PEM key (``--public-key``) is the one-key case. Anything else is refused: a trust
    file that silently trusted nothing would read as "unpinned" for the wrong reason."""
    keys: set[bytes] = set()
    for block in _PEM_BLOCK.findall(text):
        try:
            key = serialization.load_pem_public_key(block.encode())
        except ValueError as exc:
            raise NoteError(f"trusted key: not a PEM public key: {exc}") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise NoteError("trusted key: only Ed25519 keys are supported")
        keys.add(raw_public(key))
    for line in _PEM_BLOCK.sub("", text).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keys.add(Verifier.parse(line).public)
    if not keys:
        raise NoteError("the trusted key or trust file names no key")
    return keys


@dataclass
class Signature:
    name: str
    key_id: bytes
    blob: bytes  # everything after the key ID

    @property
    def line(self) -> str:
        return f"{DASH} {self.name} {base64.b64encode(self.key_id + self.blob).decode()}\n"


@dataclass
class Note:
    text: str  # the signed text, ending in a newline
    signatures: list[Signature] = field(default_factory=list)

    def render(self) -> str:
        return self.text + "\n" + "".join(s.line for s in self.signatures)


def parse_note(note: str) -> Note:
    """Split a signed note into its text and signature lines (c2sp.org/signed-note)."""
    if any(ord(c) < 0x20 and c != "\n" for c in note):
        raise NoteError("a note must not contain control characters other than newline")
    if not note.endswith("\n"):
        raise NoteError("a note must end with a newline")
    cut = note.rfind("\n\n")
    if cut < 0:
        raise NoteError("no blank line separates the note text from its signatures")
    text, sig_block = note[: cut + 1], note[cut + 2 :]
    sigs = []
    for line in sig_block.splitlines():
        prefix = DASH + " "
        parts = line[len(prefix) :].split(" ")
        if not line.startswith(prefix) or len(parts) != 2:
            raise NoteError(f"malformed signature line {line!r}")
        try:
            blob = base64.b64decode(parts[1], validate=True)
        except binascii.Error as exc:
            raise NoteError(f"signature line {line!r} is not base64") from exc
        if len(blob) < 5:
            raise NoteError(f"signature line {line!r} is too short")
        sigs.append(Signature(check_name(parts[0]), blob[:4], blob[4:]))
    if not sigs:
        raise NoteError("the note has no signature lines")
    return Note(text, sigs)


def sign(text: str, name: str, key: Ed25519PrivateKey) -> Signature:
    """An Ed25519 (type 0x01) note signature over ``text``."""
    kid = key_id(check_name(name), ED25519, raw_public(key.public_key()))
    return Signature(name, kid, key.sign(text.encode()))


def cosign(text: str, name: str, key: Ed25519PrivateKey, timestamp: int) -> Signature:
    """A timestamped witness cosignature (type 0x04, ``cosignature/v1``) over ``text``."""
    if not 0 <= timestamp < 2**63:
        raise NoteError("cosignature timestamp out of range")
    kid = key_id(check_name(name), COSIGNATURE_V1, raw_public(key.public_key()))
    message = f"cosignature/v1\ntime {timestamp}\n".encode() + text.encode()
    return Signature(name, kid, struct.pack(">Q", timestamp) + key.sign(message))


def _check(sig: Signature, verifier: Verifier, text: str) -> int | None:
    """Verify one signature; returns the cosignature's timestamp (None for type 0x01)."""
    pub = Ed25519PublicKey.from_public_bytes(verifier.public)
    if verifier.sig_type == ED25519:
        message, raw, stamp = text.encode(), sig.blob, None
    else:
        if len(sig.blob) != 72:
            raise NoteError(f"cosignature from {sig.name} has the wrong length")
        stamp = struct.unpack(">Q", sig.blob[:8])[0]
        message = f"cosignature/v1\ntime {stamp}\n".encode() + text.encode()
        raw = sig.blob[8:]
    try:
        pub.verify(raw, message)
    except InvalidSignature as exc:
        raise NoteError(f"signature from {sig.name} does not verify") from exc
    return stamp


def verify(note: Note, verifiers: list[Verifier]) -> dict[str, int | None]:
    """Names of the given keys whose signatures verify (with cosignature timestamps).

    Per the spec: signatures from keys not given are ignored; a known key's signature that
    fails rejects the whole note; a note with no verified known signature is rejected.
    """
    known = {(v.name, v.key_id): v for v in verifiers}
    verified: dict[str, int | None] = {}
    for sig in note.signatures:
        v = known.get((sig.name, sig.key_id))
        if v is not None:
            verified[v.name] = _check(sig, v, note.text)
    if not verified:
        raise NoteError("no signature from a trusted key")
    return verified


# --- checkpoints ------------------------------------------------------------------------


@dataclass
class Checkpoint:
    origin: str
    size: int
    root: bytes
    extensions: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        lines = [self.origin, str(self.size), base64.b64encode(self.root).decode()]
        return "\n".join(lines + self.extensions) + "\n"


def parse_checkpoint_text(text: str) -> Checkpoint:
    """The three mandatory lines (and any extension lines) of a checkpoint's note text."""
    lines = text.split("\n")
    if lines[-1] != "" or len(lines) < 4 or any(not line for line in lines[:-1]):
        raise NoteError("checkpoint text must be at least three non-empty lines")
    origin, size_line, root_line, *ext = lines[:-1]
    if not size_line.isdigit() or (size_line != "0" and size_line.startswith("0")):
        raise NoteError(f"checkpoint tree size {size_line!r} is not a decimal without zeros")
    try:
        root = base64.b64decode(root_line, validate=True)
    except binascii.Error as exc:
        raise NoteError("checkpoint root hash is not base64") from exc
    if len(root) != 32:
        raise NoteError("checkpoint root hash is not 32 bytes")
    return Checkpoint(origin, int(size_line), root, ext)


def open_checkpoint(note_text: str, log: Verifier) -> tuple[Checkpoint, Note]:
    """Parse a signed checkpoint and verify the log's own signature on it."""
    note = parse_note(note_text)
    cp = parse_checkpoint_text(note.text)
    if cp.origin != log.name:
        raise NoteError(f"checkpoint origin {cp.origin!r} is not the log {log.name!r}")
    verify(note, [log])
    return cp, note
