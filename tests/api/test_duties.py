"""Roles by duty, checked as a table: every declared operation × every role.

The duty table and each operation's duty are spelled out here rather than imported from
``registry.governance.roles``, so that moving an operation to another duty, or widening a
duty, shows
up as a failing test and not as a silently widened permission. Over HTTP each role's real
token is sent to each operation's route: denied roles get 403, admitted ones never 401/403.
"""

from __future__ import annotations

import re

from registry.contract.operations import OPERATIONS
from registry.governance import roles
from registry.governance.roles import ROLES
from tests.api.conftest import ApiEnv

# Who may do what (the README's duties table says the same in words).
DUTY_TABLE: dict[str, frozenset[str]] = {
    "admin": frozenset({"admin"}),
    "read_registry": frozenset({"admin", "registrar", "promoter", "auditor", "reader", "worker"}),
    "write_registry": frozenset({"admin", "registrar"}),
    "verify_artifact": frozenset({"admin", "registrar", "auditor"}),
    "author_policy": frozenset({"admin", "promoter"}),
    "approve_remote_code": frozenset({"admin"}),
    "govern": frozenset({"admin", "promoter"}),
    "validate": frozenset({"admin", "registrar", "promoter"}),
    "measure": frozenset({"admin", "registrar", "promoter", "worker"}),
    "workers": frozenset({"admin", "worker"}),
    "ingest": frozenset({"admin", "ingest"}),
    "read_audit": frozenset({"admin", "auditor"}),
    "any": frozenset(ROLES),
}

# Every declared operation and the duty it belongs to.
OPERATION_DUTIES: dict[str, str] = {
    "add_artifact": "write_registry",
    "list_artifacts": "read_registry",
    "verify_artifact": "verify_artifact",
    "approve_remote_code": "approve_remote_code",
    "get_artifact": "read_registry",
    "register_pair": "write_registry",
    "list_pairs": "read_registry",
    "get_pair": "read_registry",
    "propose_pair": "read_registry",
    "export_speculators": "read_registry",
    "pair_economics": "read_registry",
    "list_hardware": "read_registry",
    "deprecate_pair": "govern",
    "retire_pair": "govern",
    "list_audit_events": "read_audit",
    "prove_inclusion": "read_audit",
    "prove_consistency": "read_audit",
    "sign_log_checkpoint": "read_audit",
    "get_log_checkpoint": "read_audit",
    "verify_audit_log": "read_audit",
    "get_retention": "read_audit",
    "set_retention": "admin",
    "archive_requests": "admin",
    "get_archived_request": "read_audit",
    "create_token": "admin",
    "whoami": "any",
    "list_tokens": "admin",
    "revoke_token": "admin",
    "put_policy": "author_policy",
    "list_policies": "read_registry",
    "get_policy": "read_registry",
    "validate_pair": "validate",
    "list_validations": "read_registry",
    "get_validation": "read_registry",
    "set_validation_run": "validate",
    "create_deployment": "govern",
    "list_deployments": "read_registry",
    "get_deployment": "read_registry",
    "deployment_at": "read_registry",
    "promote": "govern",
    "rollback": "govern",
    "set_deployment_policy": "author_policy",
    "store_measurement": "measure",
    "verify_measurement": "read_registry",
    "register_worker_key": "admin",
    "list_worker_keys": "read_registry",
    "list_measurements": "read_registry",
    "get_measurement": "read_registry",
    "list_jobs": "read_registry",
    "claim_job": "workers",
    "get_job": "read_registry",
    "renew_lease": "workers",
    "complete_job": "workers",
    "fail_job": "workers",
    "list_flags": "read_registry",
    "check_drift": "govern",
    "get_flag": "read_registry",
    "ack_flag": "govern",
    "resolve_flag": "govern",
    "watch": "workers",
    "ingest_requests": "ingest",
    "list_requests": "read_audit",
    "audit_request": "read_audit",
    "build_bundle": "read_audit",
    "ingest_prometheus": "ingest",
    "deployment_online_alpha": "read_registry",
    "export_serving": "read_registry",
    "maintain_partitions": "admin",
    "create_webhook": "admin",
    "list_webhooks": "admin",
    "get_webhook": "admin",
    "disable_webhook": "admin",
    "enable_webhook": "admin",
    "list_webhook_deliveries": "admin",
    "export_acceptance_curve": "read_registry",
    "import_acceptance_curve": "measure",
    "map_mlflow_model": "write_registry",
    "list_mlflow_sources": "read_registry",
    "list_mlflow_deliveries": "read_audit",
    "k_schedule": "read_registry",
}

_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")


def test_the_duty_table_is_the_registrys() -> None:
    """Each duty admits exactly the roles the table says; no duty is left out."""
    declared = {d.name: frozenset(d) for d in (*roles.DUTIES, roles.ANY)}
    assert declared == DUTY_TABLE
    # Separation: whoever registers pairs holds none of the duties that move its gates.
    for duty in ("author_policy", "approve_remote_code", "govern", "workers"):
        assert "registrar" not in DUTY_TABLE[duty], duty
    assert DUTY_TABLE["approve_remote_code"] == {"admin"}


def test_every_operation_follows_from_its_duty() -> None:
    """Operation × role, against the duty table: the contract's role set is the duty's."""
    declared = {op.name for op in OPERATIONS}
    assert declared == set(OPERATION_DUTIES), declared ^ set(OPERATION_DUTIES)
    problems = []
    for op in OPERATIONS:
        duty = OPERATION_DUTIES[op.name]
        if op.duty != duty:
            problems.append(f"{op.name}: duty {op.duty}, expected {duty}")
        for role in ROLES:
            if (role in op.roles) != (role in DUTY_TABLE[duty]):
                problems.append(f"{op.name} as {role}: contract disagrees with duty {duty}")
    assert not problems, "\n".join(problems)


def test_every_operation_by_every_role_over_http(api: ApiEnv) -> None:
    """The same table against the running app with each role's real token."""
    problems = []
    checked = 0
    for op in OPERATIONS:
        if op.path is None:
            continue  # embedded only: no route (the local owner holds every duty)
        url = _PARAM.sub(lambda m: {"engine": "vllm"}.get(m.group(1), "1"), op.path)
        admitted = DUTY_TABLE[OPERATION_DUTIES[op.name]]
        for role in ROLES:
            kwargs = {"json": {}} if op.method in ("POST", "PUT") else {}
            status = api.client.request(op.method, url, headers=api.auth(role), **kwargs)
            checked += 1
            code = status.status_code
            if role in admitted and (code in (401, 403) or code >= 500):
                problems.append(f"{op.name} as {role}: admitted by its duty, got {code}")
            if role not in admitted and code != 403:
                problems.append(f"{op.name} as {role}: denied by its duty, got {code}")
            if role not in admitted and code == 403:
                assert status.json()["kind"] == "forbidden"
    assert checked >= 7 * 60
    assert not problems, "\n".join(problems)
