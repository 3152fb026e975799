"""One contract per operation: the embedded backend and the HTTP client agree on every one.

Two fresh registries get the same scripted sequence of calls, one through the embedded
``LocalBackend`` and one through ``PairregClient`` over the app's generated routes; every
result (or error: kind and field) must be equal once times, secrets and signatures are set
aside. The script must call every declared operation, so a new operation without a scenario
line fails here. The contract's own invariants are checked too: the typed interface is
current, and every /v1 route comes from a declaration.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from pydantic import BaseModel

from api.app import create_app
from api.client import PairregClient
from api.route_index import iter_routes
from registry.contract import generate
from registry.contract.local import LocalBackend
from registry.contract.operations import BY_NAME, OPERATIONS
from registry.errors import PairregError
from registry.governance.policy import measurement_settings
from registry.services.system import initialise, read_credentials
from registry.settings import Settings
from tests.economics.helpers import safetensors_bytes
from tests.fixtures import write_fake_model

# Values that differ between two runs of the same script by nature, not by contract.
VOLATILE = {
    "registered_at",
    "created_at",
    "updated_at",
    "occurred_at",
    "at",
    "finished_at",
    "lease_expires_at",
    "last_used_at",
    "revoked_at",
    "status_changed_at",
    "signed_at",
    "signature",
    "public_key",
    "secret",
    "checkpoint",
    "received_at",
    "merkle_root",
    "leaf_hash",
    "proof",
    "root",
    "bundle_digest",
    "entry_hash",
    "payload_digest",
    "hash",
    # the transparency log: each registry has its own key (so origin and notes differ) and
    # its own event times (so every root and path differs)
    "note",
    "origin",
    "verifier_key",
    "root_hash",
    "old_root",
    "new_root",
    "leaf_data",
    "path",
    "horizon",
}


# One serving time for both runs of the scenario (tag digests cover it), after the
# scenario's promotions, so a pair is live then: not a fixed date, which a later run of the
# suite would pass (a fixed 2026-12-01 12:00 made every run after that day fail).
SERVED = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)


def normalise(value: Any) -> Any:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, dict):
        return {
            k: ("<volatile>" if k in VOLATILE or k.endswith("_at") else normalise(v))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [normalise(v) for v in value]
    return json.loads(json.dumps(value, default=str))


def first_difference(a: Any, b: Any, where: str = "") -> str | None:
    """Where two normalised values first differ, and how (for a readable failure)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            found = first_difference(a.get(key), b.get(key), f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{where or '.'}: embedded {a!r} != remote {b!r}"


class Recorder:
    """Calls operations on a backend, recording each outcome (result or error) by name."""

    def __init__(self, backend: Any):
        self.backend = backend
        self.log: list[tuple[str, Any]] = []
        self.called: set[str] = set()

    def __call__(self, _op: str, /, **kwargs: Any) -> Any:
        self.called.add(_op)
        try:
            result = getattr(self.backend, _op)(**kwargs)
        except PairregError as exc:
            self.log.append((_op, {"error": exc.kind, "field": exc.field}))
            return None
        self.log.append((_op, normalise(result)))
        return result


VLLM_METRICS = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{model_name="m",engine="0"} 100
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{model_name="m",engine="0"} 400
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{model_name="m",engine="0"} 300
"""

# A draft in the speculators format, naming its verifier (by name only, as published).
SPECULATORS_EAGLE3 = {
    "speculators_model_type": "eagle3",
    "speculators_version": "0.1.0",
    "speculators_config": {
        "algorithm": "eagle3",
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": "acme/t", "architectures": ["LlamaForCausalLM"]},
    },
}

RESULT = {
    "categories": {
        "code": {"prompts": 2, "alpha": 0.8, "alpha_ci": [0.7, 0.9], "tau": 3.0},
    },
    "overall": {"prompts": 2, "alpha": 0.8, "alpha_ci": [0.7, 0.9], "tau": 3.0,
                "draft_acceptance_rate": 0.6, "per_position": [0.8, 0.6, 0.4, 0.3],
                "per_position_conditional": [0.8, 0.75, 0.67, 0.75]},
    "prompts": [
        {"id": "c1", "category": "code", "output_ids": [1, 2, 3], "steps": 1, "drafted": 4,
         "accepted": 3, "rejections": 1, "target_calls": 2, "emitted": 4},
        {"id": "c2", "category": "code", "output_ids": [1, 2], "steps": 1, "drafted": 4,
         "accepted": 2, "rejections": 1, "target_calls": 2, "emitted": 3},
    ],
    "settings": {},
}  # fmt: skip


def scenario(call: Recorder, models: dict[str, Path]) -> None:
    """Every operation at least once, in an order that builds what the next one needs."""
    call("add_artifact", source=str(models["t1"]), name="acme/t", role="target")
    call("add_artifact", source=str(models["d"]), name="acme/d", role="draft")
    call("add_artifact", source=str(models["t2"]), name="acme/t", role="target")
    call("add_artifact", source=str(models["heads"]), name="acme/h", role="heads")
    call("add_artifact", source="/nonexistent/dir", name="acme/x", role="target")
    call("add_artifact", source=str(models["rc"]), name="acme/rc", role="target")
    call("approve_remote_code", ref="acme/rc@v1", reason="code reviewed")
    call("list_artifacts", role="target")
    call("get_artifact", ref="acme/t@v1")
    call("verify_artifact", ref="acme/t@v1")
    call("verify_artifact", ref="acme/d@v1", path=str(models["d_changed"]))
    # The changed copy of the draft opened an integrity flag; closing it unblocks pairs.
    flags = call("list_flags", kind="integrity")
    call("get_flag", id=flags.items[0].id)
    call("ack_flag", id=flags.items[0].id, reason="known local edit")
    call("resolve_flag", id=flags.items[0].id, reason="restored")

    a = call("register_pair", target="acme/t@v1", draft="acme/d@v1", method="draft_model", k=4)
    b = call("register_pair", target="acme/t@v2", draft="acme/d@v1", method="draft_model", k=4)
    call("register_pair", target="acme/t@v1", method="prompt_lookup", k=3)
    call("register_pair", target="acme/t@v1", method="draft_model", k=0)
    call("list_pairs", method="draft_model")
    call("get_pair", ref=a.pair.pair_digest)
    pa, pb = a.pair.pair_digest, b.pair.pair_digest

    # The scenario stores its measurements itself (self-reported), so its policy trusts them.
    call("put_policy", text='name = "loose"\n[alpha]\nmin_overall = 0.1\n'
         '[trust]\nmeasurements = ["job", "local", "http"]\n')  # fmt: skip
    call("list_policies")
    call("get_policy", name="loose")
    call("create_deployment", name="prod", policy="loose")
    call("list_deployments")
    call("set_deployment_policy", name="prod", policy="loose")

    # A measurement taken outside a job, reused by validation (same runner version).
    settings = measurement_settings(a.pair.config, {})  # what the loose policy asks for
    m = call("store_measurement", pair=pa, suite_name="default", suite_digest="ab" * 32,
             settings=settings, runner_version="9.9", result=RESULT)  # fmt: skip
    call("list_measurements", pair=pa)
    call("get_measurement", id=m.id, prompts=False)
    call("verify_measurement", id=m.id)  # unsigned: reported, not an error
    v = call("validate_pair", ref=pa, policy="loose", runner_version="9.9")
    call("list_validations", pair=pa)
    call("get_validation", id=v.validation.id)
    call("set_validation_run", id=v.validation.id, mlflow_run_id="run-1")

    # Jobs: a queued validation measured by a worker, another failed.
    q = call("validate_pair", ref=pb, policy="loose")
    job = call("claim_job", worker="w1", lease_seconds=30, runner_version="9.9")
    call("renew_lease", id=job.id, worker="w1", lease_seconds=30)
    call("list_jobs", state="running")
    call("get_job", id=q.job.id)
    call("complete_job", id=job.id, worker="w1",
         result={"result": RESULT, "suite_digest": "cd" * 32, "runner_version": "9.9"})  # fmt: skip
    call("fail_job", id=job.id, worker="w2", error="late")
    call("claim_job", worker="w1")

    call("promote", ref=pa, deployment="prod", reason="first release")
    call("promote", ref=pb, deployment="prod", reason="second release")
    call("get_deployment", name="prod")
    call("deployment_at", name="prod", at=datetime.now(UTC) + timedelta(days=1))
    call("rollback", deployment="prod", reason="back to a")

    m2 = call("store_measurement", pair=pb, suite_name="default", suite_digest="ab" * 32,
              settings=settings, runner_version="9.9", result=RESULT)  # fmt: skip
    call("check_drift", candidate=pb, baseline_measurement=m.id, candidate_measurement=m2.id,
         policy="loose")  # fmt: skip
    call("watch")

    served = SERVED
    tags = [{"request_id": f"r-{i}", "deployment": "prod", "served_at": served,
             "input_tokens": 5, "output_tokens": 7} for i in range(3)]  # fmt: skip
    call("ingest_requests", tags=tags)
    call("ingest_requests", tags=tags)
    call("list_requests", deployment="prod", limit=2)
    call("audit_request", request_id="r-1")
    call("build_bundle", request_id="r-1")
    call("ingest_prometheus", deployment="prod", text=VLLM_METRICS, min_drafted=10)
    call("deployment_online_alpha", name="prod", bucket_seconds=3600)
    call("export_serving", deployment="prod", engine="vllm")
    call("propose_pair", draft="acme/h@v1")
    call("export_speculators", pair=pa)
    call("list_hardware")
    call("pair_economics", pair=pa, hardware="l4", batch=[1, 8, 64], context=512, price=0.8,
         compare=pb)  # fmt: skip
    call("k_schedule", pair=pa, hardware="l4", max_batch=64, context=512)
    curve = call("export_acceptance_curve", pair=pa)
    call("import_acceptance_curve", curve=curve)
    call("maintain_partitions", ahead=1)

    call("deprecate_pair", ref=pb, reason="superseded")
    call("retire_pair", ref=pb, reason="gone")
    call("create_webhook", name="ci", url="https://ci.example.com/hook", events=["flag.opened"])
    call("list_webhooks")
    call("get_webhook", name="ci")
    call("disable_webhook", name="ci")
    call("enable_webhook", name="ci")
    call("list_webhook_deliveries", name="ci")
    call("map_mlflow_model", registered_model="chat", lineage="acme/t", aliases=["champion"])
    call("list_mlflow_sources")
    call("list_mlflow_deliveries")
    call("create_token", name="ci", role="ingest")
    call("create_token", name="gpu-1", role="worker")
    call("register_worker_key", token="gpu-1", public_key=WORKER_PUBLIC_KEY)
    call("list_worker_keys", token="gpu-1")
    call("list_tokens")
    call("whoami")
    call("revoke_token", name="ci")
    call("list_audit_events", action="pair.status_changed")
    call("sign_log_checkpoint")
    call("get_log_checkpoint")
    call("prove_inclusion", seq=2)
    call("prove_consistency", old_size=1)
    call("verify_audit_log")
    call("get_retention")
    call("set_retention", kind="request_tags", months=7)
    # Embedded only (an archive is written where the command runs); last, as it adds events.
    call("archive_requests", before=date(2027, 1, 1), directory=str(models["archive"]))
    call("get_archived_request", directory=str(models["archive"]), request_id="r-1")


HEADS = {"num_attention_heads": 4, "num_key_value_heads": 2}
# A fixed worker key, so both registries record the same one.
WORKER_PUBLIC_KEY = (
    Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    .public_key()
    .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    .hex()
)


def _st(rows: int) -> bytes:
    """Weights as a real safetensors file, so pair economics can read its header."""
    return safetensors_bytes({"w": ("F32", [rows, 64])})


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    return {
        "t1": write_fake_model(tmp_path / "models" / "t1", weights=_st(64), config_extra=HEADS),
        "t2": write_fake_model(tmp_path / "models" / "t2", weights=_st(65), config_extra=HEADS),
        "d": write_fake_model(tmp_path / "models" / "d", hidden_size=32, weights=_st(16)),
        "d_changed": write_fake_model(tmp_path / "models" / "dx", hidden_size=32, weights=_st(17)),
        "heads": write_fake_model(
            tmp_path / "models" / "h", weights=b"h", config_extra=SPECULATORS_EAGLE3
        ),
        "rc": write_fake_model(
            tmp_path / "models" / "rc",
            weights=_st(8),
            config_extra={"auto_map": {"AutoModelForCausalLM": "modeling_x.X"}},
        ),
        "archive": tmp_path / "archive",
    }


def _home(root: Path) -> Settings:
    settings = Settings(home=root / "home", database_url=f"sqlite:///{root / 'registry.db'}")
    initialise(settings)
    return settings


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[tuple[Settings, Callable[[], PairregClient]]]:
    settings = _home(tmp_path / "remote")
    token = (read_credentials(settings.credentials_path) or {})["token"]
    with TestClient(create_app(settings), raise_server_exceptions=True) as http:
        http.headers["Authorization"] = f"Bearer {token}"

        def client() -> PairregClient:
            c = PairregClient("http://testserver")
            c.http = http
            return c

        yield settings, client


def test_local_and_remote_agree_on_every_operation(
    tmp_path: Path, models: dict[str, Path], remote: Any
) -> None:
    # The embedded side acts as a remote caller too (``remote=True``): both then record
    # their self-reported measurement the same way (``produced_via``), as the contract says.
    local = Recorder(LocalBackend(_home(tmp_path / "local"), "token:admin", remote=True))
    over_http = Recorder(remote[1]())
    scenario(local, models)
    scenario(over_http, models)
    declared = {op.name for op in OPERATIONS}
    assert local.called == declared, f"no scenario line for {sorted(declared - local.called)}"
    assert len(local.log) == len(over_http.log)
    for (name, mine), (_, theirs) in zip(local.log, over_http.log, strict=True):
        if BY_NAME[name].path is None:  # embedded only: the client refuses it, naming why
            assert theirs == {"error": "invalid", "field": "url"}, theirs
            continue
        assert mine == theirs, f"{name}: {first_difference(mine, theirs)}"
    errors = [(n, out) for n, out in local.log if isinstance(out, dict) and "field" in out]
    # The script's deliberate refusals, and nothing else.
    assert errors == [
        ("add_artifact", {"error": "invalid", "field": "source"}),
        ("register_pair", {"error": "invalid", "field": "k"}),
    ], errors


def test_typed_interface_is_current() -> None:
    assert generate.main(["--check"]) == 0, "run python -m registry.contract.generate"


def test_every_v1_route_comes_from_a_declaration() -> None:
    app = create_app(Settings(database_url="sqlite:///:memory:"))
    declared = {(op.method, op.path) for op in OPERATIONS if op.path}
    declared |= {("GET", op.path) for op in OPERATIONS if op.also_get}
    serving = {("POST", "/v1/completions"), ("POST", "/v1/chat/completions")}
    serving.add(("POST", "/v1/mlflow/webhook"))  # signed by MLflow, not a bearer-token call
    for route in iter_routes(app):
        if not route.path.startswith("/v1/"):
            continue
        for method in route.methods - {"HEAD"}:
            assert (method, route.path) in declared | serving, (method, route.path)
