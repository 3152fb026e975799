"""Separation of duties (issue: no role can move its own gates), over HTTP with each role's
real token and embedded, as an adversary holding the registrar's token.

* policy text reaches the store only from policy authors, wherever it arrives;
* a self-reported measurement over HTTP never opens a gate by default (the attack: α 0.99
  posted by a registrar with a made-up runner version, then validate);
* remote model code runs only after an admin approves its exact bytes, and only in a worker
  that holds nothing but its token;
* workers sign their results and anyone verifies them offline;
* four-eyes promotion where the policy asks for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from sqlalchemy import select

from api.client import PairregClient
from registry.contract.local import LocalBackend
from registry.db import session_scope
from registry.errors import Forbidden, InvalidInput
from registry.jobloop import Worker, isolation_problems
from registry.services import policies, validation
from registry.settings import Settings
from registry.tables import AuditEvent, Measurement, Policy
from registry.trust.measurement_signing import verify_record
from tests.api.conftest import ApiEnv, api  # noqa: F401 - re-exported pytest fixture
from tests.governance.helpers import add_model, settings_for, synthetic_result

AUTO_MAP = {"auto_map": {"AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}}
LOWERED = 'name = "default"\n[alpha]\nmin_overall = 0.0\nmin_per_category = 0.0\n'


def _client(env: ApiEnv, role: str) -> PairregClient:
    """The remote client over the in-process app, holding ``role``'s real token."""
    c = PairregClient("http://testserver")
    http = TestClient(env.app, raise_server_exceptions=False)
    http.headers.update(env.auth(role))
    c.http = http
    return c


def _pair(env: ApiEnv, tmp: Path, role: str = "registrar", *, target_extra: Any = None) -> str:
    """A pair registered over HTTP by ``role`` (artifacts added on the host)."""
    url = env.settings.db_url
    t = add_model(
        url, tmp, "acme/t", "target", b"t-" + tmp.name.encode(), config_extra=target_extra
    )
    d = add_model(url, tmp, "acme/d", "draft", b"d-1", hidden_size=32)
    r = env.client.post(
        "/v1/pairs",
        json={"target": str(t), "draft": str(d), "method": "draft_model", "k": 4},
        headers=env.auth(role),
    )
    assert r.status_code in (200, 201), r.text
    return r.json()["pair"]["pair_digest"]


def _events(env: ApiEnv, action: str) -> list[AuditEvent]:
    with session_scope(env.settings.db_url) as s:
        rows = list(s.scalars(select(AuditEvent).where(AuditEvent.action == action)))
        s.expunge_all()
        return rows


def _policy_versions(env: ApiEnv, name: str) -> int:
    with session_scope(env.settings.db_url) as s:
        return len(list(s.scalars(select(Policy.id).where(Policy.name == name))))


# -- 1. policy text is stored only by policy authors -------------------------------------


def test_registrar_cannot_store_policy_text_through_validate(api: ApiEnv, tmp_path: Path) -> None:  # noqa: F811
    digest = _pair(api, tmp_path)
    api.client.get("/v1/policies/default", headers=api.auth("reader"))  # stores the default
    before = _policy_versions(api, "default")
    r = api.client.post(
        f"/v1/pairs/{digest}/validate", json={"policy_text": LOWERED}, headers=api.auth("registrar")
    )
    assert r.status_code == 403, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["kind"] == "forbidden" and body["field"] == "policy_text"
    assert "policy text is stored only by policy authors" in body["detail"]
    assert _policy_versions(api, "default") == before  # nothing written
    refused = _events(api, "duty.refused")
    assert [e.actor for e in refused] == ["token:t-registrar"]
    assert "policy text is stored only by policy authors" in refused[0].payload
    # A policy author may send policy text to validate.
    ok = api.client.post(
        f"/v1/pairs/{digest}/validate", json={"policy_text": LOWERED}, headers=api.auth("promoter")
    )
    assert ok.status_code in (200, 202), ok.text
    assert _policy_versions(api, "default") == before + 1


def test_policy_text_rule_embedded(home: Settings, tmp_path: Path) -> None:
    """The rule lives in the service: a token actor without the duty is refused there too;
    the embedded registry's own user (no token) holds every duty."""
    url = home.db_url
    t = add_model(url, tmp_path, "acme/t", "target", b"t-1")
    d = add_model(url, tmp_path, "acme/d", "draft", b"d-1", hidden_size=32)
    owner = LocalBackend(home, "alice")
    pair = owner.register_pair(target=str(t), draft=str(d), method="draft_model", k=4).pair
    owner.create_token(name="reg", role="registrar")
    with pytest.raises(Forbidden, match="policy authors"), session_scope(url) as s:
        validation.validate_pair(s, ref=pair.pair_digest, policy_text=LOWERED, actor="token:reg")
    with session_scope(url) as s:
        assert policies.policy_in_force(s, "default") is None
    owner.validate_pair(ref=pair.pair_digest, policy_text=LOWERED)
    with session_scope(url) as s:
        stored = policies.policy_in_force(s, "default")
        assert stored is not None and stored.created_by == "alice"


