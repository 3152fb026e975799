"""One object per speculation method: the table is the only place a method's name decides
behaviour, the objects reproduce the per-method rules they replaced, and a new method
object is all the registry's paths need (config, compatibility, economics, export)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import get_args

import pytest

from registry import methods
from registry.artifacts.speculators import METHOD_OF
from registry.economics import model as em
from registry.errors import InvalidInput
from registry.methods.base import SpeculationMethod
from registry.services import exports
from registry.services.pairs import head_fit_errors, normalise_config
from runner.build import DRAFTERS

REPO = Path(__file__).resolve().parents[2]
NAMES = set(methods.METHODS)
# The runner's one table of drafter factories, keyed by the method objects' names.
ALLOWED_TABLES = {("runner/build.py", "DRAFTERS")}
# The EAGLE head loader reads the speculators file format, whose speculators_model_type
# ("eagle" / "eagle3") selects the checkpoint's layout: a file format, not a pair method.
ALLOWED_COMPARES = {"runner/eagle.py"}


def test_the_table_lists_each_method_once_under_its_own_name() -> None:
    assert methods.METHODS == ("draft_model", "prompt_lookup", "medusa", "eagle", "eagle3", "mtp")
    assert get_args(methods.Method) == methods.METHODS  # what the API and the CLI accept
    for name, m in methods.TABLE.items():
        assert m.name == name and methods.get_method(name) is m
    with pytest.raises(InvalidInput) as err:
        methods.get_method("ngram")  # aliases are for the runner's input, not registration
    assert err.value.field == "method"
    assert methods.canonical_method("ngram") == "prompt_lookup"


def test_derived_sets_are_the_rules_they_replaced() -> None:
    assert methods.HEAD_METHODS == {"medusa", "eagle", "eagle3", "mtp"}
    assert methods.MODEL_FREE_METHODS == {"prompt_lookup"}
    assert methods.RUNNABLE_METHODS == ("draft_model", "prompt_lookup", "medusa", "eagle", "eagle3")
    assert methods.TREE_METHODS == ("medusa", "eagle", "eagle3")
    assert methods.METHOD_ALIASES == {"ngram": "prompt_lookup"}
    assert METHOD_OF == {
        "eagle": "eagle",
        "eagle3": "eagle3",
        "medusa": "medusa",
        "mtp": "mtp",
        "draft_model": "draft_model",
        "independent": "draft_model",
    }


def test_export_and_economics_mappings_per_method() -> None:
    vllm = {n: m.vllm_method for n, m in methods.TABLE.items()}
    assert vllm == {
        "draft_model": "draft_model",
        "prompt_lookup": "ngram",
        "medusa": "medusa",
        "eagle": "eagle",
        "eagle3": "eagle3",
        "mtp": "mtp",
    }
    sglang = {n: m.sglang_algorithm for n, m in methods.TABLE.items() if m.sglang_algorithm}
    assert sglang == {
        "draft_model": "STANDALONE",
        "prompt_lookup": "NGRAM",
        "eagle": "EAGLE",
        "eagle3": "EAGLE3",
    }
    passes = {n: em.drafter_passes(n, 5) for n in methods.METHODS}
    assert passes == {
        "draft_model": 5, "prompt_lookup": 0, "medusa": 1, "eagle": 5, "eagle3": 5, "mtp": 5,
    }  # fmt: skip
    assert em.shape_for("medusa", 3, tau=2.0, drafted_per_step=14).draft_tokens_per_pass == 1.0
    assert em.shape_for("eagle", 3, tau=2.0, drafted_per_step=12).draft_tokens_per_pass == 4.0


def test_head_fit_rules_follow_the_method() -> None:
    tf = {"hidden_size": 256, "vocab_size": 259, "num_layers": 2}
    df = {"hidden_size": 128, "vocab_size": 259, "speculators": {"aux_layer_ids": [1, 2, 3]}}
    assert head_fit_errors(tf, df, "draft_model") == []  # a model, not heads
    (hidden,) = head_fit_errors(tf, df, "eagle")
    assert "hidden size mismatch" in hidden
    found = head_fit_errors(tf, df, "eagle3")
    assert found[0] == hidden and "layer count mismatch" in found[1] and len(found) == 2


def test_the_runner_builds_exactly_the_runnable_methods() -> None:
    assert set(DRAFTERS) == set(methods.RUNNABLE_METHODS) | {"none"}


def _switches(path: Path) -> list[str]:
    """Comparisons against a method's name, and tables keyed by method names."""
    rel = path.relative_to(REPO).as_posix()
    found: list[str] = []
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def names_in(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value} & NAMES
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return set().union(*(names_in(e) for e in node.elts)) if node.elts else set()
        return set()

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            hit = set().union(*(names_in(n) for n in [node.left, *node.comparators]))
            if hit and rel not in ALLOWED_COMPARES:
                found.append(f"{rel}:{node.lineno} compares with {sorted(hit)}")
        elif isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict):
            keys = set().union(*(names_in(k) for k in node.value.keys if k is not None))
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            label = next((t.id for t in targets if isinstance(t, ast.Name)), "?")
            if len(keys) >= 2 and (rel, label) not in ALLOWED_TABLES:
                found.append(f"{rel}:{node.lineno} table {label} keyed by {sorted(keys)}")
    return found


def test_no_string_switch_on_method_names_outside_the_method_table() -> None:
    """Behaviour per method lives in registry/methods/ (and the runner's drafter table):
    nowhere else in the product compares a value with a method's name or keeps a table
    keyed by method names. Speculators model types that happen to share a name are matched
    through the method objects too."""
    found: list[str] = []
    for top in ("registry", "runner", "api", "cli", "builders"):
        for path in sorted((REPO / top).rglob("*.py")):
            if path.is_relative_to(REPO / "registry" / "methods"):
                continue
            found += _switches(path)
    assert found == []


def test_a_new_method_object_is_all_the_registry_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A method the code has never heard of (suffix decoding, model-free, served by vLLM)
    goes through config normalisation, compatibility, economics and the vLLM export from its
    object alone."""
    suffix = SpeculationMethod(
        name="suffix",
        title="suffix decoding",
        drafter="none",
        drafter_roles=(),
        draft_passes="none",
        defaults={"suffix_max_depth": 24},
        vllm_method="suffix",
    )
    monkeypatch.setitem(methods.TABLE, "suffix", suffix)
    config = normalise_config("suffix", 6, {"suffix_max_depth": 32})
    assert config["method"] == "suffix" and config["suffix_max_depth"] == 32
    with pytest.raises(InvalidInput) as err:
        normalise_config("suffix", 6, {"tree": {"top_k": 2, "total_tokens": 4}})
    assert err.value.field == "tree"
    shape = em.shape_for("suffix", 6, tau=3.0)
    assert shape.draft_passes == 0 and shape.verify_tokens == 7.0
    art = SimpleNamespace(
        source_kind="hf", hub_repo="org/target", hub_commit="a" * 40, lineage="t", version=1
    )
    pair = SimpleNamespace(
        method="suffix", k=6, config=config, target=art, drafter=None, pair_digest="d" * 64
    )
    args, spec = exports.vllm_args(pair, "chat")  # type: ignore[arg-type]
    assert spec == {"method": "suffix", "num_speculative_tokens": 6}
    with pytest.raises(InvalidInput, match="SGLang has no speculative algorithm"):
        exports.sglang_args(pair, "chat")  # type: ignore[arg-type]
