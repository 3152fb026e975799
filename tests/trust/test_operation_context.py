"""Services take the serving process's settings from the operation's context, never from the
process-global settings: two registries with different settings in one process (two apps,
an app beside the embedded CLI) each see their own signing key, log origin and home."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.contract.local import LocalBackend
from registry.services.system import initialise
from registry.settings import Settings, get_settings

ORIGIN_B = "example.org/pairreg-b"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_two_registries_in_one_process_follow_their_own_settings(
    home: Settings, tmp_path: Path
) -> None:
    a = home
    b = Settings(home=tmp_path / "b", database_url=a.db_url, log_origin=ORIGIN_B)
    initialise(b)  # the same database, its own home and audit key
    assert get_settings().home_dir == a.home_dir  # the global settings are A's
    assert b.signing_key_path.read_bytes() != a.signing_key_path.read_bytes()
    reg_a, reg_b = LocalBackend(a, "tester"), LocalBackend(b, "tester")

    # B signs with B's key under B's configured origin, and keeps its copy in B's home.
    cp = reg_b.sign_log_checkpoint()
    assert cp.created and cp.origin == ORIGIN_B
    assert cp.verifier_key.startswith(ORIGIN_B + "+")
    assert reg_b.get_log_checkpoint().verifier_key == cp.verifier_key
    assert list((b.home_dir / "log-checkpoints").glob("*.note"))
    assert not (a.home_dir / "log-checkpoints").exists()
    # A names the log by its own key (no origin configured), not by B's.
    mine = reg_a.get_log_checkpoint()
    assert mine.tree_size == cp.tree_size
    assert mine.verifier_key.startswith("pairreg/audit/") and mine.verifier_key != cp.verifier_key

    # Hardware profiles come from each registry's own home.
    hw = b.home_dir / "hardware"
    hw.mkdir()
    (hw / "toy-b.toml").write_text(
        'name = "toy-b"\nmemory_bytes = 64e6\nmemory_bandwidth = 1e8\n'
        'flops = { float32 = 1e9 }\nprice_per_hour = 3.6\nsource = "test"\n'
    )
    names_b = {p.name for p in reg_b.list_hardware().items}
    names_a = {p.name for p in reg_a.list_hardware().items}
    assert "toy-b" in names_b and "toy-b" not in names_a
    assert names_b - names_a == {"toy-b"}  # the shipped ones are shared
