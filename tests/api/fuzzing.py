"""What the API fuzz test needs: a seeded registry, the values that reach its records, roles.

A fuzzer left to itself answers 404 on every operation that needs an existing record (it
cannot guess an artifact ref, a job id or a request id) and 401 everywhere once it revokes its
own token. So the registry is seeded first, by the contract scenario of
``tests/api/test_contract.py`` (every operation, through the embedded backend) plus live
state that scenario consumes (a running job with a long lease, a queued one, an open flag,
a token per role, tokens the fuzzer may revoke); then schemathesis draws path, query and
body values from dictionaries of what exists, with a probability, so it still generates
values of its own the rest of the time.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import schemathesis
from schemathesis.generation import GenerationMode

from api.backend import local_backend
from registry.governance.policy import measurement_settings
from registry.governance.roles import ROLES
from registry.services.system import ADMIN_TOKEN_NAME, initialise, read_credentials
from registry.settings import Settings
from tests.api.role_table import ROLE_TABLE
from tests.api.test_contract import RESULT, SPECULATORS_EAGLE3, VLLM_METRICS, Recorder, scenario
from tests.fixtures import write_fake_model
from tests.hubserver import HubServer

VICTIMS = tuple(f"victim-{i}" for i in range(8))
WORKER = "fuzz-worker"
JOBS = 9
OTHERS = tuple(r for r in ROLES if r != "admin")


@dataclass
class Seeded:
    """A seeded registry: its settings, one secret per role, what exists (by kind)."""

    settings: Settings
    secrets: dict[str, str]
    protected: frozenset[str]  # token names the fuzzer must not revoke (its own)
    values: dict[str, list[Any]]
    measure: dict[str, Any] = field(default_factory=dict)  # a storable measurement's body


def seed(root: Path, template: Path, hub: HubServer) -> Seeded:
    """A registry holding every kind of record, its sources confined under ``root/models``;
    one target comes from ``hub`` (pinned to a commit, so serving exports work)."""
    shutil.copyfile(template, root / "registry.db")
    settings = Settings(
        home=root / "home",
        database_url=f"sqlite:///{root / 'registry.db'}",
        artifact_roots=str(root / "models"),
        max_source_files=64,
        max_source_bytes=1 << 20,
    )
    initialise(settings)
    models = {
        "t1": write_fake_model(root / "models" / "t1", weights=b"t1"),
        "t2": write_fake_model(root / "models" / "t2", weights=b"t2"),
        "d": write_fake_model(root / "models" / "d", hidden_size=32, weights=b"d"),
        "d_changed": write_fake_model(root / "models" / "dx", hidden_size=32, weights=b"x"),
        "heads": write_fake_model(
            root / "models" / "h", weights=b"h", config_extra=SPECULATORS_EAGLE3
        ),
        "rc": write_fake_model(  # ships its own model code: approve_remote_code's subject
            root / "models" / "rc",
            weights=b"rc",
            config_extra={"auto_map": {"AutoModelForCausalLM": "modeling_x.X"}},
        ),
        "archive": root / "archive",
    }
    hub_model = write_fake_model(root / "hub-model", weights=b"hub")
    hub.add_repo("acme/hub-t", {p.name: p.read_bytes() for p in hub_model.iterdir()})
    local = local_backend(settings, actor="fuzz:seed")
    call = Recorder(local)
    scenario(call, models)
    # Live state the scenario used up, or that it leaves blocked.
    a = local.get_pair(ref="1")
    c = _validated(local, target="acme/t@v1", draft="acme/d@v1", k=3)
    local.create_deployment(name="staging", policy="loose")
    local.promote(ref=a.pair_digest, deployment="staging", reason="seed")
    local.promote(ref=c, deployment="staging", reason="seed")
    local.add_artifact(source="hf://acme/hub-t@main", name="acme/hub", role="target")
    served = _validated(local, target="acme/hub@v1", k=3, method="prompt_lookup")
    local.create_deployment(name="hub", policy="loose")
    local.promote(ref=served, deployment="hub", reason="seed")
    # Pairs on no deployment, for deprecate and retire to use up.
    spare = [
        local.register_pair(target="acme/t@v1", method="prompt_lookup", k=k).pair.pair_digest
        for k in (2, 4, 5, 6)
    ]
    # Running jobs leased to the fuzzer's worker (a third each to complete, fail and renew),
    # and one left queued.
    running = []
    for i in range(JOBS + 1):
        local.validate_pair(ref="3", policy="default", runner_version=f"0.{i}-fuzz")
    for _ in range(JOBS):
        running.append(local.claim_job(worker=WORKER, lease_seconds=3600).id)
    # Open integrity flags on artifacts no promotable pair uses (a flag blocks promotion).
    # Routes are tried most literal path first, so resolve runs before ack: each gets its own.
    opened = [
        local.verify_artifact(ref=ref, path=str(models["d_changed"])).artifact_id
        for ref in ("acme/h@v1", "acme/t@v2", "acme/hub@v1")
    ]
    secrets = {"admin": (read_credentials(settings.credentials_path) or {})["token"]}
    for role in OTHERS:
        secrets[role] = local.create_token(name=f"fuzz-{role}", role=role).secret
    for name in VICTIMS:
        local.create_token(name=name, role="reader")
    protected = frozenset({ADMIN_TOKEN_NAME, *(f"fuzz-{r}" for r in OTHERS)})

    pairs = local.list_pairs(limit=500).items
    artifacts = local.list_artifacts(limit=500).items
    values: dict[str, list[Any]] = {
        "artifacts": [x.ref for x in artifacts] + [x.manifest_digest[:16] for x in artifacts],
        "lineages": sorted({x.lineage for x in artifacts}),
        "pairs": [str(p.id) for p in pairs] + [p.pair_digest[:16] for p in pairs],
        "validations": [v.id for v in local.list_validations(limit=500).items],
        "measurements": [m.id for m in local.list_measurements(limit=500).items],
        "jobs": [j.id for j in local.list_jobs(limit=500).items],
        "flags": [f.id for f in local.list_flags(limit=500).items],
        "policies": sorted({p.name for p in local.list_policies(limit=500).items}),
        "deployments": [d.name for d in local.list_deployments(limit=500).items],
        "requests": [r.request_id for r in local.list_requests(limit=500).items],
        "workers": [WORKER],
        "engines": ["vllm", "sglang"],
        "victims": list(VICTIMS),
        "sources": [str(models[k]) for k in ("t1", "t2", "d", "heads")] + ["~0"],
        "webhooks": [w.name for w in local.list_webhooks(limit=500).items],
        "urls": ["https://ci.example.com/hook", "http://127.0.0.1:9/hook"],
    }
    values["promotable"] = [str(a.id), c]
    values["running"] = running
    values["spare_pairs"] = spare
    open_flags = [f.id for f in local.list_flags(state="open", limit=500).items]
    assert len(open_flags) == len(opened), open_flags
    values["flags_ack"], values["flags_resolve"] = open_flags[:2], open_flags[2:]
    measure = {
        "pair": a.pair_digest, "suite_name": "default", "suite_digest": "ef" * 32,
        "settings": measurement_settings(a.config, {}), "runner_version": "9.9", "result": RESULT,
    }  # fmt: skip
    empty = [kind for kind, found in values.items() if not found]
    assert not empty, f"the seed holds no {empty}"
    return Seeded(settings, secrets, protected, values, measure)


def _validated(local: Any, *, target: str, k: int, draft: str | None = None, **kw: Any) -> str:
    """Register a pair, store a measurement for it, validate it under "loose": its digest."""
    method = kw.get("method", "draft_model")
    pair = local.register_pair(target=target, draft=draft, method=method, k=k).pair
    local.store_measurement(
        pair=pair.pair_digest, suite_name="default", suite_digest="ab" * 32,
        settings=measurement_settings(pair.config, {}), runner_version="9.9", result=RESULT,
    )  # fmt: skip
    done = local.validate_pair(ref=pair.pair_digest, policy="loose", runner_version="9.9")
    assert done.state == "done" and done.pair_status == "validated", done
    return str(pair.pair_digest)


# Which seeded values each operation's parameters draw from ("location.name": dictionary);
# keys name the wire names (``pair`` for promote's ``ref``). No required query parameter is
# bound: schemathesis re-inserts a bound parameter that a negative case had removed, and the
# request it then expects refused is valid (those operations are steered instead).
BINDINGS: dict[tuple[str, ...], dict[str, str]] = {
    ("add_artifact",): {"body.source": "sources"},
    ("list_artifacts",): {"query.lineage": "lineages"},
    ("get_artifact",): {"path.ref": "artifacts"},
    ("verify_artifact",): {"path.ref": "artifacts", "body.path": "sources"},
    ("register_pair",): {"body.target": "artifacts", "body.draft": "artifacts"},
    ("list_pairs",): {"query.target": "artifacts"},
    ("get_pair", "deprecate_pair", "retire_pair"): {"path.ref": "pairs"},
    ("export_speculators", "k_schedule", "export_acceptance_curve"): {"path.pair": "pairs"},
    ("get_webhook", "disable_webhook", "enable_webhook", "list_webhook_deliveries"): {
        "path.name": "webhooks"
    },
    ("create_webhook",): {"body.url": "urls"},
    ("validate_pair",): {
        "path.ref": "pairs",
        "body.policy": "policies",
        "body.deployment": "deployments",
    },
    ("list_validations", "list_measurements", "list_requests", "list_flags"): {
        "query.pair": "pairs"
    },
    ("get_validation", "set_validation_run"): {"path.id": "validations"},
    ("get_measurement",): {"path.id": "measurements"},
    ("store_measurement",): {"body.pair": "pairs"},
    ("claim_job",): {"body.worker": "workers"},
    ("get_job", "renew_lease", "complete_job", "fail_job"): {
        "path.id": "jobs",
        "body.worker": "workers",
    },
    ("get_flag",): {"path.id": "flags"},
    ("ack_flag",): {"path.id": "flags_ack"},
    ("resolve_flag",): {"path.id": "flags_resolve"},
    ("check_drift",): {
        "body.candidate": "pairs",
        "body.baseline_measurement": "measurements",
        "body.candidate_measurement": "measurements",
        "body.policy": "policies",
    },
    ("get_policy",): {"path.name": "policies"},
    ("create_deployment",): {"body.policy": "policies"},
    ("get_deployment", "deployment_at"): {"path.name": "deployments"},
    ("set_deployment_policy",): {"path.name": "deployments", "body.policy": "policies"},
    ("promote",): {"path.deployment": "deployments", "body.pair": "pairs"},
    ("rollback",): {"path.deployment": "deployments"},
    ("watch",): {"body.lineage": "lineages"},
    ("ingest_requests",): {"body.tags[*].deployment": "deployments"},
    ("audit_request", "build_bundle"): {"path.request_id": "requests"},
    ("export_serving",): {"path.engine": "engines"},
    ("revoke_token",): {"path.name": "victims"},
}

# A schema cannot say that a source path must exist, which config keys a method takes, or
# that a checkpoint's signature must verify: such requests are schema-valid and still
# rightly answered 422 (documented on every /v1 operation).
CHECKS = {
    "positive_data_acceptance": {"expected-statuses": ["2xx", "401", "403", "404", "409", "422"]}
}


def schema_config(seeded: Seeded, probability: float, *, deep: bool) -> schemathesis.Config:
    """Schemathesis configuration drawing each bound parameter from the seeded values.

    ``deep`` adds the coverage phase (boundary and type-confusion values for every
    parameter, several thousand cases): the longer run of ``make fuzz``."""
    operations = [
        {
            "include-operation-id": list(ids),
            "parameters": {
                key: {"dictionary": kind, "probability": probability} for key, kind in bound.items()
            },
        }
        for ids, bound in BINDINGS.items()
    ]
    dictionaries = {kind: {"values": found} for kind, found in seeded.values.items()}
    return schemathesis.Config.from_dict(
        {
            "checks": CHECKS,
            "dictionaries": dictionaries,
            "operations": operations,
            "phases": {"coverage": {"enabled": deep}},
        }
    )


_ROLE_INDEX = {(m, re.sub(r":path\}", "}", p)): roles for (m, p), roles in ROLE_TABLE.items()}


def admitted(method: str, path: str) -> frozenset[str]:
    """Roles the role table admits on ``method path`` (as the OpenAPI document spells it)."""
    return _ROLE_INDEX[(method.upper(), path)]


@dataclass
class Tally:
    """What a fuzz run reached: cases, statuses, 2xx per operation and role, failures."""

    cases: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    operations: set[str] = field(default_factory=set)
    ok: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    failures: Counter[str] = field(default_factory=Counter)
    turn: Counter[str] = field(default_factory=Counter)

    def next_turn(self, label: str) -> int:
        self.turn[label] += 1
        return self.turn[label] - 1

    @staticmethod
    def role_for(turn: int) -> str:
        """Every other case as admin, the rest cycling through the other roles."""
        return "admin" if turn % 2 == 0 else OTHERS[(turn // 2) % len(OTHERS)]

    def summary(self) -> dict[str, Any]:
        reached = sorted(op for op in self.operations if self.ok.get(op))
        return {
            "operations": len(self.operations),
            "operations_2xx": len(reached),
            "never_2xx": sorted(self.operations - set(reached)),
            "cases": self.cases,
            "failures": sum(self.failures.values()),
            "failed_operations": dict(self.failures),
            "statuses": dict(sorted(self.statuses.items())),
            "roles_2xx": dict(
                sorted(Counter(r for c in self.ok.values() for r in c.elements()).items())
            ),
        }

    def report(self) -> str:
        s = self.summary()
        lines = [
            f"fuzz: {s['operations_2xx']} of {s['operations']} operations reached a 2xx; "
            f"{s['cases']} cases; {s['failures']} failures",
            f"  statuses {s['statuses']}; 2xx by role {s['roles_2xx']}",
        ]
        if s["never_2xx"]:
            lines.append(f"  never a 2xx: {', '.join(s['never_2xx'])}")
        if s["failed_operations"]:
            lines.append(f"  failed: {s['failed_operations']}")
        out = os.environ.get("PAIRREG_FUZZ_REPORT")
        if out:
            Path(out).write_text(json.dumps(s, indent=2) + "\n")
        return "\n".join(lines)


def spare_own_tokens(case: schemathesis.Case, protected: frozenset[str]) -> None:
    """Revoking the fuzzer's own tokens would turn the rest of the run into 401s."""
    if case.operation.method.upper() == "DELETE" and case.operation.path == "/v1/tokens/{name}":
        name = (case.path_parameters or {}).get("name")
        if name in protected:
            case.path_parameters = {**(case.path_parameters or {}), "name": VICTIMS[0]}


