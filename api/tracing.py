"""OpenTelemetry spans for served requests, in the GenAI semantic conventions.

``pairreg proxy`` (a CLIENT span per forwarded completion) and embedded serving (an
INTERNAL span per completion: the model runs in the process) record one span each, named
``{gen_ai.operation.name} {gen_ai.request.model}`` with the GenAI attributes (names taken
from ``opentelemetry-semantic-conventions``, so a rename there shows up here) plus the
pair that served it:

``pairreg.pair.digest``, ``pairreg.target.digest``, ``pairreg.draft.digest`` (manifest
digests), ``pairreg.deployment``, ``pairreg.request.id`` and the request's spec-decode
counters ``pairreg.spec.draft_tokens`` / ``pairreg.spec.accepted_tokens``.

Off by default. On when the standard settings ask for it: ``OTEL_TRACES_EXPORTER=otlp``
(or ``console``), or an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) with no exporter named; ``OTEL_SDK_DISABLED=true``
or ``OTEL_TRACES_EXPORTER=none`` keep it off. The OTLP/HTTP exporter reads its own
``OTEL_EXPORTER_OTLP_*`` settings (endpoint, headers, timeout, compression) and the
resource reads ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``. Tests (and embedders)
pass their own ``TracerProvider`` instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import error_attributes, server_attributes

SCOPE = "pairreg"
PAIR_DIGEST = "pairreg.pair.digest"
TARGET_DIGEST = "pairreg.target.digest"
DRAFT_DIGEST = "pairreg.draft.digest"
DEPLOYMENT = "pairreg.deployment"
REQUEST_ID = "pairreg.request.id"
SPEC_DRAFT_TOKENS = "pairreg.spec.draft_tokens"
SPEC_ACCEPTED_TOKENS = "pairreg.spec.accepted_tokens"

OPERATION_NAME = gen_ai.GEN_AI_OPERATION_NAME
PROVIDER_NAME = gen_ai.GEN_AI_PROVIDER_NAME
REQUEST_MODEL = gen_ai.GEN_AI_REQUEST_MODEL
REQUEST_MAX_TOKENS = gen_ai.GEN_AI_REQUEST_MAX_TOKENS
RESPONSE_MODEL = gen_ai.GEN_AI_RESPONSE_MODEL
RESPONSE_ID = gen_ai.GEN_AI_RESPONSE_ID
RESPONSE_FINISH_REASONS = gen_ai.GEN_AI_RESPONSE_FINISH_REASONS
INPUT_TOKENS = gen_ai.GEN_AI_USAGE_INPUT_TOKENS
OUTPUT_TOKENS = gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS
ERROR_TYPE = error_attributes.ERROR_TYPE
SERVER_ADDRESS = server_attributes.SERVER_ADDRESS
SERVER_PORT = server_attributes.SERVER_PORT
TEXT_COMPLETION = gen_ai.GenAiOperationNameValues.TEXT_COMPLETION.value
CHAT = gen_ai.GenAiOperationNameValues.CHAT.value


def _exporter_from_env(env: Mapping[str, str]) -> Any | None:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    named = [x.strip().lower() for x in env.get("OTEL_TRACES_EXPORTER", "").split(",")]
    named = [x for x in named if x]
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if "none" in named or (not named and not endpoint):
        return None
    if "console" in named and "otlp" not in named:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def provider_from_env(env: Mapping[str, str] | None = None) -> trace.TracerProvider | None:
    """An SDK provider exporting in batches when ``OTEL_*`` asks for it, else None (off)."""
    exporter = _exporter_from_env(os.environ if env is None else env)
    if exporter is None:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": "pairreg"})  # OTEL_SERVICE_NAME wins
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def tracer(provider: trace.TracerProvider | None) -> trace.Tracer:
    """A tracer on ``provider``; a no-op tracer when tracing is off."""
    if provider is None:
        return trace.NoOpTracer()
    return provider.get_tracer(SCOPE)


def span_name(operation: str, model: str | None) -> str:
    return f"{operation} {model}" if model else operation


def pair_attributes(
    pair_digest: str | None, target_digest: str | None, draft_digest: str | None
) -> dict[str, str]:
    out = {}
    for key, value in (
        (PAIR_DIGEST, pair_digest),
        (TARGET_DIGEST, target_digest),
        (DRAFT_DIGEST, draft_digest),
    ):
        if value:
            out[key] = value
    return out


def response_attributes(
    data: Mapping[str, Any] | None, spec: Mapping[str, Any] | None
) -> dict[str, Any]:
    """GenAI response attributes from an OpenAI-style response body (or its last event)."""
    out: dict[str, Any] = {}
    data = data or {}
    if isinstance(data.get("id"), str):
        out[RESPONSE_ID] = data["id"]
    if isinstance(data.get("model"), str):
        out[RESPONSE_MODEL] = data["model"]
    usage = data.get("usage")
    if isinstance(usage, Mapping):
        if isinstance(usage.get("prompt_tokens"), int):
            out[INPUT_TOKENS] = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            out[OUTPUT_TOKENS] = usage["completion_tokens"]
    reasons = [
        c.get("finish_reason")
        for c in data.get("choices") or []
        if isinstance(c, Mapping) and isinstance(c.get("finish_reason"), str)
    ]
    if reasons:
        out[RESPONSE_FINISH_REASONS] = reasons
    if spec:
        out[SPEC_DRAFT_TOKENS] = int(spec.get("num_draft_tokens") or 0)
        out[SPEC_ACCEPTED_TOKENS] = int(spec.get("num_accepted_draft_tokens") or 0)
    return out
