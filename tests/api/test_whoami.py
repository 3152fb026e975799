"""``whoami``: each token learns its own role and the capability groups that role holds."""

from __future__ import annotations

from registry import roles
from tests.api.conftest import ApiEnv


def test_each_role_sees_its_own_capabilities(api: ApiEnv) -> None:
    for role in roles.ROLES:
        body = api.client.get("/v1/whoami", headers=api.auth(role)).json()
        assert body["role"] == role
        assert body["token"] == ("t-" + role if role != "admin" else body["token"])
        expected = {name for name, admitted in roles.CAPABILITIES.items() if role in admitted}
        assert set(body["capabilities"]) == expected
    reader = api.client.get("/v1/whoami", headers=api.auth("reader")).json()
    assert "govern" not in reader["capabilities"] and "read_audit" not in reader["capabilities"]
    promoter = api.client.get("/v1/whoami", headers=api.auth("promoter")).json()
    assert "govern" in promoter["capabilities"]
    assert api.client.get("/v1/whoami").status_code == 401
