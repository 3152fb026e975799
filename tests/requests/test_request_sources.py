"""No client can make another's record go missing: request ids are namespaced by the
ingesting source, and a conflicting tag is reported on its own while the rest of its batch
is stored (both dialects, embedded and over HTTP; the Tagger in ``test_tagger.py``)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from registry.db import session_scope
from registry.errors import Conflict, NotFound
from registry.services import requests as svc
from registry.tables import AuditEvent, RequestId, RequestTag
from registry.trust.bundle_verify import merkle_root, tag_digest
from tests.requests.conftest import Served

ATTACKER, VICTIM = "token:attacker", "token:victim"


def _tag(s: Served, rid: str, minutes: int = 1, **kw):  # type: ignore[no-untyped-def]
    return {
        "request_id": rid,
        "deployment": s.deployment,
        "served_at": (s.t_b + timedelta(minutes=minutes)).isoformat(),
        "input_tokens": 10,
        "output_tokens": 20,
        **kw,
    }


def _ingest(url: str, tags, actor: str):  # type: ignore[no-untyped-def]
    with session_scope(url) as session:
        return svc.ingest_requests(session, tags=tags, actor=actor)


def test_another_source_cannot_take_or_clash_with_an_id(served: Served) -> None:
    """The issue's case: ingest ``attacker-chosen``, then a batch [victim-1, victim-2,
    attacker-chosen] from another token: every victim tag is stored and found."""
    s = served
    first = _ingest(s.url, [_tag(s, "attacker-chosen", output_tokens=666)], ATTACKER)
    assert first.stored == 1 and first.source == "token:attacker"
    victims = [_tag(s, "victim-1"), _tag(s, "victim-2"), _tag(s, "attacker-chosen")]
    res = _ingest(s.url, victims, VICTIM)
    assert (res.received, res.stored, res.duplicates, res.conflicted) == (3, 3, 0, 0)
    with session_scope(s.url) as session:
        for rid in ("victim-1", "victim-2"):
            rec = svc.get_request_tag(session, request_id=rid)
            assert (rec.request_id, rec.source) == (rid, "token:victim")
        # the shared id is ambiguous without a source, and each source gets its own tag
        with pytest.raises(Conflict, match="2 sources") as err:
            svc.audit_request(session, request_id="attacker-chosen")
        assert err.value.details == {"sources": ["token:attacker", "token:victim"]}
        mine = svc.audit_request(session, request_id="attacker-chosen", source="token:victim")
        theirs = svc.audit_request(session, request_id="attacker-chosen", source=ATTACKER)
        assert (mine.tag.output_tokens, theirs.tag.output_tokens) == (20, 666)
        assert mine.tag.batch_id == res.batch_id != theirs.tag.batch_id
        with pytest.raises(NotFound):
            svc.audit_request(session, request_id="victim-1", source=ATTACKER)
        # the tag digest covers the client's id, as before: bundles verify unchanged
        assert mine.tag.tag_digest == tag_digest(
            request_id="attacker-chosen",
            deployment=s.deployment,
            pair_digest=s.pair_b,
            served_at=s.t_b + timedelta(minutes=1),
            input_tokens=10,
            output_tokens=20,
            spec=None,
        )
        keys = session.scalars(
            select(RequestId.request_id).where(RequestId.batch_id == res.batch_id)
        ).all()
        assert sorted(keys) == [
            "token:victim/attacker-chosen",
            "token:victim/victim-1",
            "token:victim/victim-2",
        ]
        assert session.query(RequestTag).count() == 4


def test_conflicts_are_reported_per_tag_and_the_rest_stored(served: Served) -> None:
    """Within one source: a different tag under a recorded id, and the same id twice in the
    batch with other content, are each reported; every other tag is stored, the retry
    counted; the batch's Merkle root and event cover exactly what was stored."""
    s = served
    _ingest(s.url, [_tag(s, "x-1"), _tag(s, "x-2")], VICTIM)
    batch = [
        _tag(s, "x-3"),
        _tag(s, "x-1", output_tokens=99),  # clashes with the recorded x-1
        _tag(s, "x-2"),  # a retry
        _tag(s, "x-4"),
        _tag(s, "x-4", input_tokens=1),  # same id, other content, same batch
        _tag(s, "x-5"),
    ]
    res = _ingest(s.url, batch, VICTIM)
    assert (res.received, res.stored, res.duplicates, res.conflicted) == (6, 3, 1, 2)
    assert [(c.index, c.request_id, c.reason) for c in res.conflicts] == [
        (1, "x-1", "recorded"),
        (4, "x-4", "batch"),
    ]
    with session_scope(s.url) as session:
        stored = {
            r: svc.get_request_tag(session, request_id=r) for r in ("x-1", "x-3", "x-4", "x-5")
        }
        assert stored["x-1"].output_tokens == 20  # the recorded tag is untouched
        assert stored["x-4"].input_tokens == 10  # the batch's first x-4
        assert res.merkle_root == merkle_root([stored[r].tag_digest for r in ("x-3", "x-4", "x-5")])
        ev = session.scalars(select(AuditEvent).where(AuditEvent.seq == res.audit_seq)).one()
        payload = json.loads(ev.payload)
        assert (payload["stored"], payload["conflicted"], payload["source"]) == (
            3,
            2,
            "token:victim",
        )
    # a batch of nothing but conflicts and retries stores nothing and says so
    again = _ingest(s.url, [_tag(s, "x-1", output_tokens=98), _tag(s, "x-3")], VICTIM)
    assert (again.stored, again.duplicates, again.conflicted, again.batch_id) == (0, 1, 1, None)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # the COPY paths are PG's
