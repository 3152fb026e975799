"""RFC 6962 / RFC 9162 Merkle trees: hashing, inclusion and consistency proofs.

Pure stdlib, no database: the log stores the hash of every *perfect* subtree it has
completed (``(level, index)`` covers leaves ``[index·2^level, (index+1)·2^level)``), and
every hash a proof needs is the right fold of a few such subtrees. So a proof for a tree of
any size is computed from O(log² n) stored hashes, never by re-reading the leaves.

The proof *shapes* (which leaf ranges a proof consists of) depend only on the sizes, so a
caller first asks :func:`inclusion_ranges` / :func:`consistency_ranges` which ranges it
needs, fetches the perfect subtrees of all of them in one query (:func:`perfect_cover`),
then folds (:func:`range_hash`). The verifiers follow RFC 9162 §2.1.3.2 and §2.1.4.2
literally; they are what an outside auditor re-implements (docs/transparency.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping

Key = tuple[int, int]  # (level, index) of a perfect subtree
Range = tuple[int, int]  # [start, end) of leaf indices

EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    """``SHA-256(0x00 || data)`` (RFC 6962 §2.1)."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """``SHA-256(0x01 || left || right)`` (RFC 6962 §2.1)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def split(n: int) -> int:
    """The largest power of two strictly smaller than ``n`` (``n >= 2``)."""
    if n < 2:
        raise ValueError("split needs n >= 2")
    return 1 << ((n - 1).bit_length() - 1)


# --- which subtrees a hash is made of ----------------------------------------------------


def perfect_cover(start: int, end: int) -> list[Key]:
    """The perfect subtrees that make up ``[start, end)``, left to right (largest first).

    Valid for every range that appears in RFC 6962's recursion over ``[0, n)``: ``start``
    is then a multiple of the smallest power of two ≥ ``end - start``, and the greedy cover
    below is exactly the recursion's left/right split, so :func:`range_hash` folds it
    back into ``MTH(D[start:end])``.
    """
    if not 0 <= start < end:
        raise ValueError(f"empty or negative range [{start}, {end})")
    out: list[Key] = []
    while start < end:
        level = (start & -start).bit_length() - 1 if start else (end - start).bit_length() - 1
        while (1 << level) > end - start:
            level -= 1
        out.append((level, start >> level))
        start += 1 << level
    return out


def fold(hashes: list[bytes]) -> bytes:
    """Right fold of a cover's hashes: ``H(h0, H(h1, … H(h_{k-2}, h_{k-1})))``."""
    acc = hashes[-1]
    for h in reversed(hashes[:-1]):
        acc = node_hash(h, acc)
    return acc


def range_hash(start: int, end: int, nodes: Mapping[Key, bytes]) -> bytes:
    """``MTH(D[start:end])`` from stored perfect-subtree hashes."""
    return fold([nodes[k] for k in perfect_cover(start, end)])


def root_ranges(size: int) -> list[Range]:
    return [(0, size)] if size else []


def inclusion_ranges(index: int, size: int) -> list[Range]:
    """The ranges whose hashes form the audit path of leaf ``index`` (RFC 9162 §2.1.3.1),
    deepest sibling first."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of size {size}")
    out: list[Range] = []
    lo, hi, m = 0, size, index
    while hi - lo > 1:
        k = split(hi - lo)
        if m < k:
            out.append((lo + k, hi))
            hi = lo + k
        else:
            out.append((lo, lo + k))
            lo, m = lo + k, m - k
    out.reverse()
    return out


def consistency_ranges(old: int, new: int) -> list[Range]:
    """The ranges whose hashes form the consistency proof from ``old`` to ``new`` leaves
    (RFC 9162 §2.1.4.1, ``PROOF(m, D[n]) = SUBPROOF(m, D[n], true)``)."""
    if not 0 <= old <= new:
        raise ValueError(f"no consistency proof from size {old} to size {new}")
    if old == 0 or old == new:
        return []
    out: list[Range] = []
    lo, hi, m, complete = 0, new, old, True
    while m != hi - lo:
        k = split(hi - lo)
        if m <= k:
            out.append((lo + k, hi))
            hi = lo + k
        else:
            out.append((lo, lo + k))
            lo, m, complete = lo + k, m - k, False
    if not complete:
        out.append((lo, hi))
    out.reverse()
    return out


def keys_for(ranges: Iterable[Range]) -> set[Key]:
    return {k for r in ranges for k in perfect_cover(*r)}


# --- building the stored subtrees --------------------------------------------------------


def completed_nodes(
    index: int, leaf: bytes, left_of: Callable[[Key], bytes]
) -> list[tuple[Key, bytes]]:
    """The subtrees completed by appending leaf ``index``: the leaf itself, then each parent
    whose right edge it closes. ``left_of`` returns the stored left sibling at each level
    (see :func:`left_siblings` for which ones)."""
    out = [((0, index), leaf)]
    level, i, h = 0, index, leaf
    while i & 1:
        h = node_hash(left_of((level, i - 1)), h)
        level, i = level + 1, i >> 1
        out.append(((level, i), h))
    return out


def left_siblings(index: int) -> list[Key]:
    """Stored subtrees that appending leaf ``index`` will merge with."""
    out, level, i = [], 0, index
    while i & 1:
        out.append((level, i - 1))
        level, i = level + 1, i >> 1
    return out


def build_nodes(leaves: Iterable[bytes], start: int = 0) -> Iterator[tuple[Key, bytes]]:
    """Every perfect subtree over a stream of leaf hashes (index ``start`` onwards, with
    ``start`` a multiple of every subtree it closes — 0 for a full rebuild), in O(log n)
    memory."""
    stack: list[bytes] = []  # stack[level] = pending left sibling at that level, or b""
    index = start
    for leaf in leaves:
        yield (0, index), leaf
        level, i, h = 0, index, leaf
        while i & 1:
            h = node_hash(stack[level], h)
            level, i = level + 1, i >> 1
            yield (level, i), h
        while len(stack) <= level:
            stack.append(b"")
        stack[level] = h
        index += 1


def root_from_leaves(leaves: list[bytes]) -> bytes:
    """``MTH`` by recomputing every node: the baseline a stored tree is measured against."""
    if not leaves:
        return EMPTY_ROOT
    level = list(leaves)
    # Bottom-up pairing gives RFC 6962's tree: an odd node is carried up unchanged.
    while len(level) > 1:
        nxt = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


# --- verification (what an outside verifier does) ----------------------------------------


def verify_inclusion(leaf: bytes, index: int, size: int, path: list[bytes], root: bytes) -> bool:
    """RFC 9162 §2.1.3.2."""
    if not 0 <= index < size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, path: list[bytes]
) -> bool:
    """RFC 9162 §2.1.4.2, with its two trivial cases: an empty old tree is consistent with
    any tree (and needs no proof); equal sizes need equal roots and an empty proof."""
    if not 0 <= old_size <= new_size:
        return False
    if old_size == new_size:
        return not path and old_root == new_root
    if old_size == 0:
        return not path
    if not path:
        return False
    if old_size & (old_size - 1) == 0:  # an exact power of two: the old root is a node
        path = [old_root, *path]
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == old_root and sr == new_root and sn == 0
