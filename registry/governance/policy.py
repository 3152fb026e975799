"""Policies: a TOML text, checked and filled with defaults into one canonical dict.

The digest is taken over the parsed, defaulted dict (not the text), so reformatting or a
comment does not change a policy's identity, while any changed number does. Measurement
settings for a pair are derived here too, so the same policy and pair always ask the runner
for the same measurement and a stored one can be reused.
"""

from __future__ import annotations

import tomllib
from copy import deepcopy
from pathlib import Path
from typing import Any

from registry.canonical import digest_of
from registry.errors import InvalidInput
from registry.records.core import PROVENANCE_FIELDS

DEFAULT_POLICY_PATH = Path(__file__).resolve().parent / "policies" / "default.toml"
DEFAULT_POLICY_NAME = "default"

DEFAULTS: dict[str, Any] = {
    "description": "",
    "suite": {
        "name": "default",
        "categories": [],
        "prompts_per_category": 0,
        "max_new_tokens": 64,
        "temperature": 0.0,
        "seed": 0,
    },
    "alpha": {
        "min_overall": 0.0,
        "min_per_category": 0.0,
        "max_drop": 1.0,
        "category_min": {},
    },
    "lossy": {
        "allowed": False,
        "adversarial_categories": ["adversarial"],
        "first_tokens": 32,
        "max_divergence_rate": 0.0,
    },
    "provenance": {
        "required": [],
        "require_signature": False,
        "allowed_signers": [],
        "trusted_roots": [],
    },
    "drafter": {"declared_target_must_match": True},
    # Kept only so stored policies still parse: remote model code is approved per artifact
    # manifest digest by an admin (``approve_remote_code``), never by a policy; a policy
    # that names lineages here is refused.
    "runner": {"trust_remote_code": []},
    # Which measurements a validation may reuse, by how they were produced: ``job`` (a
    # worker under a job), ``local`` (the embedded registry's own user), ``http`` (a result
    # self-reported over HTTP: never trusted unless named here); and whether only those a
    # registered worker key signed count; and which engines' measurements count: ``runner``
    # (the embedded runner) and/or ``vllm`` (``pairreg worker --engine vllm``, measured
    # where it serves): ``["vllm"]`` requires an engine measurement.
    "trust": {
        "measurements": ["job", "local"],
        "require_signature": False,
        "engines": ["runner", "vllm"],
    },
    # Four-eyes: the actor that registered a pair or stored the policy in force cannot
    # promote that pair.
    "governance": {"distinct_actors": False},
    "drift": {"margin": 0.05, "significance": 0.05, "bootstrap": 2000},
    # Online acceptance monitoring (registry/services/online.py): the sequential test's
    # level (false alarms over the whole life of a live pair) and the tolerated drop below
    # the validated rate before a drop counts.
    "online": {"level": 0.01, "tolerance": 0.02, "min_drafted": 1},
    # Pair economics (registry.economics): gates apply only when a key is set.
    "economics": {
        "hardware": "",
        "context": 4096,
        "price_per_hour": 0.0,
        "min_speedup": {},
        "max_cost_per_million_tokens": 0.0,
        "max_draft_memory_fraction": 0.0,
    },
}

_NUMBER_RANGES: dict[tuple[str, str], tuple[float, float]] = {
    ("suite", "temperature"): (0.0, 10.0),
    ("alpha", "min_overall"): (0.0, 1.0),
    ("alpha", "min_per_category"): (0.0, 1.0),
    ("alpha", "max_drop"): (0.0, 1.0),
    ("lossy", "max_divergence_rate"): (0.0, 1.0),
    ("drift", "margin"): (0.0, 1.0),
    ("drift", "significance"): (1e-6, 0.5),
    ("online", "level"): (1e-6, 0.5),
    ("online", "tolerance"): (0.0, 0.5),
}
_INT_RANGES: dict[tuple[str, str], tuple[int, int]] = {
    ("suite", "prompts_per_category"): (0, 100_000),
    ("suite", "max_new_tokens"): (1, 100_000),
    ("suite", "seed"): (0, 2**31 - 1),
    ("lossy", "first_tokens"): (1, 100_000),
    ("drift", "bootstrap"): (100, 100_000),
    ("online", "min_drafted"): (1, 1_000_000),
}


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > 100 or " " in name:
        raise InvalidInput("policy name must be 1-100 characters without spaces", field="name")
    return name.strip()