def test_postgres_copy_paths_namespace_and_report(served: Served) -> None:
    """PostgreSQL: the bulk COPY stores the source and client id; a conflicting id sends the
    batch down the careful path, which stores the rest and reports the conflict."""
    s = served
    first = _ingest(s.url, [_tag(s, f"p-{i:03d}") for i in range(30)], VICTIM)
    assert first.stored == 30
    other = _ingest(s.url, [_tag(s, f"p-{i:03d}") for i in range(5)], ATTACKER)
    assert (other.stored, other.conflicted) == (5, 0)  # other source: no clash
    batch = [_tag(s, f"p-{i:03d}") for i in range(28, 34)]
    batch[1] = _tag(s, "p-029", output_tokens=1)
    res = _ingest(s.url, batch, VICTIM)
    assert (res.stored, res.duplicates, res.conflicted) == (4, 1, 1)
    assert [(c.index, c.request_id) for c in res.conflicts] == [(1, "p-029")]
    with session_scope(s.url) as session:
        rows = session.execute(
            select(RequestId.source, RequestId.client_request_id).where(
                RequestId.batch_id == res.batch_id
            )
        ).all()
        assert sorted(rows) == [("token:victim", f"p-{i:03d}") for i in range(30, 34)]
        assert session.query(RequestTag).count() == 30 + 5 + 4


def test_sources_cannot_be_forged_through_the_separator(served: Served) -> None:
    """``/`` in an actor is escaped, so ``a/b`` + ``c`` and ``a`` + ``b/c`` never share a
    key."""
    s = served
    assert svc.source_of("token:a/b") == "token:a%2Fb"
    one = _ingest(s.url, [_tag(s, "c")], "token:a/b")
    two = _ingest(s.url, [_tag(s, "b/c", output_tokens=7)], "token:a")
    assert (one.stored, two.stored, two.conflicted) == (1, 1, 0)
    long = svc.source_of("local:" + "u" * 300)
    assert len(long) == 120 and long != svc.source_of("local:" + "u" * 299 + "v")


