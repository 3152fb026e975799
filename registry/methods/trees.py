"""Token trees: the shapes a tree-drafting method may verify, in canonical form.

A method says which kinds it takes (:attr:`SpeculationMethod.tree_kinds`); the shape is
part of the pair digest, so equal trees must normalise to equal values.
"""

from __future__ import annotations

from typing import Any

from registry.errors import InvalidInput
from registry.methods.base import SpeculationMethod

# ``static``: candidate-rank paths (Medusa / EAGLE-1 / vLLM's ``speculative_token_tree``);
# ``dynamic``: EAGLE-2 (top-k expansion, the best N verified)
TREE_KINDS: tuple[str, ...] = ("static", "dynamic")
MAX_TREE_NODES = 512


def normalise_tree(
    value: Any, method: SpeculationMethod, k: int, rule: str
) -> dict[str, Any] | None:
    """A token tree's shape, checked and in canonical form (it is part of the digest).

    ``{"kind": "static", "choices": [[0], [1], [0, 0], ...]}``: candidate-rank paths
    (prefix-closed, sorted by depth then path; vLLM's ``speculative_token_tree``).
    ``{"kind": "dynamic", "top_k": K, "total_tokens": N}``: EAGLE-2 (expand the K most
    confident nodes per level with K candidates each, verify the best N). Either way the
    tree's depth is ``num_speculative_tokens``; ``kind`` may be left out when the keys say
    which it is. Trees are verified losslessly, so only the strict rule takes one.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidInput("tree must be an object (static choices or dynamic top_k)", field="tree")
    if not method.takes_tree:
        raise InvalidInput(
            f"method {method.name} drafts chains only; tree needs heads", field="tree"
        )
    if rule != "strict":
        raise InvalidInput("a token tree is verified with the strict rule only", field="tree")
    kind = value.get("kind") or (
        "static" if "choices" in value else "dynamic" if "top_k" in value else None
    )
    if kind not in TREE_KINDS:
        raise InvalidInput(f"tree.kind must be one of {', '.join(TREE_KINDS)}", field="tree.kind")
    keys = {"static": {"kind", "choices"}, "dynamic": {"kind", "top_k", "total_tokens"}}[kind]
    unknown = sorted(set(value) - keys)
    if unknown:
        raise InvalidInput(
            f"unknown key tree.{unknown[0]} for a {kind} tree; allowed: {', '.join(sorted(keys))}",
            field=f"tree.{unknown[0]}",
        )
    if kind not in method.tree_kinds:
        raise InvalidInput(
            f"{method.title} heads take a {' or '.join(method.tree_kinds)} tree"
            + (" (choices)" if method.tree_kinds == ("static",) else ""),
            field="tree.kind",
        )
    if kind == "dynamic":
        out: dict[str, Any] = {"kind": "dynamic"}
        for key, hi in (("top_k", 64), ("total_tokens", MAX_TREE_NODES)):
            v = value.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= hi:
                raise InvalidInput(
                    f"tree.{key} must be an integer from 1 to {hi}", field=f"tree.{key}"
                )
            out[key] = v
        return out
    raw = value.get("choices")
    if not isinstance(raw, list) or not raw:
        raise InvalidInput("tree.choices must be a non-empty list of paths", field="tree.choices")
    if len(raw) > MAX_TREE_NODES:
        raise InvalidInput(
            f"tree.choices holds at most {MAX_TREE_NODES} paths", field="tree.choices"
        )
    paths: set[tuple[int, ...]] = set()
    for item in raw:
        ok = isinstance(item, list | tuple) and 1 <= len(item) <= k
        ok = ok and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in item)
        if not ok:
            raise InvalidInput(
                f"tree.choices: {item!r} is not a path of 1 to {k} ranks (integers >= 0)",
                field="tree.choices",
            )
        path = tuple(item)
        if path in paths:
            raise InvalidInput(f"tree.choices lists {list(path)} twice", field="tree.choices")
        paths.add(path)
    for path in paths:
        if len(path) > 1 and path[:-1] not in paths:
            raise InvalidInput(
                f"tree.choices has {list(path)} but not its parent {list(path[:-1])}",
                field="tree.choices",
            )
    depth = max(len(p) for p in paths)
    if depth != k:
        raise InvalidInput(
            f"the tree is {depth} deep but num_speculative_tokens (k) is {k}: "
            "for a tree k is its depth",
            field="tree.choices",
        )
    ordered = sorted(paths, key=lambda p: (len(p), p))
    return {"kind": "static", "choices": [list(p) for p in ordered]}
