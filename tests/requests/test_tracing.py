"""OpenTelemetry spans from the proxy and embedded serving (GenAI semantic conventions),
read back with the SDK's in-memory exporter; OTEL_* settings decide whether tracing is on."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from api import tracing
from api.app import create_app
from api.engines import Generation, LoadedEngine
from api.proxy import create_proxy_app
from registry.db import session_scope
from registry.services import pairs as pair_svc
from registry.settings import Settings
from tests.requests.conftest import Served
from tests.requests.test_proxy import _fake_vllm
from tests.serve_process import mint

TARGET, DRAFT, PAIR = "t" * 64, "d" * 64, "p" * 64


def _memory() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_attribute_names_are_the_semantic_conventions() -> None:
    assert (tracing.OPERATION_NAME, tracing.PROVIDER_NAME) == (
        "gen_ai.operation.name", "gen_ai.provider.name"
    )  # fmt: skip
    assert (tracing.REQUEST_MODEL, tracing.RESPONSE_MODEL, tracing.RESPONSE_ID) == (
        "gen_ai.request.model", "gen_ai.response.model", "gen_ai.response.id"
    )  # fmt: skip
    assert (tracing.INPUT_TOKENS, tracing.OUTPUT_TOKENS) == (
        "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"
    )  # fmt: skip
    assert (tracing.TEXT_COMPLETION, tracing.CHAT) == ("text_completion", "chat")


@pytest.mark.parametrize(
    ("env", "kind"),
    [
        ({}, None),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, None),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "OTLPSpanExporter"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "OTLPSpanExporter"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, "OTLPSpanExporter"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "ConsoleSpanExporter"),
    ],
)
def test_off_by_default_and_on_with_otel_settings(env: dict[str, str], kind: str | None) -> None:
    exporter = tracing._exporter_from_env(env)
    assert (type(exporter).__name__ if exporter is not None else None) == kind
    provider = tracing.provider_from_env(env)
    assert (provider is None) == (kind is None)
    if provider is not None:
        provider.shutdown()


@dataclass
class _Tagger:
    tags: list[tuple[Any, ...]] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    def tag(self, request_id: str, deployment: str, **kw: Any) -> bool:
        self.tags.append((request_id, deployment, kw))
        return True

    def close(self, timeout: float = 0) -> None:
        pass


class _Backend:
    def get_deployment(self, *, name: str) -> Any:
        return SimpleNamespace(current_pair_digest=PAIR)

    def get_pair(self, *, ref: str) -> Any:
        return SimpleNamespace(
            target=SimpleNamespace(manifest_digest=TARGET),
            drafter=SimpleNamespace(manifest_digest=DRAFT),
        )


def test_proxy_spans(tmp_path) -> None:  # type: ignore[no-untyped-def]
    provider, exporter = _memory()
    tagger = _Tagger()
    app = create_proxy_app(
        deployment="vllm-prod", upstream="http://vllm.internal:8001", settings=Settings(),
        spool_dir=tmp_path, backend=_Backend(), tagger=tagger, refresh_s=60,
        tracer_provider=provider, transport=httpx.ASGITransport(app=_fake_vllm()),
    )  # fmt: skip
    with TestClient(app) as client:
        plain = client.post("/v1/completions", headers={"x-request-id": "r-plain"},
                            json={"model": "m-1", "prompt": "hi", "max_tokens": 9})  # fmt: skip
        assert plain.status_code == 200
        streamed = client.post("/v1/completions", headers={"x-request-id": "r-stream"},
                               json={"model": "m-1", "prompt": "hi", "stream": True})  # fmt: skip
        assert streamed.status_code == 200 and "[DONE]" in streamed.text
        missing = client.post("/v1/chat/completions", json={"model": "m-1", "messages": []})
        assert missing.status_code in (404, 405)
    spans = {s.attributes[tracing.REQUEST_ID]: s for s in exporter.get_finished_spans()}
    assert len(spans) == 3 and len(tagger.tags) == 2
    one = spans["r-plain"]
    assert one.name == "text_completion m-1" and one.kind == SpanKind.CLIENT
    assert dict(one.attributes) == {
        "gen_ai.operation.name": "text_completion",
        "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": "m-1",
        "gen_ai.request.max_tokens": 9,
        "gen_ai.response.model": "m-1",
        "gen_ai.response.id": "cmpl-1",
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 5,
        "gen_ai.usage.output_tokens": 11,
        "pairreg.pair.digest": PAIR,
        "pairreg.target.digest": TARGET,
        "pairreg.draft.digest": DRAFT,
        "pairreg.deployment": "vllm-prod",
        "pairreg.request.id": "r-plain",
        "pairreg.spec.draft_tokens": 12,
        "pairreg.spec.accepted_tokens": 7,
        "server.address": "vllm.internal",
        "server.port": 8001,
    }
    two = spans["r-stream"]
    assert two.attributes["gen_ai.response.id"] == "cmpl-2"
    assert two.attributes["gen_ai.usage.output_tokens"] == 11
    assert two.attributes["pairreg.spec.accepted_tokens"] == 7
    assert two.status.status_code != StatusCode.ERROR
    chat = next(s for rid, s in spans.items() if rid not in ("r-plain", "r-stream"))
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.status.status_code == StatusCode.ERROR
    assert chat.attributes["error.type"] == str(missing.status_code)


class _Run(SimpleNamespace):
    pass


class _Cache:
    def __init__(self, engine: LoadedEngine):
        self.engine = engine

    def get(self, backend: Any, pair_digest: str) -> LoadedEngine:
        assert pair_digest == self.engine.pair_digest
        return self.engine


class _Engine(LoadedEngine):
    def generate(self, prompt: str, max_tokens: int, on_text: Any = None) -> Generation:
        run = _Run(steps=3, drafted=12, accepted=8, output_ids=[1, 2, 3, 4, 5],
                   accepted_per_position=[3, 3, 2, 0])  # fmt: skip
        return Generation(text="hello", prompt_tokens=4, run=run)


def test_embedded_serving_span(home: Settings, served: Served) -> None:
    provider, exporter = _memory()
    app = create_app(home, tracer_provider=provider)
    with session_scope(served.url) as session:
        pair = pair_svc.get_pair(session, ref=served.pair_b)
    app.state.engines = _Cache(
        _Engine(pair.pair_digest, None, pair.target.manifest_digest,
                pair.drafter.manifest_digest if pair.drafter else None)
    )  # fmt: skip
    token = mint(served.url, role="ingest", name="serving")
    client = TestClient(app)
    r = client.post("/v1/completions", headers={"Authorization": f"Bearer {token}",
                                                "x-request-id": "emb-1"},
                    json={"model": served.deployment, "prompt": "x", "max_tokens": 5})  # fmt: skip
    assert r.status_code == 200, r.text
    (span,) = exporter.get_finished_spans()
    a = span.attributes
    assert span.name == f"text_completion {served.deployment}"
    assert span.kind == SpanKind.INTERNAL
    assert a["gen_ai.provider.name"] == "pairreg" and a["gen_ai.response.id"] == "emb-1"
    assert a["pairreg.pair.digest"] == served.pair_b
    assert a["pairreg.target.digest"] == pair.target.manifest_digest
    assert a["pairreg.draft.digest"] == pair.drafter.manifest_digest
    assert a["pairreg.deployment"] == served.deployment
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (4, 5)
    assert a["gen_ai.response.finish_reasons"] == ("length",)
    body = json.loads(r.text)
    assert (
        a["pairreg.spec.draft_tokens"]
        == body["metrics"]["speculative_decoding"]["num_draft_tokens"]
        == 12
    )
