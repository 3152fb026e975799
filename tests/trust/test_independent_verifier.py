"""Checkpoints, cosignatures, inclusion and consistency proofs checked by a second,
independent implementation: ``tlog_verify.mjs`` (Node.js, its own crypto module, written from
the RFCs and C2SP specs, sharing no code with pairreg). Tampered inputs must fail there too."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from registry.db import session_scope
from registry.services import transparency as tl
from registry.settings import Settings
from registry.trust import audit, signed_note
from registry.trust.witness import Witness

VERIFIER = Path(__file__).with_name("tlog_verify.mjs")
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


def node_verify(payload: dict[str, Any]) -> dict[str, Any]:
    assert NODE is not None
    done = subprocess.run(
        [NODE, str(VERIFIER)],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def flip(hex_hash: str) -> str:
    return ("0" if hex_hash[0] != "0" else "1") + hex_hash[1:]


def test_node_verifies_what_pairreg_serves(sqlite_url: str, tmp_path: Path, monkeypatch) -> None:
    from registry.services.system import initialise
    from registry.settings import reset_settings

    monkeypatch.setenv("PAIRREG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PAIRREG_DATABASE_URL", sqlite_url)
    reset_settings()
    settings = Settings()
    initialise(settings)
    url = settings.db_url

    def grow(n: int, start: int) -> None:
        with session_scope(url) as s:
            for i in range(start, start + n):
                audit.append_event(
                    s,
                    actor="test:writer",
                    action="test.event",
                    entity_type="test",
                    entity_id=i,
                    # Non-ASCII and floats: the leaf bytes are given, never re-serialised.
                    payload={"i": i, "text": "caf\u00e9 \u2014 ok", "ratio": 1.0, "x": 1e-7},
                )

    grow(20, 0)
    with session_scope(url) as s:
        c1 = tl.sign_log_checkpoint(s, actor="test:auditor")
    grow(44, 100)
    with session_scope(url) as s:
        c2 = tl.sign_log_checkpoint(s, actor="test:auditor")
        size = c2.tree_size
        inclusion = [
            tl.prove_inclusion(s, seq=q, tree_size=t).model_dump()
            for q, t in ((1, size), (2, size), (21, size), (size, size), (16, c1.tree_size))
        ]
        consistency = [
            tl.prove_consistency(s, old_size=o, new_size=n).model_dump()
            for o, n in ((c1.tree_size, size), (1, size), (32, size), (0, size), (size, size))
        ]
    assert (c1.tree_size, size) == (21, 65)

    witness = Witness(
        name="witness.example/w1",
        key_path=tmp_path / "w.key",
        state_path=tmp_path / "w.state",
        log_key=c2.verifier_key,
    )
    cosigned = witness.cosign(c2.note, lambda o, n: []).note
    # An extra signature from a key nobody configured is ignored (c2sp.org/signed-note).
    junk = base64.b64encode(b"ABCD" + bytes(64)).decode()
    foreign = cosigned + f"\u2014 someone.else/x {junk}\n"
    assert len(signed_note.parse_note(foreign).signatures) == 3
    forged = c2.note.replace(f"\n{size}\n", f"\n{size + 1}\n", 1)

    payload = {
        "log_key": c2.verifier_key,
        "witness_keys": [witness.verifier.vkey],
        "checkpoints": [c1.note, c2.note, cosigned, foreign, forged],
        "inclusion": inclusion
        + [
            dict(inclusion[2], path=[flip(inclusion[2]["path"][0])] + inclusion[2]["path"][1:]),
            dict(inclusion[3], leaf_data=inclusion[3]["leaf_data"].replace("caf", "cof")),
            dict(inclusion[0], root_hash=c1.root_hash),
        ],
        "consistency": consistency
        + [
            dict(consistency[0], old_root=flip(consistency[0]["old_root"])),
            dict(consistency[2], path=consistency[2]["path"][:-1]),
            dict(consistency[1], new_root=c1.root_hash),
        ],
    }
    out = node_verify(payload)
    cps = out["checkpoints"]
    assert [c["ok"] for c in cps] == [True, True, True, True, False]
    assert cps[0]["size"] == 21 and cps[0]["root"] == c1.root_hash
    assert cps[1]["size"] == 65 and cps[1]["root"] == c2.root_hash
    assert cps[1]["origin"] == c2.origin and cps[1]["signers"] == [c2.origin]
    assert cps[2]["signers"] == sorted([c2.origin, "witness.example/w1"])
    assert list(cps[2]["cosigned_at"]) == ["witness.example/w1"]
    assert "does not verify" in cps[4]["reason"]
    assert [p["ok"] for p in out["inclusion"]] == [True] * 5 + [False] * 3
    # The independent leaf hash equals pairreg's, from the same bytes.
    assert [p["leaf_hash"] for p in out["inclusion"][:5]] == [p["leaf_hash"] for p in inclusion]
    assert [p["ok"] for p in out["consistency"]] == [True] * 5 + [False] * 3
