"""Acceptance curves: exported with provenance in the shape vLLM's synthetic rejection
sampler replays, imported only for a registered pair whose provenance and numbers agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry import db
from registry.db import session_scope
from registry.errors import Conflict, InvalidInput, NotFound
from registry.governance.policy import settings_digest
from registry.records.lifecycle import AcceptanceCurve
from registry.services import curves
from tests.core.conftest import cli  # noqa: F401 - pytest fixture
from tests.lifecycle.test_k_schedule import PER_POSITION, _pair


def _fresh(tmp: Path, name: str) -> str:
    url = f"sqlite:///{tmp / name}.db"
    db.upgrade(url)
    return url


def test_export_import_and_refusals(tmp_path: Path) -> None:
    src = _fresh(tmp_path, "src")
    digest = _pair(src, tmp_path / "a")
    with session_scope(src) as s:
        curve = curves.export_acceptance_curve(s, pair=digest)
    prov = curve.provenance
    assert prov.pair_digest == digest and prov.suite_digest == "s" * 64
    assert prov.engine == "pairreg-runner" and prov.engine_version == "test-1"
    assert prov.measured_k == 4 and prov.settings_digest == settings_digest(prov.sampling)
    overall = curve.curves["overall"]
    assert [p.k for p in overall] == list(range(1, 9))
    assert [p.source for p in overall] == ["measured"] * 4 + ["extrapolated"] * 4
    assert overall[3].synthetic_acceptance_rates == pytest.approx(PER_POSITION)
    assert overall[3].acceptance_length == pytest.approx(1 + sum(PER_POSITION))
    assert set(curve.curves) == {"overall", "code"}
    assert curve.vllm_replay == {
        "num_speculative_tokens": 4,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": overall[3].synthetic_acceptance_rates,
    }
    # another registry holding the same pair (same bytes, same digest) takes it, once
    dst = _fresh(tmp_path, "dst")
    assert _pair(dst, tmp_path / "b") == digest
    with session_scope(dst) as s:
        first = curves.import_acceptance_curve(s, curve=curve, actor="t")
        again = curves.import_acceptance_curve(s, curve=curve, actor="t")
    assert first.created and not again.created and first.digest == again.digest

    def refused(exc: type[Exception], field: str, **change: object) -> None:
        doc = curve.model_dump(mode="json")
        for path, value in change.items():
            node = doc
            keys = path.split("__")
            for key in keys[:-1]:
                node = node[int(key)] if isinstance(node, list) else node[key]
            node[keys[-1]] = value
        bad = AcceptanceCurve.model_validate(doc)
        with session_scope(dst) as s, pytest.raises(exc) as err:
            curves.import_acceptance_curve(s, curve=bad, actor="t")
        assert err.value.field == field  # type: ignore[attr-defined]

    refused(NotFound, "provenance.pair_digest", provenance__pair_digest="f" * 64)
    refused(InvalidInput, "provenance.settings_digest", provenance__sampling={"k": 4, "seed": 9})
    refused(Conflict, "provenance.measured_k", provenance__measured_k=6)
    refused(InvalidInput, "curves", curves__overall__1__synthetic_acceptance_rates=[0.5, 0.9])
    refused(InvalidInput, "curves", curves__overall__0__acceptance_length=2.5)
    refused(InvalidInput, "curve.format", format="other/9")
    sampling = {**curve.provenance.sampling, "method": "eagle3"}
    refused(
        Conflict,
        "provenance.sampling",
        provenance__sampling=sampling,
        provenance__settings_digest=settings_digest(sampling),
    )
    with session_scope(dst) as s:
        from sqlalchemy import func, select

        from registry.tables import AcceptanceCurveRow

        assert s.scalar(select(func.count()).select_from(AcceptanceCurveRow)) == 1
    db.dispose_engines()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cli_round_trip(home, cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    digest = _pair(home.db_url, tmp_path)
    out = tmp_path / "curve.json"
    r = cli("curve", "export", digest[:12], "-o", str(out))
    assert r.rc == 0, r.err
    assert AcceptanceCurve.model_validate_json(out.read_text()).provenance.pair_digest == digest
    r = cli("curve", "import", str(out), "--json")
    assert r.rc == 0 and r.json()["created"] is True
    assert cli("curve", "import", str(out), "--json").json()["created"] is False
    (tmp_path / "bad.json").write_text("{}")
    r = cli("curve", "import", str(tmp_path / "bad.json"))
    assert r.rc == 2 and "not an acceptance curve" in r.err
    r = cli("mlflow", "map", "chat", "--lineage", "acme/chat", "--alias", "champion", "--json")
    assert r.rc == 0 and r.json()["aliases"] == ["champion"]
    r = cli("mlflow", "map", "chat", "--lineage", "acme/other")
    assert r.rc == 2 and "already maps" in r.err
    r = cli("k-schedule", digest[:12], "--hardware", "a100-80gb", "--context", "512", "--json")
    assert r.rc == 0 and r.json()["vllm"]["num_speculative_tokens_per_batch_size"][0][0] == 1