def test_over_http_two_tokens(served: Served, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Over HTTP: the batch is a 201 listing its conflict; look-ups by the client's id take
    ``source`` when two tokens sent it."""
    from api.app import create_app
    from registry.services.tokens import create_token
    from registry.settings import Settings

    s = served
    with session_scope(s.url) as session:
        attacker = create_token(session, name="attacker", role="ingest", actor="local:t").secret
        victim = create_token(session, name="victim", role="ingest", actor="local:t").secret
        auditor = create_token(session, name="aud", role="auditor", actor="local:t").secret
    app = create_app(Settings(database_url=s.url, home=tmp_path / "home"))
    with TestClient(app) as client:

        def post(tok: str, tags):  # type: ignore[no-untyped-def]
            return client.post(
                "/v1/requests", json={"tags": tags}, headers={"Authorization": f"Bearer {tok}"}
            )

        assert post(attacker, [_tag(s, "attacker-chosen", output_tokens=5)]).status_code == 201
        r = post(victim, [_tag(s, "victim-1"), _tag(s, "victim-2"), _tag(s, "attacker-chosen")])
        assert r.status_code == 201, r.text
        assert (r.json()["stored"], r.json()["conflicted"]) == (3, 0)
        r = post(victim, [_tag(s, "victim-1", output_tokens=1), _tag(s, "victim-3")])
        assert r.status_code == 201, r.text
        assert r.json()["stored"] == 1
        assert r.json()["conflicts"] == [
            {"index": 0, "request_id": "victim-1", "reason": "recorded"}
        ]
        aud = {"Authorization": f"Bearer {auditor}"}
        for rid in ("victim-1", "victim-2", "victim-3"):
            got = client.get(f"/v1/requests/{rid}", headers=aud)
            assert got.status_code == 200 and got.json()["tag"]["source"] == "token:victim"
        amb = client.get("/v1/requests/attacker-chosen", headers=aud)
        assert amb.status_code == 409 and amb.json()["field"] == "source"
        got = client.get(
            "/v1/requests/attacker-chosen", params={"source": "token:victim"}, headers=aud
        )
        assert got.status_code == 200 and got.json()["tag"]["output_tokens"] == 20


def test_embedded_serving_tags_under_the_callers_token(
    served: Served, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Two tokens send the same ``x-request-id`` to ``/v1/completions``: each request is
    tagged under its own caller, both stored, each found with its source (the engine is a
    stand-in: what is under test is who the served request is tagged as)."""
    from types import SimpleNamespace

    from api import engines, serving
    from api.app import create_app
    from api.backend import local_backend
    from registry.services.tokens import create_token
    from registry.settings import Settings

    s = served

    class Engine:
        pair_digest, target_digest, draft_digest = s.pair_b, None, None

        def generate(self, prompt, max_tokens, on_text=None):  # type: ignore[no-untyped-def]
            run = SimpleNamespace(steps=1, drafted=2, accepted=1, output_ids=[1],
                                  accepted_per_position=[1, 0])  # fmt: skip
            return engines.Generation(text="hi", prompt_tokens=3, run=run)

    def live(model, request, principal):  # type: ignore[no-untyped-def]
        return local_backend(request.app.state.settings, actor=principal.actor), Engine()

    monkeypatch.setattr(serving, "_live_engine", live)
    with session_scope(s.url) as session:
        a = create_token(session, name="caller-a", role="ingest", actor="local:t").secret
        b = create_token(session, name="caller-b", role="ingest", actor="local:t").secret
    app = create_app(Settings(database_url=s.url, home=tmp_path / "home"))
    with TestClient(app) as client:
        for tok in (a, b):
            r = client.post(
                "/v1/completions",
                json={"model": s.deployment, "prompt": "x", "max_tokens": 4},
                headers={"Authorization": f"Bearer {tok}", "x-request-id": "shared-id"},
            )
            assert r.status_code == 200 and r.headers["x-request-id"] == "shared-id", r.text
    with session_scope(s.url) as session:
        with pytest.raises(Conflict):
            svc.get_request_tag(session, request_id="shared-id")
        for name in ("caller-a", "caller-b"):
            tag = svc.get_request_tag(session, request_id="shared-id", source=f"token:{name}")
            assert tag.pair_digest == s.pair_b and tag.spec["num_draft_tokens"] == 2


def test_cli_ingest_lists_conflicts_by_line(
    served: Served, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """``pairreg requests ingest`` stores every tag it can, names each conflicting one by its
    line in the file, and exits 1 when some were not stored."""
    from tests.api.conftest import run_cli

    s = served
    monkeypatch.setenv("PAIRREG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PAIRREG_DATABASE_URL", s.url)
    monkeypatch.delenv("PAIRREG_URL", raising=False)
    f = tmp_path / "tags.jsonl"
    f.write_text(json.dumps(_tag(s, "c-1")) + "\n")
    assert run_cli("requests", "ingest", str(f)).exit_code == 0
    f.write_text(
        "\n".join([json.dumps(_tag(s, "c-2")), "", json.dumps(_tag(s, "c-1", output_tokens=3)),
                   json.dumps(_tag(s, "c-3"))]) + "\n"
    )  # fmt: skip
    out = run_cli("requests", "ingest", str(f), "--json")
    assert out.exit_code == 1
    body = json.loads(out.output)
    assert (body["stored"], body["conflicted"]) == (2, 1)
    assert body["conflicts"] == [{"line": 3, "request_id": "c-1", "reason": "recorded"}]
    text = run_cli("requests", "ingest", str(f))
    assert text.exit_code == 1 and "not stored: line 3: request id c-1" in text.output
