"""Property-based fuzzing of every operation against the app's own OpenAPI schema.

Schemathesis generates valid and invalid requests from ``/openapi.json`` and checks each
response: no 5xx, the status code is documented, the body matches the documented schema and
media type. Bounded (``MAX_EXAMPLES`` per operation, no deadline) so it takes about a minute.
The figures are printed at the end (run with ``-s`` to see them).
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from api.app import create_app
from registry import db
from registry.db import session_scope
from registry.records import Provenance
from registry.services.artifacts import add_artifact
from registry.services.pairs import register_pair
from registry.services.system import initialise, read_credentials
from registry.settings import Settings
from tests.fixtures import write_fake_model

MAX_EXAMPLES = int(os.environ.get("PAIRREG_FUZZ_EXAMPLES", "25"))
STATS: Counter[str] = Counter()
OPERATIONS: set[str] = set()


@pytest.fixture(scope="module")
def fuzz_env(sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A populated SQLite registry; sources the fuzzer may name live under a throwaway dir."""
    root = tmp_path_factory.mktemp("fuzz")
    shutil.copyfile(sqlite_template, root / "registry.db")
    settings = Settings(home=root / "home", database_url=f"sqlite:///{root / 'registry.db'}")
    initialise(settings)
    target = write_fake_model(root / "target")
    draft = write_fake_model(root / "draft", hidden_size=32, weights=b"draft")
    with session_scope(settings.db_url) as session:
        add_artifact(
            session,
            source=str(target),
            name="acme/t",
            role="target",
            provenance=Provenance(),
            actor="test",
        )
        add_artifact(
            session,
            source=str(draft),
            name="acme/d",
            role="draft",
            provenance=Provenance(),
            actor="test",
        )
        register_pair(
            session, target="acme/t@v1", draft="acme/d@v1", method="draft_model", k=4, actor="test"
        )
    creds = read_credentials(settings.credentials_path)
    assert creds
    return {"settings": settings, "token": creds["token"], "safe_dir": str(target)}


# A schema cannot say that a source path must exist, which config keys a method takes, or
# that a checkpoint's signature must verify: such requests are schema-valid and still
# rightly answered 422 (documented on every /v1 operation). Everything else is default.
CONFIG = schemathesis.Config.from_dict(
    {
        "checks": {
            "positive_data_acceptance": {
                "expected-statuses": ["2xx", "401", "403", "404", "409", "422"]
            }
        }
    }
)
APP = create_app(Settings(database_url="sqlite:///:memory:"))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP, config=CONFIG)


def _tame(case: schemathesis.Case, safe_dir: str) -> None:
    """Keep the fuzzer from hashing real directories of this machine (e.g. ``/``).

    A generated ``source``/``path`` that names an existing directory is pointed at a small
    fixture model instead; everything else (missing paths, odd strings) goes through as is.
    """
    body = case.body
    if isinstance(body, dict):
        for key in ("source", "path"):
            value = body.get(key)
            if isinstance(value, str) and value and Path(value).expanduser().exists():
                body[key] = safe_dir


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=os.environ.get("PAIRREG_FUZZ_RANDOM") != "1",
)
def test_api_conforms_to_its_schema(
    case: schemathesis.Case, fuzz_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    APP.state.settings = fuzz_env["settings"]
    APP.state.db_url = fuzz_env["settings"].db_url
    _tame(case, fuzz_env["safe_dir"])
    OPERATIONS.add(case.operation.label)
    STATS["examples"] += 1
    response = case.call_and_validate(headers={"Authorization": f"Bearer {fuzz_env['token']}"})
    STATS[f"status_{response.status_code // 100}xx"] += 1


def teardown_module() -> None:
    db.dispose_engines()
    print(
        f"\nschemathesis: {len(OPERATIONS)} operations, {STATS['examples']} examples, "
        f"statuses {dict(sorted((k, v) for k, v in STATS.items() if k.startswith('status')))}"
    )