def parse_policy(text: str, *, name: str | None = None) -> dict[str, Any]:
    """Parse and check a policy TOML; unknown keys are refused so typos cannot pass silently."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"policy is not valid TOML: {exc}", field="policy") from exc
    policy = deepcopy(DEFAULTS)
    top_name = raw.pop("name", None)
    policy["name"] = _check_name(name if name is not None else top_name)
    if "description" in raw:
        policy["description"] = str(raw.pop("description"))
    for section, values in raw.items():
        if section not in DEFAULTS or not isinstance(DEFAULTS[section], dict):
            raise InvalidInput(
                f"unknown policy section [{section}]; known: "
                + ", ".join(k for k, v in DEFAULTS.items() if isinstance(v, dict)),
                field=section,
            )
        if not isinstance(values, dict):
            raise InvalidInput(f"[{section}] must be a table", field=section)
        for key, value in values.items():
            if key not in DEFAULTS[section]:
                raise InvalidInput(
                    f"unknown key {key!r} in [{section}]; known: " + ", ".join(DEFAULTS[section]),
                    field=f"{section}.{key}",
                )
            policy[section][key] = value
    _check(policy)
    return policy


def _check(policy: dict[str, Any]) -> None:
    for (section, key), (lo, hi) in _NUMBER_RANGES.items():
        value = policy[section][key]
        if not isinstance(value, int | float) or isinstance(value, bool) or not lo <= value <= hi:
            raise InvalidInput(
                f"{section}.{key} must be a number from {lo} to {hi}", field=f"{section}.{key}"
            )
        policy[section][key] = float(value)
    for (section, key), (lo, hi) in _INT_RANGES.items():
        value = policy[section][key]
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise InvalidInput(
                f"{section}.{key} must be an integer from {lo} to {hi}", field=f"{section}.{key}"
            )
    suite = policy["suite"]
    if not isinstance(suite["name"], str) or not suite["name"]:
        raise InvalidInput("suite.name must name a suite", field="suite.name")
    for section, key in (
        ("suite", "categories"),
        ("lossy", "adversarial_categories"),
        ("provenance", "required"),
        ("provenance", "allowed_signers"),
        ("provenance", "trusted_roots"),
        ("runner", "trust_remote_code"),
    ):
        value = policy[section][key]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InvalidInput(
                f"{section}.{key} must be a list of strings", field=f"{section}.{key}"
            )
    unknown = sorted(set(policy["provenance"]["required"]) - set(PROVENANCE_FIELDS))
    if unknown:
        raise InvalidInput(
            f"provenance.required names unknown field {unknown[0]!r}; known: "
            + ", ".join(PROVENANCE_FIELDS),
            field="provenance.required",
        )
    floors = policy["alpha"]["category_min"]
    if not isinstance(floors, dict):
        raise InvalidInput("[alpha.category_min] must be a table", field="alpha.category_min")
    for cat, value in floors.items():
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
            raise InvalidInput(
                f"alpha.category_min.{cat} must be a number from 0 to 1",
                field=f"alpha.category_min.{cat}",
            )
        floors[cat] = float(value)
    for section, key in (("lossy", "allowed"), ("provenance", "require_signature")):
        if not isinstance(policy[section][key], bool):
            raise InvalidInput(f"{section}.{key} must be true or false", field=f"{section}.{key}")
    for key in ("allowed_signers", "trusted_roots"):
        for entry in policy["provenance"][key]:
            if not entry.strip():
                raise InvalidInput(
                    f"provenance.{key} has an empty entry", field=f"provenance.{key}"
                )
    for entry in policy["provenance"]["trusted_roots"]:
        if not (entry.startswith("sha256:") and len(entry) == 71):
            raise InvalidInput(
                f"provenance.trusted_roots entry {entry!r} must be sha256:<64 hex> (the CA "
                "certificate's DER fingerprint)",
                field="provenance.trusted_roots",
            )
    _check_economics(policy["economics"])
    _check_duties(policy)
    if not isinstance(policy["drafter"]["declared_target_must_match"], bool):
        raise InvalidInput(
            "drafter.declared_target_must_match must be true or false",
            field="drafter.declared_target_must_match",
        )


def _subset(trust: dict[str, Any], key: str, allowed: tuple[str, ...]) -> list[str]:
    """``[trust] key``: a non-empty list drawn from ``allowed``, in ``allowed``'s order."""
    values = trust[key]
    if not isinstance(values, list) or not values or any(v not in allowed for v in values):
        raise InvalidInput(
            f"trust.{key} must be a non-empty list of " + ", ".join(allowed),
            field=f"trust.{key}",
        )
    return sorted(set(values), key=allowed.index)


