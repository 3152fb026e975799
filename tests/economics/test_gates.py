"""``[economics]`` policy gates: parsed and checked, evaluated in validate beside the α gates,
recorded with the validation, and blocking promotion when they fail; and the economics
operation on a registered pair (facts read from its safetensors header and config)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from api.backend import local_backend
from registry.errors import Conflict, InvalidInput, NotFound
from registry.governance.policy import DEFAULTS, measurement_settings, parse_policy, policy_digest
from tests.economics.helpers import safetensors_bytes
from tests.fixtures import write_fake_model

LAYERS = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}
# A toy accelerator: 100 MB/s, 1 GFLOPS, 64 MB: small models become compute-bound quickly.
TOY = """name = "toy"
memory_bytes = 64e6
memory_bandwidth = 1e8
flops = { float32 = 1e9 }
price_per_hour = 3.6
source = "test"
"""
RESULT: dict[str, Any] = {
    "categories": {"code": {"prompts": 1, "alpha": 0.8, "tau": 2.5}},
    "overall": {"prompts": 1, "alpha": 0.8, "tau": 2.5},
    "prompts": [{"id": "c1", "category": "code", "accepted": 6, "rejections": 1}],
    "settings": {},
}


def _policy(econ: str) -> str:
    return f'name = "econ"\n[alpha]\nmin_overall = 0.1\nmin_per_category = 0.1\n{econ}'


@pytest.fixture
def setup(home: Any, tmp_path: Path) -> tuple[Any, str]:
    hw = Path(home.home_dir) / "hardware"
    hw.mkdir(parents=True)
    (hw / "toy.toml").write_text(TOY)
    backend = local_backend(home)
    # target: 4M float32 parameters (16 MB); draft: 256k (1 MB)
    t = write_fake_model(
        tmp_path / "t", hidden_size=64, weights=safetensors_bytes({"w": ("F32", [4096, 1024])}),
        config_extra=LAYERS,
    )  # fmt: skip
    d = write_fake_model(
        tmp_path / "d", hidden_size=64, weights=safetensors_bytes({"w": ("F32", [256, 1024])}),
        config_extra={**LAYERS, "num_hidden_layers": 1},
    )  # fmt: skip
    backend.add_artifact(source=str(t), name="acme/t", role="target")
    backend.add_artifact(source=str(d), name="acme/d", role="draft")
    pair = backend.register_pair(target="acme/t@v1", draft="acme/d@v1", method="draft_model", k=4)
    digest = pair.pair.pair_digest
    settings = measurement_settings(pair.pair.config, DEFAULTS["suite"])
    backend.store_measurement(
        pair=digest, suite_name="default", suite_digest="ab" * 32, settings=settings,
        runner_version="9.9", result=RESULT,
    )  # fmt: skip
    return backend, digest


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_economics_report_from_registered_facts(setup: tuple[Any, str]) -> None:
    backend, digest = setup
    r = backend.pair_economics(pair=digest, hardware="toy", batch=[1, 2, 64], context=256)
    assert r.target.params == 4096 * 1024 and r.target.weight_bytes == 4096 * 1024 * 4
    # KV: 2 x 4 layers x 2 KV heads x (64 / 4) head dim x 4 bytes = 1024 bytes per token
    assert r.target.kv_bytes_per_token == 1024
    assert r.drafter is not None and r.drafter.kv_bytes_per_token == 256
    assert r.tau == 2.5 and r.tau_source.startswith("measurement ")
    # batch 1 on toy: memory-bound, target step (16.78 MB + 256 kB) / 1e8 B/s = 0.17039 s
    p1 = r.points[0]
    assert p1.plain_step_s == pytest.approx((4096 * 1024 * 4 + 256 * 1024) / 1e8)
    assert p1.bound == "memory" and p1.speedup > 1
    # memory: (64e6 x 0.9 - 16.78 MB - 1.05 MB) / (256 x (1024 + 256)) = 121 sequences
    assert r.max_batch_spec == int((64e6 * 0.9 - 4096 * 1024 * 4 - 256 * 1024 * 4) // (256 * 1280))
    assert r.max_batch_plain > r.max_batch_spec
    assert r.points[-1].bound == "compute" and r.points[-1].speedup < 1
    assert r.break_even_batch is not None and 2 < r.break_even_batch <= 64
    assert r.points[0].cost_per_million_emitted == pytest.approx(
        3.6 / 3600 * p1.spec_step_s / 2.5 * 1e6
    )
    with pytest.raises(NotFound):
        backend.pair_economics(pair=digest, hardware="no-such-gpu")
    with pytest.raises(InvalidInput):
        backend.pair_economics(pair=digest, hardware="toy", batch=[0])


def test_policy_economics_section_is_checked() -> None:
    p = parse_policy(
        _policy('[economics]\nhardware = "h100-sxm"\nmin_speedup = {1 = 1.3, 16 = 1}\n')
    )
    assert p["economics"]["min_speedup"] == {"1": 1.3, "16": 1.0}
    for bad, field in (
        ('[economics]\nmin_speedup = {1 = 1.3}\n', "economics.hardware"),
        ('[economics]\nhardware = "x"\nmin_speedup = {one = 1.3}\n', "economics.min_speedup"),
        ('[economics]\nhardware = "x"\nmin_speedup = {1 = -1}\n', "economics.min_speedup"),
        ('[economics]\nhardware = "x"\nmax_draft_memory_fraction = 2\n',
         "economics.max_draft_memory_fraction"),
        ("[economics]\nmax_speedup = 1\n", "economics.max_speedup"),
    ):  # fmt: skip
        with pytest.raises(InvalidInput) as caught:
            parse_policy(_policy(bad))
        assert caught.value.field == field, bad
    # a policy without [economics] keeps the digest it had before the section existed
    plain = parse_policy(_policy(""))
    trimmed = {k: v for k, v in plain.items() if k != "economics"}
    assert policy_digest(plain) == policy_digest(trimmed)
    assert policy_digest(p) != policy_digest(plain)


def _gates(v: Any) -> dict[str, Any]:
    return {g.name: g for g in v.validation.gates}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_gates_pass_fail_and_block_promotion(setup: tuple[Any, str]) -> None:
    backend, digest = setup
    ok = backend.validate_pair(
        ref=digest,
        runner_version="9.9",
        policy_text=_policy(
            '[economics]\nhardware = "toy"\ncontext = 256\nmin_speedup = {1 = 1.3, 2 = 1.0}\n'
            "max_cost_per_million_tokens = 100000\nmax_draft_memory_fraction = 0.2\n"
        ),
    )
    g = _gates(ok)
    assert ok.validation.passed, [x for x in g.values() if not x.passed]
    assert {"economics.speedup.b1", "economics.speedup.b2", "economics.cost"} <= set(g)
    assert g["economics.draft_memory"].passed and "toy" in g["economics.speedup.b1"].required

    # the same pair under floors it cannot meet: a large batch is compute-bound, a tight
    # cost ceiling and a memory share below the draft's
    bad = backend.validate_pair(
        ref=digest,
        runner_version="9.9",
        policy_text=_policy(
            '[economics]\nhardware = "toy"\ncontext = 256\nmin_speedup = {1 = 1.3, 64 = 1.0}\n'
            "max_cost_per_million_tokens = 1\nmax_draft_memory_fraction = 0.001\n"
        ),
    )
    g = _gates(bad)
    assert not bad.validation.passed
    failed = {n for n, x in g.items() if not x.passed}
    assert failed == {"economics.speedup.b64", "economics.cost", "economics.draft_memory"}
    assert g["economics.speedup.b1"].passed
    # recorded with the validation
    stored = backend.get_validation(id=bad.validation.id)
    assert {x.name for x in stored.gates} >= failed

    backend.create_deployment(name="tput", policy="econ")
    with pytest.raises(Conflict):
        backend.promote(ref=digest, deployment="tput", reason="throughput endpoint")

    # an unknown profile is a failed gate, not a crash
    unknown = backend.validate_pair(
        ref=digest,
        runner_version="9.9",
        policy_text=_policy('[economics]\nhardware = "nope"\nmin_speedup = {1 = 1.0}\n'),
    )
    g = _gates(unknown)
    assert not g["economics"].passed and "nope" in (g["economics"].detail or "")
    # no [economics]: no economics gates
    plain = backend.validate_pair(ref=digest, runner_version="9.9", policy_text=_policy(""))
    assert not [n for n in _gates(plain) if n.startswith("economics")]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cli_table_json_compare_and_bad_input(setup: tuple[Any, str], cli: Any) -> None:
    _, digest = setup
    r = cli("economics", digest[:12], "--hardware", "toy", "--batch", "1,64", "--context", "256")
    assert r.rc == 0, r.err
    assert "predicted" in r.out and "break-even batch" in r.out and "toy" in r.out
    j = cli("economics", digest[:12], "--hardware", "toy", "--batch", "1,64", "--json")
    assert j.rc == 0 and [p["batch"] for p in j.json()["points"]] == [1, 64]
    assert j.json()["hardware"]["name"] == "toy"
    c = cli(
        "economics", digest[:12], "--hardware", "toy", "--batch", "1", "--tau", "1.5",
        "--compare", digest[:12], "--price", "2",
    )  # fmt: skip
    assert c.rc == 0 and "cheaper" in c.out
    bad = cli("economics", digest[:12], "--batch", "1,x")
    assert bad.rc == 2 and "--batch" in bad.err and "Traceback" not in bad.err
    missing = cli("economics", digest[:12], "--hardware", "nope")
    assert missing.rc == 2 and "no hardware profile 'nope'" in missing.err
    hw = cli("hardware", "list", "--json")
    names = {p["name"] for p in hw.json()}
    assert {"toy", "h100-sxm", "l4"} <= names
