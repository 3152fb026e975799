"""Property-based fuzzing of every operation, against a seeded registry, as every role.

Schemathesis generates valid and invalid requests from ``/openapi.json`` and checks each
response: no 5xx, the status code is documented, the body matches the documented schema and
media type. The registry is seeded first (``tests/api/fuzzing.py``) and path, query and body
parameters are drawn from what exists half the time, so operations reach their 2xx answers
instead of 404; every other case is sent with a non-admin role's token, and a role the role
table does not admit must never get a 2xx. The fuzzer's own tokens are never revoked.

Bounded here (``PAIRREG_FUZZ_EXAMPLES`` per operation, deterministic); ``make fuzz`` runs
the same test longer and random, and prints the figures (``-s`` shows them here too).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.core.parameters import ParameterLocation

from api.app import create_app
from registry import db
from tests.api.fuzzing import (
    Seeded,
    Tally,
    admitted,
    schema_config,
    seed,
    spare_own_tokens,
    steer,
)
from tests.hubserver import loopback_hub

# The tally test reads what the fuzz test counted in this process: one xdist worker runs both,
# in order (``--dist loadgroup``), or the tally test would find nothing and skip.
pytestmark = pytest.mark.xdist_group("fuzz")

MAX_EXAMPLES = int(os.environ.get("PAIRREG_FUZZ_EXAMPLES", "20"))
PROBABILITY = float(os.environ.get("PAIRREG_FUZZ_SEEDED", "0.5"))
DEEP = os.environ.get("PAIRREG_FUZZ_DEEP") == "1"
TALLY = Tally()


@pytest.fixture(scope="module")
def seeded(sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    """The seeded registry, with a loopback Hub as ``HF_ENDPOINT`` (no network is reached,
    whatever ``hf://`` source the fuzzer names)."""
    with (
        pytest.MonkeyPatch.context() as mp,
        loopback_hub(tmp_path_factory.mktemp("hf_home"), mp) as hub,
    ):
        yield seed(tmp_path_factory.mktemp("fuzz"), sqlite_template, hub)


@pytest.fixture(scope="module")
def api_schema(seeded: Seeded) -> schemathesis.BaseSchema:
    app = create_app(seeded.settings)
    return schemathesis.openapi.from_asgi(
        "/openapi.json", app, config=schema_config(seeded, PROBABILITY, deep=DEEP)
    )


lazy = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(autouse=True)
def _node_id(request: pytest.FixtureRequest) -> None:
    """schemathesis 4.32's lazy schemas label each operation's subtest by rewriting the
    node's ``_nodeid``, an attribute pytest 9 no longer has: give the node one."""
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


@lazy.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=os.environ.get("PAIRREG_FUZZ_RANDOM") != "1",
)
def test_api_conforms_to_its_schema(case: schemathesis.Case, seeded: Seeded) -> None:
    label = case.operation.label
    spare_own_tokens(case, seeded.protected)
    turn = TALLY.next_turn(label)
    role = TALLY.role_for(turn)
    steer(case, seeded, turn)
    keep_negative_query_on_the_wire(case)
    TALLY.operations.add(label)
    TALLY.cases += 1
    try:
        response = case.call_and_validate(
            headers={"Authorization": f"Bearer {seeded.secrets[role]}"}
        )
        status = response.status_code
        if 200 <= status < 300 and case.operation.path.startswith("/v1/"):
            roles = admitted(case.operation.method, case.operation.path)
            assert role in roles, f"{role} got {status} from {label}, admitted: {sorted(roles)}"
    except Exception:
        TALLY.failures[label] += 1
        raise
    TALLY.statuses[f"{status // 100}xx"] += 1
    if 200 <= status < 300:
        TALLY.ok[label][role] += 1


def keep_negative_query_on_the_wire(case: schemathesis.Case) -> None:
    """A negative case's extra query parameter whose value is an empty list, an empty
    object or null is not serialised at all, so the request that goes out is valid, is
    rightly answered 2xx, and schemathesis reports 'schema-violating request accepted'
    (``GET /v1/deployments/{name}/at?time=…`` with ``{"": []}`` added). Send such a
    parameter with an empty value instead, so the violation it stands for reaches the
    server (which refuses unknown parameters with a 422)."""
    meta = case.meta
    if meta is None or not case.query:
        return
    info = meta.components.get(ParameterLocation.QUERY)
    if info is None or info.mode is not GenerationMode.NEGATIVE:
        return
    case.query = {k: ("" if v in (None, [], {}) else v) for k, v in case.query.items()}


def test_fuzzing_reached_the_operations() -> None:
    """The seeding works: nearly every operation got past 404 to a 2xx (the few that do not
    are printed); a seed that stops matching the API shows up here, not as a quiet 404 run."""
    summary = TALLY.summary()
    if not summary["operations"]:
        pytest.skip("the fuzz test did not run")
    print("\n" + TALLY.report())
    assert summary["failures"] == 0
    assert summary["operations_2xx"] >= 0.9 * summary["operations"], summary["never_2xx"]
    assert set(summary["roles_2xx"]) >= {"admin", "reader", "auditor", "worker"}


def teardown_module() -> None:
    db.dispose_engines()
