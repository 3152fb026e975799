"""``POST /v1/requests`` validates a valid body straight from its bytes
(``api/json_body.py``); every other body takes FastAPI's ordinary path, so its errors are
the ones any route gives."""

from __future__ import annotations

import json
from datetime import timedelta

from fastapi.testclient import TestClient

from api.app import create_app
from registry.settings import Settings
from tests.requests.conftest import Served


def _tag(s: Served, i: int, **kw: object) -> dict[str, object]:
    tag = {"request_id": f"j-{i}", "deployment": s.deployment,
           "served_at": (s.t_b + timedelta(seconds=i + 1)).isoformat(), "input_tokens": 3,
           "spec": {"num_spec_steps": 1, "num_draft_tokens": 4,
                    "num_accepted_draft_tokens": 2, "acceptance_histogram": [0, 1]}}  # fmt: skip
    tag.update(kw)
    return tag


def test_valid_and_invalid_bodies(home: Settings, served: Served) -> None:
    s = served
    token = json.loads(home.credentials_path.read_text())["token"]
    client = TestClient(create_app(home))
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def post(body: object) -> tuple[int, dict[str, object]]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = client.post("/v1/requests", content=raw, headers=headers)
        return r.status_code, r.json()

    status, out = post({"tags": [_tag(s, 0), _tag(s, 1, input_tokens="7")]})
    assert status == 201 and out["stored"] == 2, out
    assert post({"tags": [_tag(s, 0), _tag(s, 1, input_tokens=7)]})[0] == 200  # a retry
    # Not valid as tags: the service's own message (the dict branch of the body union).
    status, out = post({"tags": [_tag(s, 2, input_tokens=-1)]})
    assert status == 422 and out["field"] == "tags.0.input_tokens", out
    status, out = post({"tags": [_tag(s, 3, extra=1)]})
    assert status == 422 and out["field"] == "tags.0.extra", out
    # Not the body's shape, not JSON: FastAPI's answers.
    for bad in ({"tag": []}, {"tags": "x"}, b'{"tags": [', b"NaN"):
        status, out = post(bad)
        assert status == 422 and out["status"] == 422, (bad, out)
    status, out = post({"tags": [_tag(s, 4)]})
    assert status == 201 and out["stored"] == 1