def _check_duties(policy: dict[str, Any]) -> None:
    """``[runner]``, ``[trust]`` and ``[governance]``: what a policy may and may not grant."""
    if policy["runner"]["trust_remote_code"]:
        raise InvalidInput(
            "[runner] trust_remote_code can no longer name lineages: an admin approves one "
            "artifact's model code by its manifest digest (`pairreg artifact approve-remote-code`)",
            field="runner.trust_remote_code",
        )
    trust = policy["trust"]
    trust["measurements"] = _subset(trust, "measurements", MEASUREMENT_ORIGINS)
    trust["engines"] = _subset(trust, "engines", MEASURING_ENGINES)
    for section, key in (("trust", "require_signature"), ("governance", "distinct_actors")):
        if not isinstance(policy[section][key], bool):
            raise InvalidInput(f"{section}.{key} must be true or false", field=f"{section}.{key}")


def section(policy: dict[str, Any], name: str) -> dict[str, Any]:
    """A policy section with its defaults filled in (policies stored before the section
    existed lack it, and then mean its defaults)."""
    return {**DEFAULTS[name], **(policy.get(name) or {})}


def _check_economics(econ: dict[str, Any]) -> None:
    """``[economics]``: ``min_speedup`` maps batch sizes to floors (``{1 = 1.3, 16 = 1.0}``);
    0 means "no gate" for the cost and memory ceilings."""
    if not isinstance(econ["hardware"], str) or len(econ["hardware"]) > 100:
        raise InvalidInput("economics.hardware must name a hardware profile", field="economics")
    ctx = econ["context"]
    if not isinstance(ctx, int) or isinstance(ctx, bool) or not 1 <= ctx <= 10_000_000:
        raise InvalidInput(
            "economics.context must be an integer from 1 to 10000000", field="economics.context"
        )
    for key, hi in (
        ("price_per_hour", 1e6),
        ("max_cost_per_million_tokens", 1e9),
        ("max_draft_memory_fraction", 1.0),
    ):
        v = econ[key]
        if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v <= hi:
            raise InvalidInput(
                f"economics.{key} must be a number from 0 to {hi:g}", field=f"economics.{key}"
            )
        econ[key] = float(v)
    floors = econ["min_speedup"]
    if not isinstance(floors, dict):
        raise InvalidInput(
            "economics.min_speedup must be a table of batch = floor", field="economics.min_speedup"
        )
    clean: dict[str, float] = {}
    for b, v in floors.items():
        if not str(b).isdigit() or not 1 <= int(b) <= 1_000_000:
            raise InvalidInput(
                f"economics.min_speedup key {b!r} must be a batch size",
                field="economics.min_speedup",
            )
        if not isinstance(v, int | float) or isinstance(v, bool) or not 0 < v <= 100:
            raise InvalidInput(
                f"economics.min_speedup.{b} must be a number from 0 to 100",
                field="economics.min_speedup",
            )
        clean[str(int(b))] = float(v)
    econ["min_speedup"] = dict(sorted(clean.items(), key=lambda kv: int(kv[0])))
    gated = (
        econ["min_speedup"]
        or econ["max_cost_per_million_tokens"]
        or (econ["max_draft_memory_fraction"])
    )
    if gated and not econ["hardware"]:
        raise InvalidInput(
            "economics gates need economics.hardware (a profile name)", field="economics.hardware"
        )


def economics_gated(policy: dict[str, Any]) -> bool:
    econ = policy.get("economics") or {}
    return bool(
        econ.get("min_speedup")
        or econ.get("max_cost_per_million_tokens")
        or econ.get("max_draft_memory_fraction")
    )


def applicable_policy_name(asked: str | None, deployment_policy: str | None) -> str:
    """Which policy governs a validation: the one asked for, else the deployment's, else the
    shipped ``default``. (A policy given as text is stored first and asked for by name.)"""
    return asked or deployment_policy or DEFAULT_POLICY_NAME


