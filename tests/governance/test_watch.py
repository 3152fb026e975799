"""Hub watch with the loopback Hub server: a moved branch is registered as the lineage's next
version, which creates the candidate pair and queues its drift measurement."""

from __future__ import annotations

import pytest

from registry.db import session_scope
from registry.services import validation
from tests.core.test_hub_sources import hf_add, repo_files
from tests.governance.helpers import (
    ACTOR,
    add_model,
    make_pair,
    put_test_policy,
    store,
    synthetic_result,
)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_watch_registers_moved_branch_and_queues_candidate(  # type: ignore[no-untyped-def]
    home,
    cli,
    hub_server,
    tmp_path,
) -> None:
    url = home.db_url
    commit = hub_server.add_repo("org/repo", repo_files())
    target = hf_add(cli, "hf://org/repo@main", "acme/t")["artifact"]
    assert target["hub_revision"] == "main"
    put_test_policy(url)
    draft = add_model(url, tmp_path, "acme/draft", "draft", b"d1")
    digest = make_pair(url, target["id"], draft)
    store(url, digest, synthetic_result({"code": 0.8, "prose": 0.7}))
    with session_scope(url) as s:
        assert (
            validation.validate_pair(
                s, ref=digest, policy="test", runner_version="test-1", actor=ACTOR
            ).pair_status
            == "validated"
        )

    r = cli("watch", "--json")
    assert r.rc == 0, r.err
    [still] = r.json()
    assert still["registered"] is False and still["current_commit"] == commit

    new_commit = hub_server.update_branch("org/repo", repo_files(b"new weights" * 100))
    r = cli("watch", "--json")
    [moved] = r.json()
    assert moved["registered"] is True and moved["previous_commit"] == commit
    assert moved["current_commit"] == new_commit
    v2 = cli("artifact", "show", "acme/t@v2", "--json").json()
    assert v2["hub_commit"] == new_commit and v2["hub_revision"] == "main"

    jobs = cli("jobs", "list", "--state", "queued", "--json").json()["items"]
    assert len(jobs) == 1
    args = jobs[0]["args"]
    assert args["drift"]["baseline_pair_id"] and args["policy"] == "test"
    cand = cli("pair", "show", args["pair_digest"], "--json").json()
    assert cand["target"]["id"] == v2["id"] and cand["drafter"]["id"] == draft
    assert cand["config"] == cli("pair", "show", digest, "--json").json()["config"]
    # watching again finds nothing new and queues nothing more
    assert cli("watch", "--json").json()[0]["registered"] is False
    assert len(cli("jobs", "list", "--json").json()["items"]) == 1