# -- 3. provenance: a self-reported result never opens a gate by default -----------------


def _report_body(env: ApiEnv, digest: str) -> dict[str, Any]:
    return {
        "pair": digest,
        "suite_name": "default",
        "suite_digest": "f" * 64,
        "settings": settings_for(env.settings.db_url, digest, "default"),
        "runner_version": "fake-1",
        "result": synthetic_result({"code": 0.99, "chat": 0.99}, tokens=60),
    }


def _self_report(env: ApiEnv, digest: str, role: str) -> dict[str, Any]:
    body = _report_body(env, digest)
    r = env.client.post("/v1/measurements", json=body, headers=env.auth(role))
    assert r.status_code == 201, r.text
    return r.json()


def test_self_reported_measurement_does_not_pass_a_gate(api: ApiEnv, tmp_path: Path) -> None:  # noqa: F811
    """The attack: a registrar posts α 0.99 with runner_version fake-1, then validates."""
    digest = _pair(api, tmp_path)
    m = _self_report(api, digest, "registrar")
    assert m["produced_via"] == "http" and m["created_by"] == "token:t-registrar"
    for claim in ({"via": "local"}, {"produced_via": "job"}, {"job_id": 1}):
        body = {**_report_body(api, digest), **claim}
        r = api.client.post("/v1/measurements", json=body, headers=api.auth("registrar"))
        assert r.status_code == 422, (claim, r.status_code)  # provenance is not the caller's
    assert m["alpha"] > 0.95
    r = api.client.post(
        f"/v1/pairs/{digest}/validate",
        json={"runner_version": "fake-1"},
        headers=api.auth("registrar"),
    )
    assert r.status_code == 202, r.text  # not reused: a worker must measure
    out = r.json()
    assert out["state"] == "queued" and out["validation"] is None
    assert out["pair_status"] == "registered"
    assert api.client.get(f"/v1/pairs/{digest}", headers=api.auth()).json()["status"] != (
        "validated"
    )


def test_trust_section_opts_in_and_the_gate_names_provenance(api: ApiEnv, tmp_path: Path) -> None:  # noqa: F811
    """A policy may choose to trust self-reports; the gate records how the numbers came."""
    digest = _pair(api, tmp_path)
    _self_report(api, digest, "registrar")
    text = LOWERED.replace('"default"', '"selfreport"') + (
        '[trust]\nmeasurements = ["job", "local", "http"]\n'
    )
    r = api.client.post("/v1/policies", json={"text": text}, headers=api.auth("promoter"))
    assert r.status_code == 201, r.text
    body = {"policy": "selfreport", "runner_version": "fake-1"}
    # the measurement's settings follow the suite, which both policies share
    r = api.client.post(f"/v1/pairs/{digest}/validate", json=body, headers=api.auth("registrar"))
    assert r.status_code == 200, r.text
    gates = {g["name"]: g for g in r.json()["validation"]["gates"]}
    assert gates["measurement.trust"]["passed"] is True
    assert gates["measurement.trust"]["measured"] == "http"
    assert "self-reported over HTTP by token:t-registrar" in gates["measurement.trust"]["detail"]
    bad = api.client.post(
        "/v1/policies",
        json={"text": 'name = "x"\n[trust]\nmeasurements = ["anyone"]\n'},
        headers=api.auth("promoter"),
    )
    assert bad.status_code == 422 and bad.json()["field"] == "trust.measurements"


def test_local_owner_measurement_is_trusted_embedded(home: Settings, tmp_path: Path) -> None:
    """Embedded: the registry's own user (`pairreg measure`) is trusted by default."""
    url = home.db_url
    t = add_model(url, tmp_path, "acme/t", "target", b"t-1")
    d = add_model(url, tmp_path, "acme/d", "draft", b"d-1", hidden_size=32)
    owner = LocalBackend(home, "alice")
    digest = owner.register_pair(target=str(t), draft=str(d), method="draft_model", k=4)
    digest = digest.pair.pair_digest
    m = owner.store_measurement(
        pair=digest,
        suite_name="default",
        suite_digest="f" * 64,
        settings=settings_for(url, digest, "default"),
        runner_version="local-1",
        result=synthetic_result({"code": 0.9}, tokens=60),
    )
    assert m.produced_via == "local"
    out = owner.validate_pair(ref=digest, runner_version="local-1")
    assert out.state == "done" and out.validation is not None and out.validation.passed
    trust = next(g for g in out.validation.gates if g.name == "measurement.trust")
    assert trust.passed and trust.measured == "local"


