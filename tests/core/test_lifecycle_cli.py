"""The services obey the pair lifecycle table: deprecate and retire go through once, a move
the table does not allow is refused with exit 2, and every move is an audit event naming its
lifecycle event."""

from __future__ import annotations


def test_deprecate_then_retire_through_the_cli(url, cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.fixtures import write_fake_model

    t = write_fake_model(tmp_path / "t")
    d = write_fake_model(tmp_path / "d", hidden_size=32, weights=b"d")
    assert cli("artifact", "add", str(t), "--name", "a/t", "--role", "target").rc == 0
    assert cli("artifact", "add", str(d), "--name", "a/d", "--role", "draft").rc == 0
    r = cli("pair", "register", "--target", "a/t@v1", "--draft", "a/d@v1", "--method",
            "draft_model", "--k", "2", "--json")  # fmt: skip
    digest = r.json()["pair"]["pair_digest"]
    r = cli("pair", "deprecate", digest[:12], "--reason", "superseded", "--json")
    assert r.rc == 0 and r.json()["status"] == "deprecated"
    r = cli("pair", "deprecate", digest[:12], "--reason", "again")
    assert r.rc == 2 and "cannot apply deprecated" in r.err
    r = cli("pair", "retire", digest[:12], "--reason", "gone", "--json")
    assert r.rc == 0 and r.json()["status"] == "retired"
    events = cli("audit", "events", "--json").json()["items"]
    moves = [e["payload"] for e in events if e["action"] == "pair.status_changed"]
    assert [(m["from"], m["to"], m["event"]) for m in moves] == [
        ("registered", "deprecated", "deprecated"),
        ("deprecated", "retired", "retired"),
    ]