def _pick(values: list[Any], turn: int) -> Any:
    return values[(turn // 4) % len(values)]


def _body(case: schemathesis.Case) -> dict[str, Any] | None:
    return case.body if isinstance(case.body, dict) else None


def _steer_store_measurement(case: schemathesis.Case, seeded: Seeded, turn: int) -> None:
    if (body := _body(case)) is not None:
        body.update(seeded.measure)


def _running(seeded: Seeded, share: int, turn: int) -> int:
    """One of the jobs leased to the fuzzer's worker: each of complete, fail and renew
    has its own third, so one finishing them does not starve the others."""
    jobs = seeded.values["running"]
    third = len(jobs) // 3
    return int(_pick(jobs[share * third : (share + 1) * third], turn))


def _steer_complete_job(case: schemathesis.Case, seeded: Seeded, turn: int) -> None:
    if (body := _body(case)) is not None:
        body["worker"] = WORKER
        body["result"] = {"result": RESULT, "suite_digest": "cd" * 32, "runner_version": "9.9"}
    case.path_parameters = {"id": _running(seeded, 0, turn)}


def _steer_fail_job(case: schemathesis.Case, seeded: Seeded, turn: int) -> None:
    if (body := _body(case)) is not None:
        body["worker"] = WORKER
    case.path_parameters = {"id": _running(seeded, 1, turn)}


def _steer_renew(case: schemathesis.Case, seeded: Seeded, turn: int) -> None:
    if (body := _body(case)) is not None:
        body["worker"] = WORKER
    case.path_parameters = {"id": _running(seeded, 2, turn)}


def _steer_register_pair(case: schemathesis.Case, seeded: Seeded, turn: int) -> None:
    if (body := _body(case)) is not None:
        body.update(target=_pick(["acme/t@v1", "acme/t@v2"], turn), draft="acme/d@v1")
        body.update(method="draft_model", options={})


def _steer_prometheus(case: schemathesis.Case, seeded: Seeded, turn: int) -> None:
    case.body = VLLM_METRICS
    case.query = {**(case.query or {}), "deployment": _pick(seeded.values["deployments"], turn)}


def _steer_ingest(case: schemathesis.Case, seeded: Seeded, turn: int) -> None:
    body = _body(case)
    for tag in (body or {}).get("tags") or []:
        if isinstance(tag, dict):
            tag["deployment"] = _pick(seeded.values["deployments"], turn)
            tag["pair_digest"] = None


def _steer_promote(case: schemathesis.Case, seeded: Seeded, turn: int) -> None:
    case.path_parameters = {"deployment": _pick(["staging", "prod"], turn)}
    if (body := _body(case)) is not None:
        body.update(pair=_pick(seeded.values["promotable"], turn), reason="fuzz")
        body.pop("expect_version", None)


def _steer_rollback(case: schemathesis.Case, seeded: Seeded, turn: int) -> None:
    case.path_parameters = {"deployment": "staging"}
    if (body := _body(case)) is not None:
        body.pop("expect_version", None)


def _steer_spare_pair(case: schemathesis.Case, seeded: Seeded, turn: int) -> None:
    case.path_parameters = {"ref": _pick(seeded.values["spare_pairs"], turn)}


def _steer_verify(case: schemathesis.Case, seeded: Seeded, turn: int) -> None:
    case.path_parameters = {"ref": _pick(["acme/t@v1", "acme/d@v1", "acme/t@v2"], turn)}
    if (body := _body(case)) is not None:
        body.pop("path", None)  # its own recorded copy


def _steer_proposal(case: schemathesis.Case, seeded: Seeded, turn: int) -> None:
    case.query = {**(case.query or {}), "draft": "acme/h@v1"}


def _steer_flag(case: schemathesis.Case, seeded: Seeded, turn: int) -> None:
    case.path_parameters = {"id": _pick(seeded.values["flags_ack"], turn)}


def _steer_export(case: schemathesis.Case, seeded: Seeded, turn: int) -> None:
    case.query = {**(case.query or {}), "deployment": "hub"}


def _steer_approve(case: schemathesis.Case, seeded: Seeded, turn: int) -> None:
    case.path_parameters = {"ref": "acme/rc@v1"}  # the artifact that ships its own code


def _steer_worker_key(case: schemathesis.Case, seeded: Seeded, turn: int) -> None:
    if (body := _body(case)) is not None:
        body.update(token="gpu-1", public_key=secrets.token_hex(32))  # a new key each time


# Operations whose inputs no schema describes well enough for random data to pass (a stored
# measurement's counters, a Prometheus scrape, a lease held by a named worker, a pair that
# passed its gates): a quarter of their positive cases are steered onto values that do.
STEERS = {
    "store_measurement": _steer_store_measurement,
    "complete_job": _steer_complete_job,
    "renew_lease": _steer_renew,
    "fail_job": _steer_fail_job,
    "register_pair": _steer_register_pair,
    "ingest_prometheus": _steer_prometheus,
    "ingest_requests": _steer_ingest,
    "promote": _steer_promote,
    "rollback": _steer_rollback,
    "ack_flag": _steer_flag,
    "propose_pair": _steer_proposal,
    "verify_artifact": _steer_verify,
    "deprecate_pair": _steer_spare_pair,
    "retire_pair": _steer_spare_pair,
    "export_serving": _steer_export,
    "approve_remote_code": _steer_approve,
    "register_worker_key": _steer_worker_key,
}


def steer(case: schemathesis.Case, seeded: Seeded, turn: int) -> None:
    """Steer an admin turn's positive case (every fourth case of an operation) onto values
    that pass; negative cases are left alone, so what they expect (a 4xx) still holds."""
    if turn % 4 or case.meta is None or case.meta.generation.mode is not GenerationMode.POSITIVE:
        return
    fix = STEERS.get(str(case.operation.definition.raw.get("operationId")))
    if fix is not None:
        fix(case, seeded, turn)
