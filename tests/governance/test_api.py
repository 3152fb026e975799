"""Remote mode: the same flow through the HTTP API and the remote client, worker included."""

from __future__ import annotations

import pytest

from api.client import PairregClient
from cli.worker import make_worker
from registry.errors import Conflict
from tests.api.conftest import api  # noqa: F401 - re-exported pytest fixture
from tests.governance.conftest import POLICY

pytestmark = pytest.mark.slow


def _client(env) -> PairregClient:  # type: ignore[no-untyped-def]
    """The remote client over the in-process app (TestClient is an httpx.Client)."""
    c = PairregClient("http://testserver", token=None)
    c.http = env.client
    c.http.headers.update(env.auth("admin"))
    return c


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_remote_validate_promote_flow(api, tiny, no_mlflow) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    c = _client(api)
    assert c.put_policy(text=POLICY.read_text()).policy.name == "tiny"
    t = c.add_artifact(source=tiny.target_v1, name="tiny/target-v1", role="target").artifact
    d = c.add_artifact(source=tiny.draft, name="tiny/draft", role="draft").artifact
    pair = c.register_pair(target=t.ref, draft=d.ref, method="draft_model", k=4).pair
    c.create_deployment(name="prod", policy="tiny")

    res = c.validate_pair(ref=pair.pair_digest, deployment="prod")
    assert res.state == "queued" and res.job is not None
    assert make_worker(c, name="remote-w").work(once=True) == 1
    job = c.get_job(id=res.job.id)
    assert job.state == "done" and job.result and job.result["passed"] is True
    res = c.validate_pair(ref=pair.pair_digest, deployment="prod")
    assert res.state == "done" and res.validation and res.validation.passed

    denied = api.client.post(
        "/v1/deployments/prod/promote",
        json={"pair": pair.pair_digest, "reason": "x"},
        headers=api.auth("reader"),
    )
    assert denied.status_code == 403
    out = c.promote(ref=pair.pair_digest, deployment="prod", reason="remote release")
    assert out.deployment.current_pair_digest == pair.pair_digest
    with pytest.raises(Conflict, match="already live"):
        c.promote(ref=pair.pair_digest, deployment="prod", reason="again")
    dep = c.get_deployment(name="prod")
    assert dep.history and dep.history[0].reason == "remote release"
    at = c.deployment_at(name="prod", at=dep.history[0].at)
    assert at is not None and at.to_pair_digest == pair.pair_digest
    r = api.client.post(
        "/v1/deployments/prod/promote", json={"pair": pair.pair_digest}, headers=api.auth()
    )
    assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json")