# -- 2. remote code: approved per manifest digest by admin, run only isolated -------------


def test_remote_code_needs_admin_approval_of_exact_bytes(api: ApiEnv, tmp_path: Path) -> None:  # noqa: F811
    digest = _pair(api, tmp_path / "v1", "admin", target_extra=AUTO_MAP)
    r = api.client.post(f"/v1/pairs/{digest}/validate", json={}, headers=api.auth("registrar"))
    assert r.status_code == 422 and r.json()["field"] == "ref"
    assert "approve-remote-code" in r.json()["detail"]
    # A policy can no longer grant it by lineage name.
    grant = 'name = "rc"\n[runner]\ntrust_remote_code = ["acme/t"]\n'
    r = api.client.post("/v1/policies", json={"text": grant}, headers=api.auth("admin"))
    assert r.status_code == 422 and r.json()["field"] == "runner.trust_remote_code"

    approve = "/v1/artifacts/acme/t@v1/approve-remote-code"
    for role in ("registrar", "promoter", "worker", "auditor"):
        denied = api.client.post(approve, json={"reason": "x"}, headers=api.auth(role))
        assert denied.status_code == 403, role
    r = api.client.post(approve, json={"reason": "reviewed modeling_custom.py"}, headers=api.auth())
    assert r.status_code == 201, r.text
    again = api.client.post(approve, json={"reason": "again"}, headers=api.auth())
    assert again.status_code == 200 and again.json()["created"] is False
    events = _events(api, "artifact.remote_code_approved")
    assert len(events) == 1 and events[0].actor == "token:admin"
    assert r.json()["manifest_digest"] in events[0].payload

    r = api.client.post(f"/v1/pairs/{digest}/validate", json={}, headers=api.auth("registrar"))
    assert r.status_code == 202, r.text
    job = r.json()["job"]
    assert job["isolated"] is True and job["args"]["settings"]["trust_remote_code"] is True

    # The server's own in-process worker (embedded, beside the key and the database) never
    # takes it, and may not ask to.
    embedded = LocalBackend(api.settings, "worker:host:1:embedded")
    assert embedded.claim_job(worker="embedded") is None
    with pytest.raises(InvalidInput, match="over HTTP"):
        embedded.claim_job(worker="embedded", isolated=True)
    worker = _client(api, "worker")
    assert worker.claim_job(worker="plain") is None
    claimed = worker.claim_job(worker="isolated", isolated=True)
    assert claimed is not None and claimed.id == job["id"]

    # New bytes in the same lineage need their own approval.
    digest2 = _pair(api, tmp_path / "v2", "admin", target_extra=AUTO_MAP)
    r = api.client.post(f"/v1/pairs/{digest2}/validate", json={}, headers=api.auth("registrar"))
    assert r.status_code == 422 and "approve-remote-code" in r.json()["detail"]


def test_isolated_worker_refuses_to_start_beside_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PAIRREG_DATABASE_URL", raising=False)
    clean = Settings(home=tmp_path / "w", url="http://api:8000", token="prt_x")
    assert isolation_problems(clean) == []
    beside = Settings(home=tmp_path / "api", database_url="sqlite:///x.db")
    beside.home_dir.mkdir(parents=True)
    beside.signing_key_path.write_text("key")
    beside.credentials_path.write_text("{}")
    problems = " | ".join(isolation_problems(beside))
    for what in ("PAIRREG_URL", "PAIRREG_TOKEN", "database URL", "signing key", "credentials"):
        assert what in problems


# -- 3b. workers sign their results; verified online and offline -------------------------


class FakeExecutor:
    """Plain numbers instead of a model run (the job loop, signing and storage are real)."""

    runner_version = "fake-exec-1"

    def measure(self, task: Any, progress: Any = None) -> dict[str, Any]:
        return {
            "result": synthetic_result({"code": 0.8, "chat": 0.7}, tokens=60),
            "suite_digest": "e" * 64,
            "runner_version": self.runner_version,
            "settings": task.settings,
            "device": "cpu",
            "mlflow_run_id": None,
        }

    def log_validation(self, validation: Any) -> str | None:
        return None


