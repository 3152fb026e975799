"""The whole governance flow on the real pair, through the real CLI and the real
``huggingface_hub`` client against the loopback Hub:

the parts are published as commits on branches → target-v1 and its draft registered from
``hf://`` (provenance: trained against target-v1's digest) → validated on the chat suite,
greedy and sampled at temperature 0.7 → promoted → target-v2 appears as a new commit on the
watched branch → ``watch`` registers it → the worker measures the candidate → drift flag on
``code`` → promoting the candidate is refused → draft-v2 (trained against target-v2)
registered from its branch's next commit → its pair validates and is promoted → chat
requests served by ``pairreg serve`` with the official openai client and tagged → ``audit
request`` names the pair → an offline bundle verifies against the weights downloaded anew.

α relations, not values: target-v2 with the old draft is below target-v1 on ``code`` beyond
the flag's interval; ``creative`` does not flag and moves less; draft-v2 restores ``code``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from builders.real import read_build_manifest
from tests.serve_process import ApiServer, mint

pytestmark = pytest.mark.real
HERE = Path(__file__).parent
POLICY, SAMPLED = HERE / "policy_real.toml", HERE / "policy_real_sampled.toml"
TARGET_REPO, DRAFT_REPO = "smollm2/instruct", "smollm2/draft"
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Complete this Python code.\n\ndef is_even(n):\n"},
]


def _files(directory: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir()) if p.is_file()}


def _ok(r: Any) -> Any:
    assert r.rc == 0, r.out + r.err
    return r


def _add(cli: Any, source: str, name: str, role: str, prov: dict[str, str]) -> dict:
    args = ["artifact", "add", source, "--name", name, "--role", role, "--json"]
    for key, value in sorted(prov.items()):
        args += [f"--{key.replace('_', '-')}", value]
    return _ok(cli(*args)).json()


def _pair(cli: Any, target: str, draft: str) -> dict:
    r = cli("pair", "register", "--target", target, "--draft", draft,
            "--method", "draft_model", "--k", "4", "--json")  # fmt: skip
    return _ok(r).json()["pair"]


def _alpha(cli: Any, measurement_id: int) -> dict[str, float]:
    m = _ok(cli("measurement", "show", str(measurement_id), "--json")).json()
    return {"overall": m["alpha"], **{c: v["alpha"] for c, v in m["categories"].items()}}


def _validate(cli: Any, digest: str, *how: str) -> dict:
    val = _ok(cli("validate", digest, *how, "--json")).json()
    assert val["passed"], val["gates"]
    return val


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # one dialect: minutes per run
def test_real_pair_drift_and_maintenance(  # type: ignore[no-untyped-def]
    home, cli, real, hub_server, tmp_path, no_mlflow
) -> None:
    built = read_build_manifest(real.root)
    prov, digests = built["provenance"], built["manifest_digests"]
    c1 = hub_server.add_repo(TARGET_REPO, _files(real.target_v1))
    hub_server.add_repo(DRAFT_REPO, _files(real.draft))
    target = _add(cli, f"hf://{TARGET_REPO}@main", TARGET_REPO, "target", prov["target-v1"])
    assert target["artifact"]["hub_commit"] == c1
    # the Hub snapshot's manifest is the built directory's: the same bytes, the same digest
    assert target["artifact"]["manifest_digest"] == digests["target-v1"]
    draft = _add(cli, f"hf://{DRAFT_REPO}@main", DRAFT_REPO, "draft", prov["draft"])
    assert draft["artifact"]["provenance"]["trained_against"] == digests["target-v1"]
    pair = _pair(cli, f"{TARGET_REPO}@v1", f"{DRAFT_REPO}@v1")
    assert pair["warnings"] == []  # the draft's recorded target is this target
    _ok(cli("policy", "put", str(POLICY)))
    _ok(cli("policy", "put", str(SAMPLED)))
    _ok(cli("deployment", "create", "chat-prod", "--policy", "real"))

    val = _validate(cli, pair["pair_digest"], "--deployment", "chat-prod")
    a_v1 = _alpha(cli, val["measurement_id"])
    sampled = _validate(cli, pair["pair_digest"], "--policy", "real-sampled")
    a_v1_t07 = _alpha(cli, sampled["measurement_id"])
    shown = _ok(cli("measurement", "show", str(val["measurement_id"]), "--json")).json()
    rendering = shown["extra"]["rendering"]  # measured on the chat template, as served
    assert rendering["mode"] == "chat" and len(rendering["chat_template_digest"]) == 64
    _ok(cli("promote", pair["pair_digest"], "--deployment", "chat-prod",
            "--reason", "first release"))  # fmt: skip

    # the target moves: target-v2 is the watched branch's next commit
    c2 = hub_server.update_branch(TARGET_REPO, _files(real.target_v2))
    watched = {w["lineage"]: w for w in _ok(cli("watch", "--json")).json()}
    assert watched[TARGET_REPO]["registered"] is True
    assert watched[TARGET_REPO]["current_commit"] == c2
    assert watched[DRAFT_REPO]["registered"] is False  # the draft's branch did not move
    # one drift re-measurement per policy the pair passed: greedy and sampled
    queued = _ok(cli("jobs", "list", "--state", "queued", "--json")).json()["items"]
    assert sorted(j["args"]["policy"] for j in queued) == ["real", "real-sampled"]
    assert all(j["args"]["drift"] for j in queued)
    [candidate] = {j["args"]["pair_digest"] for j in queued}
    for _ in queued:
        _ok(cli("worker", "--once", "--lease", "900"))
    done = {}
    for j in queued:
        job = _ok(cli("jobs", "show", str(j["id"]), "--json")).json()
        assert job["state"] == "done", job
        done[j["args"]["policy"]] = job["result"]["measurement_id"]
    a_v2 = _alpha(cli, done["real"])
    a_v2_t07 = _alpha(cli, done["real-sampled"])
    sys.__stderr__.write(
        f"\nreal pair α (chat suite, greedy) v1/draft {a_v1}\n  v1/draft at T=0.7 {a_v1_t07}\n"
        f"  v2/draft {a_v2}\n  v2/draft at T=0.7 {a_v2_t07}\n"
    )
    flags = _ok(cli("drift", "list", "--state", "open", "--json")).json()["items"]
    # the greedy comparison flags; the sampled one (4 prompts per category) cannot reach
    # significance after Holm, by construction, and is recorded for the figures only
    assert [(f["pair_digest"], f["policy_name"]) for f in flags] == [(candidate, "real")]
    effects = flags[0]["effects"]["categories"]
    code, creative = effects["code"], effects["creative"]
    sys.__stderr__.write(
        f"  code diff {code['diff']:+.3f} CI [{code['ci_low']:+.3f}, "
        f"{code['ci_high']:+.3f}] p_holm {code['p_holm']:.4f} drifted {code['drifted']}; "
        f"creative diff {creative['diff']:+.3f} drifted {creative['drifted']}\n"
    )
    assert code["drifted"] and code["ci_high"] < 0 and code["p_holm"] < 0.05
    assert a_v2["code"] < a_v1["code"]
    # the move is on code: creative does not flag and moves less than code
    assert not creative["drifted"] and creative["diff"] > code["diff"]
    assert _ok(cli("pair", "show", candidate, "--json")).json()["status"] == "drifted"
    r = cli("promote", candidate, "--deployment", "chat-prod", "--reason", "v2")
    assert r.rc == 2 and "flags" in r.err

    # maintenance: draft-v2, trained against target-v2, is the draft branch's next commit
    hub_server.update_branch(DRAFT_REPO, _files(real.draft_v2))
    draft2 = _add(cli, f"hf://{DRAFT_REPO}@main", DRAFT_REPO, "draft", prov["draft-v2"])
    assert draft2["artifact"]["version"] == 2
    assert draft2["artifact"]["provenance"]["trained_against"] == digests["target-v2"]
    pair2 = _pair(cli, f"{TARGET_REPO}@v2", f"{DRAFT_REPO}@v2")
    assert pair2["warnings"] == []
    val2 = _validate(cli, pair2["pair_digest"], "--deployment", "chat-prod")
    a_v2d2 = _alpha(cli, val2["measurement_id"])
    sys.__stderr__.write(f"  v2/draft-v2 {a_v2d2}\n")
    assert a_v2d2["code"] > a_v2["code"] + (a_v1["code"] - a_v2["code"]) / 2
    _ok(cli("promote", pair2["pair_digest"], "--deployment", "chat-prod",
            "--reason", "draft re-distilled for v2"))  # fmt: skip
    dep = _ok(cli("deployment", "show", "chat-prod", "--json")).json()
    assert dep["current_pair_digest"] == pair2["pair_digest"]

    _serve_tag_and_audit(cli, home, real, pair2["pair_digest"], tmp_path)
    _ok(cli("audit", "verify"))


def _serve_tag_and_audit(cli: Any, home: Any, real: Any, digest: str, tmp_path: Path) -> None:
    """Chat requests on ``pairreg serve`` (the live pair, fetched from the Hub and verified),
    answered exactly as target-v2 answers alone, tagged, audited and bundled."""
    from openai import OpenAI

    from runner.measure import plain_greedy
    from runner.models import load_causal_lm, load_tokenizer
    from runner.render import encode_chat

    tok = load_tokenizer(real.target_v2)
    prompt_ids = encode_chat(tok, MESSAGES)
    ref = plain_greedy(load_causal_lm(real.target_v2), prompt_ids, 16)
    expected = tok.decode(ref, skip_special_tokens=True)
    token = mint(home.db_url, role="ingest", name="serving")
    server = ApiServer(home.db_url, tmp_path / "srv").start()
    try:
        client = OpenAI(base_url=f"{server.url}/v1", api_key=token, max_retries=0, timeout=600)
        raw = client.chat.completions.with_raw_response.create(
            model="chat-prod", messages=MESSAGES, max_tokens=16,
            extra_headers={"x-request-id": "real-chat-1"},
        )  # fmt: skip
        assert raw.headers["x-pairreg-pair-digest"] == digest
        assert raw.parse().choices[0].message.content == expected
        streamed = client.chat.completions.create(
            model="chat-prod", messages=MESSAGES, max_tokens=16, stream=True,
            extra_headers={"x-request-id": "real-chat-2"},
        )  # fmt: skip
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == expected
    finally:
        server.stop()

    shown = _ok(cli("audit", "request", "real-chat-1", "--json")).json()
    assert shown["tag"]["pair_digest"] == digest
    assert shown["tag"]["input_tokens"] == len(prompt_ids)
    assert shown["tag"]["output_tokens"] == len(ref)
    assert _ok(cli("audit", "request", "real-chat-2", "--json")).json()["tag"]["pair_digest"] == (
        digest
    )
    bundle = tmp_path / "bundle.json"
    _ok(cli("audit", "bundle", "real-chat-1", "-o", str(bundle)))
    fetched = json.loads(
        _ok(
            cli(
                "audit",
                "fetch-weights",
                str(bundle),
                "--cache-dir",
                str(tmp_path / "auditor"),
                "--json",
            )
        ).out  # fmt: skip
    )
    assert [f["role"] for f in fetched] == ["target", "drafter"] and all(f["ok"] for f in fetched)
    weights = [f"{f['role']}={f['path']}" for f in fetched]
    args = ["audit", "verify-bundle", str(bundle), "--public-key", str(home.public_key_path)]
    for w in weights:
        args += ["--weights", w]
    _ok(cli(*args))