# Keys added after policies were first stored: left out of the digest while at their
# default, so a policy that does not use them keeps the identity it had before.
_DIGEST_OMIT_IF_DEFAULT = (
    ("provenance", "require_signature"),
    ("provenance", "allowed_signers"),
    ("provenance", "trusted_roots"),
    ("trust", "engines"),
)
_DIGEST_OMIT_SECTION_IF_DEFAULT = ("economics", "trust", "governance")
MEASUREMENT_ORIGINS = ("job", "local", "http")
# What took a measurement: the embedded runner, or an engine where it serves.
MEASURING_ENGINES = ("runner", "vllm")


def measuring_engine(extra: dict[str, Any] | None) -> str:
    """The engine a stored measurement was taken on (its ``engine`` block; none: the
    embedded runner)."""
    engine = (extra or {}).get("engine")
    name = engine.get("name") if isinstance(engine, dict) else None
    return str(name) if name else "runner"


def policy_digest(parsed: dict[str, Any]) -> str:
    trimmed = deepcopy(parsed)
    for section, key in _DIGEST_OMIT_IF_DEFAULT:
        if trimmed.get(section, {}).get(key) == DEFAULTS[section][key]:
            trimmed[section].pop(key, None)
    for section in _DIGEST_OMIT_SECTION_IF_DEFAULT:
        default = {
            k: v
            for k, v in DEFAULTS[section].items()
            if (section, k) not in _DIGEST_OMIT_IF_DEFAULT
        }
        if trimmed.get(section) in (DEFAULTS[section], default):
            trimmed.pop(section, None)
    return digest_of(trimmed)


def default_policy_text() -> str:
    return DEFAULT_POLICY_PATH.read_text(encoding="utf-8")


def category_floor(policy: dict[str, Any], category: str) -> float:
    return float(policy["alpha"]["category_min"].get(category, policy["alpha"]["min_per_category"]))


# Pair-config keys the runner understands, and the runner's names for them.
_CONFIG_TO_SETTINGS = {
    "dtype": "dtype",
    "acceptance": "acceptance",
    "typical_epsilon": "typical_epsilon",
    "typical_delta": "typical_delta",
    "strict_prefix_tokens": "strict_prefix_tokens",
    "prompt_lookup_max": "max_ngram",
    "prompt_lookup_min": "min_ngram",
    "tree": "tree",
}


def measurement_settings(
    pair_config: dict[str, Any],
    suite: dict[str, Any],
    *,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The runner settings a pair is measured with under a policy's suite section.

    The device is left out on purpose: it is where a measurement ran, not what it asked
    for, so a CPU and a GPU worker can serve the same measurement request.
    """
    settings: dict[str, Any] = {
        "method": pair_config["method"],
        "k": int(pair_config["num_speculative_tokens"]),
        "temperature": float(suite.get("temperature", 0.0)),
        "max_new_tokens": int(suite.get("max_new_tokens", 64)),
        "seed": int(suite.get("seed", 0)),
    }
    for src, dst in _CONFIG_TO_SETTINGS.items():
        if src in pair_config:
            settings[dst] = pair_config[src]
    for key, value in (overrides or {}).items():
        if value is not None:
            settings[key] = value
    return dict(sorted(settings.items()))


def remote_code_parts(
    parts: list[tuple[str, str, dict[str, Any] | None, str]], approved: set[str]
) -> tuple[list[str], bool]:
    """For ``(role, lineage, facts, manifest_digest)`` parts: (those whose code is not in
    transformers and whose exact bytes no admin approved, whether any part runs its own
    code). Such code runs only in a worker that holds no registry secrets."""
    needing = [
        (role, lineage, digest)
        for role, lineage, facts, digest in parts
        if (facts or {}).get("remote_code")
    ]
    refused = [
        f"{role} {lineage} ships its own model code (config.json auto_map), which runs only "
        f"once an admin approves these exact bytes (manifest {digest[:12]}): "
        "`pairreg artifact approve-remote-code`"
        for role, lineage, digest in needing
        if digest not in approved
    ]
    return refused, bool(needing)


def settings_digest(settings: dict[str, Any]) -> str:
    return digest_of({k: v for k, v in settings.items() if k not in ("device", "num_threads")})
