"""Every operation of the registry, declared once.

Each entry names its service (where the rule lives and whose typed signature is the input
and output), its HTTP route, the roles it admits and the errors it may answer. Routes, the
remote client, the embedded backend and the typed interface all follow from this list; to
add an operation, write its service and one entry here (then run
``python -m registry.contract.generate`` to refresh the typed interface), plus its CLI
rendering.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from registry.artifacts.hub import HubAccess
from registry.artifacts.source_paths import PathLimits, path_limits
from registry.contract.spec import CallContext, Operation
from registry.errors import Conflict, Forbidden, InvalidInput, NotFound, SchemaOutOfDate
from registry.governance import roles
from registry.records.requests import decode_tags
from registry.services import (
    artifacts,
    audit_log,
    bundles,
    curves,
    deployments,
    drift,
    duties,
    economics,
    exports,
    job_results,
    jobs,
    measurements,
    mlflow_sources,
    online,
    pairs,
    policies,
    requests,
    retention,
    telemetry,
    tokens,
    transparency,
    validation,
    watch,
    webhooks,
)

NF = (InvalidInput, NotFound)
NFC = (InvalidInput, NotFound, Conflict)
# ...and a rule inside the operation that refuses some of the roles it admits (403)
NFCF = (InvalidInput, NotFound, Conflict, Forbidden)


def _verified_state(ctx: CallContext) -> str:
    """Where this process keeps its verified-files stat cache (never a client's path)."""
    return str(ctx.settings.cache_dir / "verified")


def _home_dir(ctx: CallContext) -> str:
    """This process's home: its own hardware profiles (never a client's directory)."""
    return str(ctx.settings.home_dir)


def _log_origin(ctx: CallContext) -> str | None:
    """The origin line this process's checkpoints carry, when one is configured."""
    return ctx.settings.log_origin


def _signing_key(ctx: CallContext) -> str:
    """The process's own audit key (never a path a client names)."""
    return str(ctx.settings.signing_key_path)


def _hash_workers(ctx: CallContext) -> int | None:
    return ctx.settings.hash_workers


def _mlflow_ui(ctx: CallContext) -> str | None:
    """The MLflow UI's base URL when runs are tracked on a server (links from the dashboard).

    Only scheme, host, port and path: a tracking URI may carry credentials
    (``https://user:secret@mlflow/``) or a token in its query, and this goes to every
    token holder."""
    uri = ctx.settings.mlflow_tracking_uri or ""
    if not uri.startswith(("http://", "https://")):
        return None
    return public_url(uri)


def public_url(uri: str) -> str | None:
    """``uri`` without userinfo, query or fragment (None when it has no usable host)."""
    try:
        parts = urlsplit(uri)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host:
        return None
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")


def _confine(ctx: CallContext) -> PathLimits | None:
    """Where a caller's local paths may point: the one place local and remote differ."""
    return path_limits(ctx.settings, remote=ctx.remote)


def _via(ctx: CallContext) -> str:
    """How a self-reported measurement arrived: over HTTP (a token's word), or from the
    embedded registry's own user (who owns the database anyway)."""
    return "http" if ctx.remote else "local"


def _hub_access(ctx: CallContext) -> HubAccess:
    """The Hub tokens configured per repository (never the ambient login unless the operator
    opts in), and for a remote caller the same file and byte caps as a local source."""
    limits = path_limits(ctx.settings, remote=ctx.remote)
    return HubAccess(
        tokens=dict(ctx.settings.hub_tokens),
        ambient=ctx.settings.hub_ambient_token,
        max_files=limits.max_files if limits else None,
        max_bytes=limits.max_bytes if limits else None,
    )


def _nothing_new(attr: str):  # -> Callable[[Any], bool]
    return lambda result: not getattr(result, attr)


OPERATIONS: tuple[Operation, ...] = (
    # -- artifacts -----------------------------------------------------------------------
    Operation(
        artifacts.add_artifact,
        "POST",
        "/v1/artifacts",
        roles.WRITE_REGISTRY,
        "Register an artifact (idempotent by content)",
        "artifacts",
        errors=NFC,
        status=201,
        unchanged=(_nothing_new("created"), 200, "Identical content existed"),
        context={"hash_workers": _hash_workers, "confine": _confine, "hub_access": _hub_access},
        examples=(
            {
                "source": "hf://acme/chat-8b@main",
                "name": "acme/chat-8b",
                "role": "target",
                "provenance": {"publisher": "acme", "license": "apache-2.0"},
            },
        ),
    ),
    Operation(
        artifacts.list_artifacts,
        "GET",
        "/v1/artifacts",
        roles.READ_REGISTRY,
        "List artifacts",
        "artifacts",
        errors=NF,
    ),
    Operation(
        artifacts.verify_artifact,
        "POST",
        "/v1/artifacts/{ref:path}/verify",
        roles.VERIFY_ARTIFACT,
        "Re-hash and compare with the manifest",
        "artifacts",
        errors=NF,
        context={"confine": _confine, "hash_workers": _hash_workers},
    ),
    Operation(
        duties.approve_remote_code,
        "POST",
        "/v1/artifacts/{ref:path}/approve-remote-code",
        roles.APPROVE_REMOTE_CODE,
        "Approve one artifact's own model code (by manifest digest) to run in isolated workers",
        "artifacts",
        errors=NF,
        status=201,
        unchanged=(lambda r: not r.created, 200, "Already approved"),
    ),
    Operation(
        artifacts.get_artifact,
        "GET",
        "/v1/artifacts/{ref:path}",
        roles.READ_REGISTRY,
        "One artifact with its manifest",
        "artifacts",
        errors=NF,
    ),
    # -- pairs ---------------------------------------------------------------------------
    Operation(
        pairs.register_pair,
        "POST",
        "/v1/pairs",
        roles.WRITE_REGISTRY,
        "Register a pair (idempotent by digest)",
        "pairs",
        errors=NFC,
        status=201,
        unchanged=(_nothing_new("created"), 200, "The pair existed"),
        examples=(
            {
                "target": "acme/chat-8b@v1",
                "draft": "acme/chat-draft@latest",
                "method": "draft_model",
                "k": 4,
                "options": {"acceptance": "strict"},
            },
        ),
    ),
    Operation(
        pairs.list_pairs,
        "GET",
        "/v1/pairs",
        roles.READ_REGISTRY,
        "List pairs",
        "pairs",
        errors=NF,
    ),
    Operation(
        pairs.get_pair, "GET", "/v1/pairs/{ref}", roles.READ_REGISTRY, "One pair", "pairs", NF
    ),
    Operation(
        pairs.propose_pair,
        "GET",
        "/v1/pairs/proposal",
        roles.READ_REGISTRY,
        "The pair a speculators-format drafter implies, checked against a target",
        "pairs",
        errors=NF,
    ),
    Operation(
        exports.export_speculators,
        "GET",
        "/v1/pairs/{pair}/speculators",
        roles.READ_REGISTRY,
        "The pair's drafter as a speculators config.json with its verifier pinned",
        "pairs",
        errors=NF,
    ),
    Operation(
        economics.pair_economics,
        "GET",
        "/v1/pairs/{pair}/economics",
        roles.READ_REGISTRY,
        "Predicted speed-up, memory limits and cost per 1M tokens by batch size",
        "pairs",
        errors=NF,
        context={"home_dir": _home_dir},
    ),
    Operation(
        economics.list_hardware,
        "GET",
        "/v1/hardware",
        roles.READ_REGISTRY,
        "Hardware profiles: shipped (datasheets), measured and the user's own",
        "pairs",
        errors=NF,
        context={"home_dir": _home_dir},
    ),
    Operation(
        pairs.deprecate_pair,
        "POST",
        "/v1/pairs/{ref}/deprecate",
        roles.GOVERN,
        "Deprecate a pair (no further promotion)",
        "pairs",
        errors=NFC,
        examples=({"reason": "superseded by the EAGLE-3 heads"},),
    ),
    Operation(
        pairs.retire_pair,
        "POST",
        "/v1/pairs/{ref}/retire",
        roles.GOVERN,
        "Retire a pair for good",
        "pairs",
        errors=NFC,
    ),
    # -- audit log -----------------------------------------------------------------------
    Operation(
        audit_log.list_audit_events,
        "GET",
        "/v1/audit/events",
        roles.READ_AUDIT,
        "List audit events",
        "audit",
        errors=(InvalidInput,),
        wire_names={"by_actor": "actor"},
    ),
    # -- the audit log as a transparency log (docs/transparency.md) -----------------------
    Operation(
        transparency.prove_inclusion,
        "GET",
        "/v1/audit/proofs/inclusion",
        roles.READ_AUDIT,
        "Inclusion proof of one audit event in the Merkle tree of the log (RFC 9162)",
        "audit",
        errors=NF,
    ),
    Operation(
        transparency.prove_consistency,
        "GET",
        "/v1/audit/proofs/consistency",
        roles.READ_AUDIT,
        "Consistency proof between two sizes of the log (RFC 9162)",
        "audit",
        errors=(InvalidInput,),
    ),
    Operation(
        transparency.sign_log_checkpoint,
        "POST",
        "/v1/audit/log-checkpoints",
        roles.READ_AUDIT,
        "Sign a C2SP checkpoint of the log (only if it extends the last one signed)",
        "audit",
        errors=(InvalidInput, Conflict),
        context={"key_path": _signing_key, "origin": _log_origin},
    ),
    Operation(
        transparency.get_log_checkpoint,
        "GET",
        "/v1/audit/log-checkpoints/latest",
        roles.READ_AUDIT,
        "The newest signed checkpoint (or the one at tree_size), as a witness fetches it",
        "audit",
        errors=NF,
        context={"key_path": _signing_key, "origin": _log_origin},
    ),
    Operation(
        transparency.verify_audit_log,
        "POST",
        "/v1/audit/verify",
        roles.READ_AUDIT,
        "Verify the log: recompute its tree, compare it with every checkpoint it signed",
        "audit",
        errors=(InvalidInput,),
        also_get=True,
        context={"key_path": _signing_key, "origin": _log_origin},
    ),
    # -- retention and archives ------------------------------------------------------------
    Operation(
        retention.get_retention,
        "GET",
        "/v1/retention",
        roles.READ_AUDIT,
        "How long records are kept, and the horizon before which they may go",
        "requests",
        errors=NF,
    ),
    Operation(
        retention.set_retention,
        "PUT",
        "/v1/retention",
        roles.ADMIN,
        "Change a retention period (at least six months)",
        "requests",
        errors=NF,
    ),
    Operation(
        retention.archive_requests,
        "POST",
        None,
        roles.ADMIN,
        "Archive whole ingest batches served before a date; optionally purge past retention",
        "requests",
        errors=NFC,
        context={"key_path": _signing_key, "origin": _log_origin},
        local_only=(
            "archives are written to the filesystem of the host that runs them: unset "
            "PAIRREG_URL and set PAIRREG_DATABASE_URL on a host that can reach the database"
        ),
    ),
    Operation(
        retention.get_archived_request,
        "GET",
        None,
        roles.READ_AUDIT,
        "Reconstruct an archived request from its archive (verified first)",
        "requests",
        errors=NF,
        local_only="archives are read from the local filesystem: unset PAIRREG_URL",
        context={"key_path": _signing_key, "origin": _log_origin},
    ),
    # -- tokens --------------------------------------------------------------------------
    Operation(
        tokens.create_token,
        "POST",
        "/v1/tokens",
        roles.ADMIN,
        "Create a token (its secret is shown once)",
        "tokens",
        errors=(InvalidInput, Conflict),
        status=201,
        examples=({"name": "ci-ingest", "role": "ingest"},),
    ),
    Operation(
        tokens.whoami,
        "GET",
        "/v1/whoami",
        roles.ANY,
        "The caller's token, role and capabilities",
        "tokens",
        errors=NF,
        context={"mlflow_ui": _mlflow_ui},
    ),
    Operation(tokens.list_tokens, "GET", "/v1/tokens", roles.ADMIN, "List tokens", "tokens", NF),
    Operation(
        tokens.revoke_token,
        "DELETE",
        "/v1/tokens/{name}",
        roles.ADMIN,
        "Revoke a token",
        "tokens",
        errors=NFC,
    ),
    # -- policies ------------------------------------------------------------------------
    Operation(
        policies.put_policy,
        "POST",
        "/v1/policies",
        roles.AUTHOR_POLICY,
        "Store a policy (a new version when changed)",
        "policies",
        errors=(InvalidInput,),
        status=201,
        unchanged=(_nothing_new("created"), 200, "Unchanged"),
        examples=({"text": 'name = "strict"\n[alpha]\nmin_overall = 0.6\n'},),
    ),
    Operation(
        policies.list_policies,
        "GET",
        "/v1/policies",
        roles.READ_REGISTRY,
        "List policies",
        "policies",
        errors=NF,
    ),
    Operation(
        policies.get_policy,
        "GET",
        "/v1/policies/{name}",
        roles.READ_REGISTRY,
        "Show a policy",
        "policies",
        errors=NF,
    ),
    # -- validation ----------------------------------------------------------------------
    Operation(
        validation.validate_pair,
        "POST",
        "/v1/pairs/{ref}/validate",
        roles.VALIDATE,
        "Validate a pair against a policy (202 when a measurement is queued)",
        "validation",
        errors=NFCF,
        unchanged=(lambda r: r.state == "queued", 202, "Measurement queued"),
        examples=({"policy": "default", "deployment": "chat-prod"},),
        context={"home_dir": _home_dir},
    ),
    Operation(
        validation.list_validations,
        "GET",
        "/v1/validations",
        roles.READ_REGISTRY,
        "List validations",
        "validation",
        errors=NF,
    ),
    Operation(
        validation.get_validation,
        "GET",
        "/v1/validations/{id}",
        roles.READ_REGISTRY,
        "Show a validation and its gates",
        "validation",
        errors=NF,
    ),
    Operation(
        validation.set_validation_run,
        "POST",
        "/v1/validations/{id}/mlflow-run",
        roles.VALIDATE,
        "Attach the MLflow run logged for a validation",
        "validation",
        errors=NFC,
    ),
    # -- deployments ---------------------------------------------------------------------
    Operation(
        deployments.create_deployment,
        "POST",
        "/v1/deployments",
        roles.GOVERN,
        "Create a deployment",
        "deployments",
        errors=NFC,
        status=201,
        examples=({"name": "chat-prod", "policy": "default"},),
    ),
    Operation(
        deployments.list_deployments,
        "GET",
        "/v1/deployments",
        roles.READ_REGISTRY,
        "List deployments",
        "deployments",
        errors=NF,
    ),
    Operation(
        deployments.get_deployment,
        "GET",
        "/v1/deployments/{name}",
        roles.READ_REGISTRY,
        "A deployment, its live pair and full history",
        "deployments",
        errors=NF,
    ),
    Operation(
        deployments.deployment_at,
        "GET",
        "/v1/deployments/{name}/at",
        roles.READ_REGISTRY,
        "The move in force at a time (which pair served then)",
        "deployments",
        errors=NF,
        wire_names={"at": "time"},
    ),
    Operation(
        deployments.promote,
        "POST",
        "/v1/deployments/{deployment}/promote",
        roles.GOVERN,
        "Promote a pair (gates re-checked in the transaction)",
        "deployments",
        errors=NFCF,
        wire_names={"ref": "pair"},
        examples=({"pair": "3f2a9c1b7d4e", "reason": "passed canary", "expect_version": 4},),
        context={"home_dir": _home_dir},
    ),
    Operation(
        deployments.rollback,
        "POST",
        "/v1/deployments/{deployment}/rollback",
        roles.GOVERN,
        "Return to the previous pair",
        "deployments",
        errors=NFC,
        examples=({"reason": "acceptance fell in production"},),
    ),
    Operation(
        deployments.set_deployment_policy,
        "PUT",
        "/v1/deployments/{name}/policy",
        roles.AUTHOR_POLICY,
        "Change the policy a deployment enforces",
        "deployments",
        errors=NFC,
    ),
    # -- measurements --------------------------------------------------------------------
    Operation(
        measurements.store_measurement,
        "POST",
        "/v1/measurements",
        roles.MEASURE,
        "Store a measurement taken by `pairreg measure` (recorded as self-reported)",
        "measurements",
        errors=NF,
        status=201,
        context={"via": _via},
    ),
    Operation(
        duties.verify_measurement,
        "POST",
        "/v1/measurements/{id}/verify",
        roles.READ_REGISTRY,
        "Check a measurement's worker signature against the worker's registered key",
        "measurements",
        errors=NF,
    ),
    Operation(
        duties.register_worker_key,
        "POST",
        "/v1/worker-keys",
        roles.ADMIN,
        "Register the Ed25519 public key a worker token signs its results with",
        "jobs",
        errors=NFC,
        status=201,
    ),
    Operation(
        duties.list_worker_keys,
        "GET",
        "/v1/worker-keys",
        roles.READ_REGISTRY,
        "Registered worker keys (to verify signed measurements offline)",
        "jobs",
        errors=NF,
    ),
    Operation(
        measurements.list_measurements,
        "GET",
        "/v1/measurements",
        roles.READ_REGISTRY,
        "List measurements (without per-prompt rows)",
        "measurements",
        errors=NF,
    ),
    Operation(
        measurements.get_measurement,
        "GET",
        "/v1/measurements/{id}",
        roles.READ_REGISTRY,
        "A measurement with its per-prompt counters",
        "measurements",
        errors=NF,
    ),
    # -- jobs: the worker protocol -------------------------------------------------------
    Operation(jobs.list_jobs, "GET", "/v1/jobs", roles.READ_REGISTRY, "List jobs", "jobs", NF),
    Operation(
        jobs.claim_job,
        "POST",
        "/v1/jobs/claim",
        roles.WORKERS,
        "Claim the oldest claimable job (null when none)",
        "jobs",
        errors=NFC,
        examples=({"worker": "gpu-box-1:4242", "device": "cuda", "lease_seconds": 60},),
    ),
    Operation(jobs.get_job, "GET", "/v1/jobs/{id}", roles.READ_REGISTRY, "Show a job", "jobs", NF),
    Operation(
        jobs.renew_lease,
        "POST",
        "/v1/jobs/{id}/renew",
        roles.WORKERS,
        "Renew a job's lease",
        "jobs",
        errors=NFC,
    ),
    Operation(
        job_results.complete_job,
        "POST",
        "/v1/jobs/{id}/complete",
        roles.WORKERS,
        "Hand back a job's results (written once)",
        "jobs",
        errors=NFC,
        context={"home_dir": _home_dir},
    ),
    Operation(
        jobs.fail_job,
        "POST",
        "/v1/jobs/{id}/fail",
        roles.WORKERS,
        "Record a failed attempt",
        "jobs",
        errors=NFC,
    ),
    # -- drift ---------------------------------------------------------------------------
    Operation(drift.list_flags, "GET", "/v1/drift", roles.READ_REGISTRY, "List flags", "drift", NF),
    Operation(
        drift.check_drift,
        "POST",
        "/v1/drift/check",
        roles.GOVERN,
        "Compare two stored measurements for drift",
        "drift",
        errors=NFC,
    ),
    Operation(
        drift.get_flag, "GET", "/v1/drift/{id}", roles.READ_REGISTRY, "Show a flag", "drift", NF
    ),
    Operation(
        drift.ack_flag,
        "POST",
        "/v1/drift/{id}/ack",
        roles.GOVERN,
        "Acknowledge a flag with a reason (unblocks promotion)",
        "drift",
        errors=NFC,
        examples=({"reason": "expected: v2 was tuned for prose; code traffic is small"},),
        context={"home_dir": _home_dir},
    ),
    Operation(
        drift.resolve_flag,
        "POST",
        "/v1/drift/{id}/resolve",
        roles.GOVERN,
        "Resolve a flag",
        "drift",
        errors=NFC,
        context={"home_dir": _home_dir},
    ),
    Operation(
        watch.watch,
        "POST",
        "/v1/watch",
        roles.WORKERS,
        "Poll watched Hub branches once",
        "drift",
        errors=NF,
        context={"hub_access": _hub_access},
    ),
    # -- outgoing webhooks (docs/lifecycle.md) --------------------------------------------
    Operation(
        webhooks.create_webhook,
        "POST",
        "/v1/webhooks",
        roles.ADMIN,
        "Subscribe a receiver to pairreg's decisions (its signing secret is shown once)",
        "webhooks",
        errors=(InvalidInput, Conflict),
        status=201,
        examples=(
            {
                "name": "ci",
                "url": "https://ci.example.com/pairreg",
                "events": ["deployment.promoted", "flag.opened"],
            },
        ),
    ),
    Operation(
        webhooks.list_webhooks, "GET", "/v1/webhooks", roles.ADMIN, "List webhooks", "webhooks", NF
    ),
    Operation(
        webhooks.get_webhook,
        "GET",
        "/v1/webhooks/{name}",
        roles.ADMIN,
        "One webhook with its pending and delivered counts",
        "webhooks",
        NF,
    ),
    Operation(
        webhooks.disable_webhook,
        "POST",
        "/v1/webhooks/{name}/disable",
        roles.ADMIN,
        "Stop sending to a receiver (what it is owed is kept)",
        "webhooks",
        NF,
    ),
    Operation(
        webhooks.enable_webhook,
        "POST",
        "/v1/webhooks/{name}/enable",
        roles.ADMIN,
        "Resume sending, oldest owed event first",
        "webhooks",
        NF,
    ),
    Operation(
        webhooks.list_webhook_deliveries,
        "GET",
        "/v1/webhooks/{name}/deliveries",
        roles.ADMIN,
        "A receiver's deliveries in order, with every attempt",
        "webhooks",
        NF,
    ),
    Operation(
        curves.export_acceptance_curve,
        "GET",
        "/v1/pairs/{pair}/acceptance-curve",
        roles.READ_REGISTRY,
        "Acceptance length per k per category with provenance (replayable in vLLM)",
        "pairs",
        errors=NF,
    ),
    Operation(
        curves.import_acceptance_curve,
        "POST",
        "/v1/acceptance-curves",
        roles.MEASURE,
        "Import an acceptance curve for a registered pair (provenance checked)",
        "pairs",
        errors=NFC,
        status=201,
        unchanged=(lambda r: not r.created, 200, "This curve was already imported"),
    ),
    # -- MLflow registry webhooks in (docs/lifecycle.md) ----------------------------------
    Operation(
        mlflow_sources.map_mlflow_model,
        "POST",
        "/v1/mlflow/sources",
        roles.WRITE_REGISTRY,
        "Follow an MLflow registered model as a pairreg lineage",
        "mlflow",
        errors=NFC,
        examples=(
            {"registered_model": "chat-8b", "lineage": "acme/chat-8b", "aliases": ["champion"]},
        ),
    ),
    Operation(
        mlflow_sources.list_mlflow_sources,
        "GET",
        "/v1/mlflow/sources",
        roles.READ_REGISTRY,
        "MLflow registered models followed, and their lineages",
        "mlflow",
        NF,
    ),
    Operation(
        mlflow_sources.list_mlflow_deliveries,
        "GET",
        "/v1/mlflow/deliveries",
        roles.READ_AUDIT,
        "MLflow webhook deliveries accepted, with what each did",
        "mlflow",
        NF,
    ),
    # -- request tags, audits, telemetry, exports ----------------------------------------
    Operation(
        requests.ingest_requests,
        "POST",
        "/v1/requests",
        roles.INGEST,
        "Ingest request tags (idempotent per source; conflicts reported per tag)",
        "requests",
        errors=NFC,
        status=201,
        unchanged=(lambda r: r.stored == 0, 200, "Nothing new: every tag existed"),
        json_body_direct=True,  # batches of up to 10,000 tags
        json_body_fast=decode_tags,
        context={"home_dir": _home_dir},
    ),
    Operation(
        requests.list_requests,
        "GET",
        "/v1/requests",
        roles.READ_AUDIT,
        "List request tags",
        "requests",
        errors=NF,
    ),
    Operation(
        requests.audit_request,
        "GET",
        "/v1/requests/{request_id}",
        roles.READ_AUDIT,
        "Which pair served this request, with everything needed to reconstruct it",
        "requests",
        errors=NFC,
    ),
    Operation(
        bundles.build_bundle,
        "GET",
        "/v1/requests/{request_id}/bundle",
        roles.READ_AUDIT,
        "A self-contained, offline-verifiable audit bundle for one request",
        "requests",
        errors=NFC,
        context={"key_path": _signing_key, "origin": _log_origin},
    ),
    Operation(
        telemetry.ingest_prometheus,
        "POST",
        "/v1/telemetry/prometheus",
        roles.INGEST,
        "Push a Prometheus scrape of a serving engine (vLLM spec-decode counters)",
        "requests",
        errors=NF,
        text_body="text",
    ),
    Operation(
        online.deployment_online_alpha,
        "GET",
        "/v1/deployments/{name}/online-alpha",
        roles.READ_REGISTRY,
        "Online α of a deployment over time, tested against its validated α",
        "deployments",
        errors=NF,
    ),
    Operation(
        economics.k_schedule,
        "GET",
        "/v1/pairs/{pair}/k-schedule",
        roles.READ_REGISTRY,
        "Draft length per batch size that maximises predicted throughput (vLLM, TensorRT-LLM)",
        "pairs",
        errors=NF,
        context={"home_dir": _home_dir},
    ),
    Operation(
        exports.export_serving,
        "GET",
        "/v1/exports/{engine}",
        roles.READ_REGISTRY,
        "Serving-engine launch arguments for a deployment's live pair",
        "requests",
        errors=NF,
        context={"state_dir": _verified_state, "home_dir": _home_dir},
    ),
    Operation(
        requests.maintain_partitions,
        "POST",
        None,
        roles.ADMIN,
        "Create monthly request-tag partitions ahead of time",
        "requests",
        errors=(InvalidInput, SchemaOutOfDate),
        local_only=(
            "partition maintenance runs against the database: unset PAIRREG_URL and set "
            "PAIRREG_DATABASE_URL on a host that can reach it"
        ),
    ),
)

BY_NAME: dict[str, Operation] = {op.name: op for op in OPERATIONS}
if len(BY_NAME) != len(OPERATIONS):
    raise RuntimeError("two operations share a name")
