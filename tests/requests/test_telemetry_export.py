"""Telemetry from recorded vLLM metrics text, workload drift flags, and serving exports."""

from __future__ import annotations

import json
import shlex

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from api.app import create_app
from registry.db import session_scope
from registry.errors import InvalidInput
from registry.services import exports
from registry.services import telemetry as svc
from registry.settings import Settings
from registry.tables import Artifact, DriftFlag, Measurement, Pair, TelemetrySample
from tests.requests.conftest import ACTOR, Served

# The shape vLLM (v1 engine) exposes on /metrics, trimmed to a few families.
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="chat-prod"}} 3.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="chat-prod"}} {drafts}
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="chat-prod"}} {draft_tokens}
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="chat-prod"}} {accepted}
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="chat-prod",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="chat-prod",position="1"}} {p1}
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="chat-prod"}} 123456.0
"""  # noqa: E501


def metrics(drafts: float, draft_tokens: float, accepted: float) -> str:
    return VLLM_METRICS.format(
        drafts=drafts, draft_tokens=draft_tokens, accepted=accepted,
        p0=accepted * 0.6, p1=accepted * 0.4,
    )  # fmt: skip


def _baseline(url: str, pair_digest: str, rate: float) -> None:
    with session_scope(url) as s:
        pair = s.scalar(select(Pair).where(Pair.pair_digest == pair_digest))
        s.add(Measurement(
            pair_id=pair.id, suite_name="default", suite_digest="0" * 64, settings={},
            settings_digest="0" * 64, runner_version="test", hardware={}, alpha=0.7,
            overall={"draft_acceptance_rate": rate}, categories={}, prompts=[], extra={},
            created_by=ACTOR,
        ))  # fmt: skip


def test_parse_sums_label_sets() -> None:
    text = metrics(10, 40, 30) + metrics(10, 40, 10).split("# HELP vllm:spec_decode_num")[0]
    parsed = svc.parse_vllm_metrics(text)
    assert parsed["num_drafts"] == 10 and parsed["num_draft_tokens"] == 40
    assert parsed["accepted_per_pos"] == {"0": 18.0, "1": 12.0}
    with pytest.raises(InvalidInput, match="no vllm:spec_decode"):
        svc.parse_vllm_metrics("# TYPE x counter\nx_total 1\n")


def test_online_acceptance_and_workload_flag(served: Served) -> None:
    s = served
    _baseline(s.url, s.pair_b, 0.62)

    def push(*counts: float):  # type: ignore[no-untyped-def]
        with session_scope(s.url) as session:
            return svc.ingest_prometheus(
                session, deployment=s.deployment, text=metrics(*counts), source="test",
                min_drafted=5000, actor=ACTOR,
            )  # fmt: skip

    first = push(100, 400, 300)
    assert first.deltas["num_draft_tokens"] == 0 and first.online_acceptance is None
    healthy = push(1100, 4400, 2700)  # +4000 drafted, +2400 accepted: 0.60
    assert healthy.online_acceptance == pytest.approx(0.6)
    assert healthy.baseline_acceptance == pytest.approx(0.62)
    assert healthy.margin == pytest.approx(0.05)  # the default policy's [drift] margin
    assert not healthy.flagged and healthy.pair_digest == s.pair_b
    drop = push(2100, 8400, 3700)  # +4000, +1000: window 8000 drafted, 3400 accepted
    assert drop.window_drafted == 8000 and drop.online_acceptance == pytest.approx(0.425)
    assert drop.flagged and drop.flag_id is not None
    again = push(3100, 12400, 4700)
    assert again.flagged and again.flag_id == drop.flag_id  # one open flag, not one per scrape
    restarted = push(10, 40, 10)
    assert restarted.reset and restarted.deltas["num_draft_tokens"] == 40
    with session_scope(s.url) as session:
        flags = session.scalars(select(DriftFlag).where(DriftFlag.kind == "workload")).all()
        assert len(flags) == 1 and flags[0].state == "open"
        assert flags[0].effects["baseline_acceptance"] == pytest.approx(0.62)
        assert session.query(TelemetrySample).count() == 5


def test_telemetry_over_http(home: Settings, served: Served) -> None:
    token = json.loads(home.credentials_path.read_text())["token"]
    client = TestClient(create_app(home))
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "text/plain"}
    params = {"deployment": served.deployment}
    r = client.post("/v1/telemetry/prometheus", params=params, headers=auth,
                    content=metrics(1, 4, 2))  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["pair_digest"] == served.pair_b
    bad = client.post("/v1/telemetry/prometheus", params=params, headers=auth, content="nope 1\n")
    assert bad.status_code == 422 and bad.json()["field"] == "text"


def test_export_requires_pinned_sources(served: Served) -> None:
    """Local parts export as their directories once their files match the manifest; Hub
    parts only at a 40-hex commit."""
    s = served
    with session_scope(s.url) as session:
        local = exports.export_serving(session, deployment=s.deployment, engine="vllm")
    assert local.args[local.args.index("--model") + 1] == str(s.target_dir)
    assert "--revision" not in local.args
    spec = json.loads(local.args[local.args.index("--speculative-config") + 1])
    assert spec["model"] == str(s.draft_dir) and "revision" not in spec
    weights = s.draft_dir / "model.safetensors"
    weights.write_bytes(b"other bytes")
    with session_scope(s.url) as session, pytest.raises(InvalidInput, match="model.safetensors"):
        exports.export_serving(session, deployment=s.deployment, engine="vllm")
    with session_scope(s.url) as session:
        session.execute(
            update(Artifact).where(Artifact.lineage == "acme/target").values(
                source_kind="hf", hub_repo="acme/target", hub_commit="main",
                source="hf://acme/target@main",
            )
        )  # fmt: skip
    with session_scope(s.url) as session, pytest.raises(InvalidInput, match="no pinned Hub"):
        exports.export_serving(session, deployment=s.deployment, engine="vllm")
    with session_scope(s.url) as session:
        for lineage, commit in (("acme/target", "a" * 40), ("acme/draft", "b" * 40)):
            session.execute(
                update(Artifact).where(Artifact.lineage == lineage).values(
                    source_kind="hf", hub_repo=lineage, hub_commit=commit,
                    source=f"hf://{lineage}@{commit}",
                )
            )  # fmt: skip
    with session_scope(s.url) as session:
        v = exports.export_serving(session, deployment=s.deployment, engine="vllm")
        g = exports.export_serving(session, deployment=s.deployment, engine="sglang")
    assert v.pair_digest == s.pair_b
    args = v.args
    assert args[args.index("--model") + 1] == "acme/target"
    assert args[args.index("--revision") + 1] == "a" * 40
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "model": "acme/draft", "revision": "b" * 40,
                    "num_speculative_tokens": 3}  # fmt: skip
    assert shlex.split(v.command)[3:] == args
    ga = g.args
    assert ga[ga.index("--speculative-algorithm") + 1] == "STANDALONE"
    assert ga[ga.index("--speculative-draft-model-revision") + 1] == "b" * 40
    assert ga[ga.index("--speculative-num-steps") + 1] == "3"
