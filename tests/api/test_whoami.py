"""``whoami``: each token learns its own role and the capability groups that role holds."""

from __future__ import annotations

import json

from registry.governance import roles
from tests.api.conftest import ApiEnv, run_cli


def test_each_role_sees_its_own_capabilities(api: ApiEnv) -> None:
    for role in roles.ROLES:
        body = api.client.get("/v1/whoami", headers=api.auth(role)).json()
        assert body["role"] == role
        assert body["actor"] == f"token:{body['token']}"
        if role != "admin":
            assert body["token"] == f"t-{role}"
        expected = {name for name, admitted in roles.CAPABILITIES.items() if role in admitted}
        assert set(body["capabilities"]) == expected
    reader = api.client.get("/v1/whoami", headers=api.auth("reader")).json()
    assert "govern" not in reader["capabilities"] and "read_audit" not in reader["capabilities"]
    promoter = api.client.get("/v1/whoami", headers=api.auth("promoter")).json()
    assert "govern" in promoter["capabilities"]
    assert api.client.get("/v1/whoami").status_code == 401


def test_cli_whoami_embedded_is_the_local_user_as_admin(sqlite_home) -> None:  # type: ignore[no-untyped-def]
    out = run_cli("token", "whoami", "--json")
    assert out.exit_code == 0, out.output
    me = json.loads(out.output)
    assert me["token"] is None and me["role"] == "admin"
    assert set(me["capabilities"]) == set(roles.CAPABILITIES)
    text = run_cli("token", "whoami")
    assert text.exit_code == 0 and "(embedded): role admin" in text.output


def test_mlflow_ui_is_offered_only_for_a_tracking_server(api: ApiEnv) -> None:
    assert api.client.get("/v1/whoami", headers=api.auth()).json()["mlflow_ui"] is None
    api.app.state.settings = api.settings.model_copy(
        update={"mlflow_tracking_uri": "http://mlflow.internal:5000/"}
    )
    body = api.client.get("/v1/whoami", headers=api.auth("reader")).json()
    assert body["mlflow_ui"] == "http://mlflow.internal:5000"


def test_mlflow_ui_never_carries_credentials(api: ApiEnv) -> None:
    """A tracking URI with userinfo or a token in its query is shown without them."""
    for uri, shown in [
        ("https://svc:s3cr3t@mlflow.internal:5000/", "https://mlflow.internal:5000"),
        ("https://tok3n@mlflow.internal/base/?token=s3cr3t#x", "https://mlflow.internal/base"),
        ("http://[::1]:5000", "http://[::1]:5000"),
    ]:
        api.app.state.settings = api.settings.model_copy(update={"mlflow_tracking_uri": uri})
        resp = api.client.get("/v1/whoami", headers=api.auth("reader"))
        assert resp.json()["mlflow_ui"] == shown
        assert "s3cr3t" not in resp.text and "tok3n" not in resp.text