def test_worker_signs_results_and_anyone_verifies_offline(api: ApiEnv, tmp_path: Path) -> None:  # noqa: F811
    key = Ed25519PrivateKey.generate()
    pub = (
        key.public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        .hex()
    )
    body = {"token": "t-worker", "public_key": pub}
    assert (
        api.client.post("/v1/worker-keys", json=body, headers=api.auth("registrar")).status_code
        == 403
    )
    r = api.client.post("/v1/worker-keys", json=body, headers=api.auth())
    assert r.status_code == 201, r.text
    assert _events(api, "worker_key.registered")

    digest = _pair(api, tmp_path)
    q = api.client.post(f"/v1/pairs/{digest}/validate", json={}, headers=api.auth("registrar"))
    assert q.status_code == 202
    w = Worker(
        backend=_client(api, "worker"),  # type: ignore[arg-type]
        executor=FakeExecutor(),
        signing_key=key,
    )
    assert w.work(once=True) == 1
    job = api.client.get(f"/v1/jobs/{q.json()['job']['id']}", headers=api.auth()).json()
    assert job["state"] == "done", job["error"]
    assert job["result"]["passed"] is True
    mid = job["result"]["measurement_id"]
    m = api.client.get(f"/v1/measurements/{mid}", headers=api.auth("auditor")).json()
    assert m["produced_via"] == "job" and m["job_id"] == job["id"]
    assert m["created_by"] == "token:t-worker"
    assert m["signature"]["key"].startswith("sha256:")

    online = api.client.post(f"/v1/measurements/{mid}/verify", headers=api.auth("auditor"))
    assert online.status_code == 200 and online.json()["ok"] is True, online.text
    assert online.json()["token_name"] == "t-worker"
    assert verify_record(m, pub) == []  # offline: the record and the key, nothing else
    forged = {**m, "prompts": [{**m["prompts"][0], "accepted": 10**6}, *m["prompts"][1:]]}
    assert verify_record(forged, pub) == ["the stored numbers differ from the signed ones"]
    other = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        .hex()
    )
    assert verify_record(m, other) and "signed by key" in verify_record(m, other)[0]

    # Changing a counter in the database is caught by the registry's own check too.
    with session_scope(api.settings.db_url) as s:
        row = s.get(Measurement, mid)
        assert row is not None
        row.prompts = [{**row.prompts[0], "accepted": 0}, *row.prompts[1:]]
    after = api.client.post(f"/v1/measurements/{mid}/verify", headers=api.auth("auditor")).json()
    assert after["ok"] is False and after["problems"]

    # A result signed by a key nobody registered for this token is refused.
    digest2 = _pair(api, tmp_path / "other")
    api.client.post(f"/v1/pairs/{digest2}/validate", json={}, headers=api.auth("registrar"))
    rogue = Worker(
        backend=_client(api, "worker"),
        executor=FakeExecutor(),  # type: ignore[arg-type]
        signing_key=Ed25519PrivateKey.generate(),
    )
    with pytest.raises(InvalidInput, match="not registered"):
        rogue.work(once=True)


# -- 4. four-eyes promotion -----------------------------------------------------------


FOUR_EYES = (
    'name = "fe"\n[alpha]\nmin_overall = 0.1\nmin_per_category = 0.0\n'
    "[governance]\ndistinct_actors = true\n"
)


def _trusted_measurement(env: ApiEnv, digest: str) -> None:
    """A measurement by the registry's own user (trusted by default), stored on the host."""
    owner = LocalBackend(env.settings, "host-operator")
    owner.store_measurement(
        pair=digest,
        suite_name="default",
        suite_digest="f" * 64,
        settings=settings_for(env.settings.db_url, digest, "fe"),
        runner_version="host-1",
        result=synthetic_result({"code": 0.8}, tokens=60),
    )


