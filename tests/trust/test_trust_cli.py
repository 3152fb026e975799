"""The trust commands as a user runs them: a signed artifact, proofs, a C2SP checkpoint, a
witness that co-signs and then refuses a rewritten history loudly, retention."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from registry.db import get_engine
from registry.settings import Settings
from registry.trust import audit_tree
from tests.fixtures import bypass_append_only, write_fake_model
from tests.trust.test_model_signing import make_signer


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_trust_commands(home: Settings, cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = write_fake_model(tmp_path / "m", weights=b"weights")
    alice = make_signer(tmp_path, "alice")
    sig = alice.sign(model, tmp_path / "m.sig")
    (tmp_path / "alice.pub").write_text(alice.public)
    added = cli("artifact", "add", str(model), "--name", "acme/t", "--role", "target",
                "--signature", str(sig), "--signer-key", str(tmp_path / "alice.pub"))  # fmt: skip
    assert added.rc == 0, added.err
    assert f"key signature by {alice.fingerprint}" in added.out
    shown = cli("artifact", "show", "acme/t@v1")
    assert "signature" in shown.out and alice.fingerprint[:20] in shown.out
    (model / "extra.txt").write_text("unsigned")
    refused = cli("artifact", "add", str(model), "--name", "acme/t", "--role", "target",
                  "--signature", str(sig), "--signer-key", str(tmp_path / "alice.pub"))  # fmt: skip
    assert refused.rc == 2 and "extra.txt" in refused.err
    assert len(refused.err.strip().splitlines()) == 1

    cp1 = tmp_path / "cp1.txt"
    made = cli("audit", "checkpoint", "-o", str(cp1))
    assert made.rc == 0, made.err
    vkey = made.out.split("log verifier key: ")[1].split()[0]
    proof = cli("audit", "prove", "--event", "2", "--json").json()
    assert proof["seq"] == 2 and proof["event"]["action"] == "artifact.added"

    w = ["--name", "w.example/1", "--key", str(tmp_path / "w.key"),
         "--state", str(tmp_path / "w.state"), "--log-key", vkey]  # fmt: skip
    first = cli("audit", "witness", str(cp1), *w)
    assert first.rc == 0, first.err
    assert "\u2014 w.example/1 " in first.out and "first checkpoint" in first.err
    assert cli("token", "create", "--name", "ops", "--role", "reader").rc == 0
    size = int(cp1.read_text().splitlines()[1])
    cons = cli("audit", "consistency", str(size), "--json").json()
    assert cons["old_size"] == size and cons["new_size"] == size + 1
    assert cli("audit", "checkpoint").rc == 0
    second = cli("audit", "witness", *w)  # fetches the newest checkpoint itself
    assert second.rc == 0 and f"consistent with {size}" in second.err

    # Someone rewrites the first event, re-derives the tree and the log's checkpoint record.
    with get_engine(home.db_url).begin() as conn:
        bypass_append_only(conn)
        conn.execute(text("UPDATE audit_events SET actor = 'local:mallory' WHERE seq = 1"))
        audit_tree.rebuild(conn)
        conn.execute(text("DELETE FROM log_checkpoints"))
    # The tree matches the (rewritten) events, but not the checkpoint the log signed, whose
    # copy outside the database survived the deleted rows.
    rewritten = cli("audit", "verify")
    assert rewritten.rc == 1 and "log intact" in rewritten.out
    assert "signed checkpoints DIVERGED" in rewritten.out and "kept outside" in rewritten.out
    for kept in (home.signing_key_path.parent / "log-checkpoints").iterdir():
        kept.unlink()  # someone who reaches the key's directory too
    bad = cli("audit", "verify", "--checkpoint", str(cp1))
    assert bad.rc == 1 and "checkpoint FAILED" in bad.out
    assert cli("audit", "checkpoint").rc == 0
    fork = cli("audit", "witness", *w)
    assert fork.rc == 1 and "FORK DETECTED" in fork.err

    ret = cli("requests", "retention", "--set", "12", "--json")
    assert ret.rc == 0 and json.loads(ret.out)["months"] == 12
    low = cli("requests", "retention", "--set", "3")
    assert low.rc == 2 and "months" in low.err
    gone = cli("requests", "archive", "--before", "2020-01-01", "--to", str(tmp_path / "a"))
    assert gone.rc == 2 and "no whole ingest batch" in gone.err
