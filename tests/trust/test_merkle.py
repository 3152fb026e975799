"""registry.trust.merkle against a literal transcription of RFC 9162's recursive definitions, and
the C2SP note format against hand-built signatures."""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry.trust import merkle, signed_note

BAD = b"\x07" * 32


def mth(leaves: list[bytes]) -> bytes:
    """RFC 9162 §2.1.1 MTH, recursively."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = merkle.split(len(leaves))
    return merkle.node_hash(mth(leaves[:k]), mth(leaves[k:]))


def path(m: int, leaves: list[bytes]) -> list[bytes]:
    """RFC 9162 §2.1.3.1 PATH(m, D[n])."""
    if len(leaves) <= 1:
        return []
    k = merkle.split(len(leaves))
    if m < k:
        return path(m, leaves[:k]) + [mth(leaves[k:])]
    return path(m - k, leaves[k:]) + [mth(leaves[:k])]


def subproof(m: int, leaves: list[bytes], b: bool) -> list[bytes]:
    """RFC 9162 §2.1.4.1 SUBPROOF(m, D[n], b)."""
    n = len(leaves)
    if m == n:
        return [] if b else [mth(leaves)]
    k = merkle.split(n)
    if m <= k:
        return subproof(m, leaves[:k], b) + [mth(leaves[k:])]
    return subproof(m - k, leaves[k:], False) + [mth(leaves[:k])]


N = 45
LEAVES = [merkle.leaf_hash(f"event {i}".encode()) for i in range(N)]
NODES = dict(merkle.build_nodes(LEAVES))


def test_stored_subtrees_give_every_root_path_and_proof() -> None:
    incremental: dict[merkle.Key, bytes] = {}
    for i, leaf in enumerate(LEAVES):
        for key, h in merkle.completed_nodes(i, leaf, incremental.__getitem__):
            incremental[key] = h
    assert incremental == NODES  # appending one by one stores what a rebuild stores
    assert len(NODES) == 2 * N - bin(N).count("1")
    for n in range(1, N + 1):
        root = mth(LEAVES[:n])
        assert merkle.range_hash(0, n, NODES) == root == merkle.root_from_leaves(LEAVES[:n])
        for i in range(n):
            p = [merkle.range_hash(a, b, NODES) for a, b in merkle.inclusion_ranges(i, n)]
            assert p == path(i, LEAVES[:n])
            assert merkle.verify_inclusion(LEAVES[i], i, n, p, root)
            assert not merkle.verify_inclusion(BAD, i, n, p, root)
            if p:
                assert not merkle.verify_inclusion(LEAVES[i], i, n, p[:-1], root)
        for old in range(n + 1):
            p = [merkle.range_hash(a, b, NODES) for a, b in merkle.consistency_ranges(old, n)]
            assert p == ([] if old in (0, n) else subproof(old, LEAVES[:n], True))
            assert merkle.verify_consistency(old, n, mth(LEAVES[:old]), root, p)
            if 0 < old < n:
                forked = LEAVES[: old - 1] + [BAD] + LEAVES[old:n]
                assert not merkle.verify_consistency(old, n, mth(LEAVES[:old]), mth(forked), p)
                assert not merkle.verify_consistency(old, n, BAD, root, p)


def test_empty_and_degenerate_trees() -> None:
    assert merkle.root_from_leaves([]) == hashlib.sha256(b"").digest()
    assert merkle.verify_consistency(0, 5, merkle.EMPTY_ROOT, mth(LEAVES[:5]), [])
    assert not merkle.verify_consistency(3, 3, mth(LEAVES[:3]), BAD, [])
    assert not merkle.verify_consistency(4, 3, mth(LEAVES[:4]), mth(LEAVES[:3]), [])
    with pytest.raises(ValueError):
        merkle.inclusion_ranges(5, 5)


def test_signed_note_round_trip_and_foreign_signatures() -> None:
    log_key = Ed25519PrivateKey.generate()
    wit_key = Ed25519PrivateKey.generate()
    log = signed_note.Verifier.of("example.com/log", log_key.public_key())
    wit = signed_note.Verifier.of(
        "witness.example/w1", wit_key.public_key(), signed_note.COSIGNATURE_V1
    )
    cp = signed_note.Checkpoint("example.com/log", 7, mth(LEAVES[:7]))
    assert cp.text == f"example.com/log\n7\n{base64.b64encode(mth(LEAVES[:7])).decode()}\n"
    note = signed_note.Note(cp.text, [signed_note.sign(cp.text, log.name, log_key)])
    note.signatures.append(signed_note.cosign(cp.text, wit.name, wit_key, 1_700_000_000))
    rendered = note.render()
    assert rendered.splitlines()[3] == ""
    assert rendered.splitlines()[4].startswith("\u2014 example.com/log ")
    # The key ID is the documented hash, and the vkey round-trips.
    raw = signed_note.raw_public(log_key.public_key())
    assert log.key_id == hashlib.sha256(b"example.com/log\n\x01" + raw).digest()[:4]
    assert signed_note.Verifier.parse(log.vkey) == log
    parsed = signed_note.parse_note(rendered)
    assert signed_note.verify(parsed, [log, wit]) == {
        "example.com/log": None,
        "witness.example/w1": 1_700_000_000,
    }
    # A verifier that knows only the log ignores the witness line.
    assert signed_note.verify(parsed, [log]) == {"example.com/log": None}
    opened, _ = signed_note.open_checkpoint(rendered, log)
    assert (opened.origin, opened.size, opened.root) == (cp.origin, 7, cp.root)
    # Any change to the text breaks the log's signature.
    forged = rendered.replace("\n7\n", "\n8\n", 1)
    with pytest.raises(signed_note.NoteError, match="does not verify"):
        signed_note.open_checkpoint(forged, log)
    # A vkey whose ID does not match its key is refused.
    name, kid, data = log.vkey.split("+", 2)
    with pytest.raises(signed_note.NoteError, match="key ID"):
        signed_note.Verifier.parse(f"{name}+{'0' * 8}+{data}")
    with pytest.raises(signed_note.NoteError, match="no signature from a trusted key"):
        signed_note.verify(parsed, [signed_note.Verifier.of("other", log_key.public_key())])