def test_four_eyes_promotion(api: ApiEnv, tmp_path: Path) -> None:  # noqa: F811
    r = api.client.post("/v1/policies", json={"text": FOUR_EYES}, headers=api.auth("promoter"))
    assert r.status_code == 201, r.text
    dep = {"name": "prod", "policy": "fe"}
    assert api.client.post("/v1/deployments", json=dep, headers=api.auth()).status_code == 201
    digest = _pair(api, tmp_path / "a", "admin")
    _trusted_measurement(api, digest)
    v = api.client.post(
        f"/v1/pairs/{digest}/validate",
        json={"deployment": "prod", "runner_version": "host-1"},
        headers=api.auth("registrar"),
    )
    assert v.status_code == 200 and v.json()["validation"]["passed"], v.text

    promote = {"pair": digest, "reason": "release"}
    # The promoter stored the policy in force; the admin registered the pair.
    for role, clash in (("promoter", "authored the policy"), ("admin", "registered the pair")):
        r = api.client.post("/v1/deployments/prod/promote", json=promote, headers=api.auth(role))
        assert r.status_code == 403, r.text
        assert r.json()["kind"] == "forbidden"
        assert "governance.distinct_actors" in r.json()["detail"] and clash in r.json()["detail"]
    refused = _events(api, "deployment.promote_refused")
    assert [e.actor for e in refused] == ["token:t-promoter", "token:admin"]
    assert all("governance.distinct_actors" in e.payload for e in refused)
    live = api.client.get("/v1/deployments/prod", headers=api.auth()).json()
    assert live["current_pair_digest"] is None

    # A second promoter, who neither registered the pair nor wrote the policy, may.
    api.client.post("/v1/tokens", json={"name": "p2", "role": "promoter"}, headers=api.auth())
    with session_scope(api.settings.db_url) as s:
        from registry.services.tokens import create_token

        secret = create_token(s, name="p3", role="promoter", actor="test").secret
    r = api.client.post(
        "/v1/deployments/prod/promote",
        json=promote,
        headers={"Authorization": f"Bearer {secret}"},
    )
    assert r.status_code == 200, r.text
    moved = _events(api, "deployment.promote")
    assert len(moved) == 1 and "governance.distinct_actors" in moved[0].payload
    assert '"registered_by":"token:admin"' in moved[0].payload


def test_four_eyes_embedded(home: Settings, tmp_path: Path) -> None:
    """Embedded: the same user registering and promoting is refused under the rule."""
    url = home.db_url
    t = add_model(url, tmp_path, "acme/t", "target", b"t-1")
    d = add_model(url, tmp_path, "acme/d", "draft", b"d-1", hidden_size=32)
    alice, bob = LocalBackend(home, "alice"), LocalBackend(home, "bob")
    bob.put_policy(text=FOUR_EYES)
    bob.create_deployment(name="prod", policy="fe")
    digest = alice.register_pair(target=str(t), draft=str(d), method="draft_model", k=4)
    digest = digest.pair.pair_digest
    alice.store_measurement(
        pair=digest,
        suite_name="default",
        suite_digest="f" * 64,
        settings=settings_for(url, digest, "fe"),
        runner_version="local-1",
        result=synthetic_result({"code": 0.8}, tokens=60),
    )
    assert alice.validate_pair(ref=digest, deployment="prod", runner_version="local-1").state == (
        "done"
    )
    with pytest.raises(Forbidden, match="governance.distinct_actors"):
        alice.promote(ref=digest, deployment="prod", reason="mine")
    with pytest.raises(Forbidden, match="authored the policy"):
        bob.promote(ref=digest, deployment="prod", reason="my policy")
    carol = LocalBackend(home, "carol")
    assert carol.promote(ref=digest, deployment="prod", reason="four eyes").deployment


def test_offline_verify_cli(tmp_path: Path) -> None:
    """`pairreg measurement verify --file --key`: no registry, only the record and the key."""
    import json

    from registry.trust.measurement_signing import sign, statement
    from tests.api.conftest import run_cli

    key = Ed25519PrivateKey.generate()
    pub = (
        key.public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        .hex()
    )
    result = synthetic_result({"code": 0.8}, n=3)
    record: dict[str, Any] = {
        "id": 7,
        "pair_digest": "a" * 64,
        "job_id": 3,
        "suite_name": "default",
        "suite_digest": "e" * 64,
        "settings_digest": "b" * 64,
        "runner_version": "r-1",
        "overall": result["overall"],
        "categories": result["categories"],
        "prompts": result["prompts"],
    }
    stmt = statement(
        result=result, **{k: record[k] for k in ("pair_digest", "job_id", "suite_name")},
        suite_digest=record["suite_digest"], settings_digest=record["settings_digest"],
        runner_version=record["runner_version"],
    )  # fmt: skip
    record["signature"] = sign(key, stmt)
    good = tmp_path / "m.json"
    good.write_text(json.dumps(record))
    out = run_cli("measurement", "verify", "--file", str(good), "--key", pub)
    assert out.exit_code == 0 and "verified" in out.output
    record["overall"] = {**record["overall"], "alpha": 0.99}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(record))
    out = run_cli("measurement", "verify", "--file", str(bad), "--key", pub)
    assert out.exit_code == 1 and "differ from the signed ones" in out.output
    out = run_cli("measurement", "verify", "--file", str(good))
    assert out.exit_code == 2 and "--key" in out.output
