"""Audit bundles carry the cited events' inclusion proofs in the log's Merkle tree and a C2SP
checkpoint; the offline verifier checks them and catches a forged leaf or checkpoint."""

from __future__ import annotations

import copy
import json
from datetime import timedelta

from registry.db import session_scope
from registry.services import bundles
from registry.services import requests as svc
from registry.settings import Settings
from registry.trust.bundle_verify import verify_bundle
from tests.requests.conftest import ACTOR, Served


def test_bundle_proves_cited_events_in_the_log(home: Settings, served: Served) -> None:
    at = served.t_b + timedelta(minutes=3)
    tags = [
        {
            "request_id": f"r-{i}",
            "deployment": served.deployment,
            "served_at": at.isoformat(),
            "input_tokens": i,
            "output_tokens": i + 1,
        }
        for i in range(5)
    ]
    with session_scope(served.url) as s:
        svc.ingest_requests(s, tags=tags, actor=ACTOR)
        bundle = json.loads(json.dumps(bundles.build_bundle(s, request_id="r-2")))
    log = bundle["log"]
    assert set(log["events"]) == {str(v) for v in bundle["events"].values()}
    trusted = home.public_key_path.read_text()
    report = verify_bundle(bundle, trusted_public_key=trusted)
    assert report.ok, [c for c in report.checks if not c.ok]
    checks = {c.name: c for c in report.checks}
    assert checks["log inclusion"].ok and checks["log checkpoint key"].ok

    batch_seq = str(bundle["events"]["ingest_batch"])
    forged = copy.deepcopy(bundle)
    entry = forged["log"]["events"][batch_seq]
    entry["leaf_data"] = entry["leaf_data"].replace('"stored":5', '"stored":6')
    bad = verify_bundle(forged, trusted_public_key=trusted)
    assert {c.name: c.detail for c in bad.checks if not c.ok} == {
        "log inclusion": f"event {batch_seq} does not prove into the checkpoint",
        "ingest batch event": f"event {batch_seq} is not among the verified events",
    }
    forged = copy.deepcopy(bundle)
    lines = forged["log"]["checkpoint"].split("\n")
    lines[1] = str(int(lines[1]) + 1)
    forged["log"]["checkpoint"] = "\n".join(lines)
    failed = {c.name for c in verify_bundle(forged, trusted_public_key=trusted).checks if not c.ok}
    assert failed == {"log checkpoint"}
