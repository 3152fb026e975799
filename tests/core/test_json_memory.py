"""``--json`` on every core command, and flat memory while hashing a large file."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from registry.settings import Settings
from tests.core.conftest import CliResult
from tests.core.test_pairs import ok

ARTIFACT_FIELDS = {
    "id",
    "lineage",
    "version",
    "ref",
    "role",
    "source",
    "source_kind",
    "hub_repo",
    "hub_revision",
    "hub_commit",
    "local_path",
    "manifest_digest",
    "signing_root",
    "total_size",
    "file_count",
    "tokenizer_digest",
    "vocab_digest",
    "vocab_size",
    "facts",
    "provenance",
    "provenance_missing",
    "signature",
    "registered_by",
    "registered_at",
    "manifest",
    "signature_bundle",
}
PAIR_FIELDS = {
    "id",
    "pair_digest",
    "target",
    "drafter",
    "method",
    "k",
    "config",
    "lossy",
    "status",
    "warnings",
    "registered_by",
    "registered_at",
}


def test_every_core_command_has_json(
    home: Settings, cli: Callable[..., CliResult], models: dict[str, Path]
) -> None:
    init = ok(cli("init", "--json"))
    assert set(init) == {
        "home",
        "database_url",
        "schema_revision",
        "upgraded",
        "admin_token_created",
        "credentials_path",
        "public_key_path",
    }
    assert set(ok(cli("db", "current", "--json"))) == {
        "database_url",
        "current",
        "head",
        "up_to_date",
    }
    assert set(ok(cli("db", "upgrade", "--json"))) == {"database_url", "before", "after"}

    added = ok(
        cli("artifact", "add", str(models["t1"]), "--name", "a/t", "--role", "target", "--json")
    )
    assert set(added) == {"artifact", "created", "target_changed"}
    assert set(added["artifact"]) == ARTIFACT_FIELDS
    assert set(ok(cli("artifact", "show", "a/t@v1", "--json"))) == ARTIFACT_FIELDS
    listed = ok(cli("artifact", "list", "--json"))
    assert set(listed) == {"items", "next_cursor"} and set(listed["items"][0]) == ARTIFACT_FIELDS
    verified = ok(cli("artifact", "verify", "a/t@v1", "--json"))
    assert set(verified) == {
        "artifact_id",
        "manifest_digest",
        "path",
        "ok",
        "changed",
        "missing",
        "added",
    }

    registered = ok(
        cli(
            "pair",
            "register",
            "--target",
            "a/t@v1",
            "--method",
            "prompt_lookup",
            "--k",
            "3",
            "--json",
        )
    )
    assert set(registered) == {"pair", "created"} and set(registered["pair"]) == PAIR_FIELDS
    assert set(ok(cli("pair", "show", "1", "--json"))) == PAIR_FIELDS
    pairs = ok(cli("pair", "list", "--json"))
    assert set(pairs) == {"items", "next_cursor"} and set(pairs["items"][0]) == PAIR_FIELDS


def test_hashing_memory_stays_flat(tmp_path: Path) -> None:
    """A 64 MiB file hashes with a few MiB of extra memory (streamed, one 1 MiB buffer)."""
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "weights.bin", "wb") as fh:
        chunk = bytes(range(256)) * 4096
        for _ in range(64):
            fh.write(chunk)
    code = textwrap.dedent(
        f"""
        import resource, sys
        from registry.artifacts.manifest import build_manifest
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        m = build_manifest({str(big)!r}, workers=2)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(m.total_size, (after - before) // 1024)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    size, delta_mib = int(out[0]), int(out[1])
    assert size == 64 << 20
    assert delta_mib < 32, f"peak RSS grew {delta_mib} MiB hashing a 64 MiB file"
