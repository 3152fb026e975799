"""Transparency-log benchmark: proofs at a million audit events vs recomputing from leaves.

    .venv/bin/python bench/tlog_bench.py --events 1000000            # SQLite
    .venv/bin/python bench/tlog_bench.py --events 1000000 --postgres  # PostgreSQL

1. Migrates a scratch database, writes ``--events`` audit events in bulk, then
   builds the stored tree the way the migration backfills it (``audit_tree.rebuild``).
2. Times, through the service layer, ``--proofs`` inclusion proofs (random event, random
   tree size) and as many consistency proofs (random old and new sizes), each verified;
   then signs a checkpoint (the incremental check over the leaves since the last one).
3. Baseline in the same run: the root of the whole log recomputed from the events (read,
   canonicalise, hash every leaf, hash every node) — what a proof costs without stored
   subtrees — and, separately, the node hashing alone from leaf hashes already in memory.
4. Times ``audit_tree.append_leaf`` at that size (the per-event cost the tree adds).

Prints one JSON object; targets: a proof p99 under 20 ms, and under 1/100 of the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from registry import db  # noqa: E402
from registry.canonical import canonical_json  # noqa: E402
from registry.db import get_engine, session_scope  # noqa: E402
from registry.services import transparency as tl  # noqa: E402
from registry.settings import reset_settings  # noqa: E402
from registry.tables import AuditEvent  # noqa: E402
from registry.trust import audit, audit_tree, merkle  # noqa: E402


def write_events(url: str, n: int, chunk: int = 20_000) -> None:
    """Bulk-insert events (what a registry accumulates over months of ingest)."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    rows = []
    engine = get_engine(url)
    for seq in range(1, n + 1):
        at = t0 + timedelta(seconds=seq)
        payload = {"batch_id": seq, "merkle_root": f"{seq:064x}", "stored": 500}
        body = {
            "seq": seq,
            "occurred_at": audit.format_time(at),
            "actor": "bench:ingest",
            "action": "requests.ingested",
            "entity_type": "request_batch",
            "entity_id": str(seq),
            "payload": payload,
        }
        rows.append(
            {
                "seq": seq,
                "occurred_at": at,
                "actor": body["actor"],
                "action": body["action"],
                "entity_type": body["entity_type"],
                "entity_id": body["entity_id"],
                "payload": canonical_json(payload).decode(),
            }
        )
        if len(rows) >= chunk:
            with engine.begin() as conn:
                conn.execute(insert(AuditEvent.__table__), rows)
            rows = []
    if rows:
        with engine.begin() as conn:
            conn.execute(insert(AuditEvent.__table__), rows)
    with engine.begin() as conn:
        # Integrated as they were written: leaf seq - 1 (the backfill builds the tree).
        conn.execute(
            text("INSERT INTO audit_leaves (idx, seq) SELECT seq - 1, seq FROM audit_events")
        )
        if conn.dialect.name == "postgresql":  # ids given explicitly: move the sequence on
            conn.execute(
                text("SELECT setval('audit_events_seq_seq', (SELECT MAX(seq) FROM audit_events))")
            )


def timed(fn, repeat: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--proofs", type=int, default=200)
    ap.add_argument("--postgres", action="store_true")
    ap.add_argument(
        "--pg-url",
        default=os.environ.get(
            "PAIRREG_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
        ),
    )
    args = ap.parse_args()
    rng = random.Random(7)
    tmp = Path(tempfile.mkdtemp(prefix="tlog-bench-"))
    admin = None
    if args.postgres:
        name = f"pairreg_tlog_{uuid.uuid4().hex[:8]}"
        admin = create_engine(args.pg_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        url = make_url(args.pg_url).set(database=name).render_as_string(hide_password=False)
    else:
        url = f"sqlite:///{tmp / 'bench.db'}"
    os.environ["PAIRREG_HOME"] = str(tmp / "home")
    os.environ["PAIRREG_DATABASE_URL"] = url
    reset_settings()
    out: dict[str, object] = {"dialect": "postgresql" if args.postgres else "sqlite"}
    try:
        db.upgrade(url)
        audit.ensure_signing_key(tmp / "home" / "audit-signing.key", tmp / "home" / "a.pub")
        t = time.perf_counter()
        write_events(url, args.events)
        out["write_events_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        with get_engine(url).begin() as conn:
            if args.postgres:
                conn.execute(text("SET LOCAL session_replication_role = replica"))
            leaves = audit_tree.rebuild(conn)
        out["backfill_s"] = round(time.perf_counter() - t, 1)
        with get_engine(url).connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.execute(text("VACUUM ANALYZE audit_tree" if args.postgres else "ANALYZE"))
        n = leaves
        out["events"] = n

        def incl() -> None:
            size = rng.randint(1, n)
            seq = rng.randint(1, size)
            with session_scope(url) as s:
                p = tl.prove_inclusion(s, seq=seq, tree_size=size)
            path = [bytes.fromhex(h) for h in p.path]
            leaf = merkle.leaf_hash(p.leaf_data.encode())
            assert merkle.verify_inclusion(
                leaf, p.leaf_index, size, path, bytes.fromhex(p.root_hash)
            )

        def cons() -> None:
            new = rng.randint(1, n)
            old = rng.randint(1, new)
            with session_scope(url) as s:
                p = tl.prove_consistency(s, old_size=old, new_size=new)
            assert merkle.verify_consistency(
                old,
                new,
                bytes.fromhex(p.old_root),
                bytes.fromhex(p.new_root),
                [bytes.fromhex(h) for h in p.path],
            )

        for fn in (incl, cons):  # warm the page cache and the connection pool
            timed(fn, 20)
        inc = timed(incl, args.proofs)
        con = timed(cons, args.proofs)
        out["inclusion_ms"] = {
            "p50": round(statistics.median(inc) * 1e3, 2),
            "p99": round(pct(inc, 0.99) * 1e3, 2),
        }
        out["consistency_ms"] = {
            "p50": round(statistics.median(con) * 1e3, 2),
            "p99": round(pct(con, 0.99) * 1e3, 2),
        }
        t = time.perf_counter()
        with session_scope(url) as s:
            tl.sign_log_checkpoint(s, actor="bench")
        out["first_checkpoint_s"] = round(time.perf_counter() - t, 2)

        t = time.perf_counter()
        with session_scope(url) as s:
            all_leaves = list(audit_tree.leaves_from_events(s))
        read_hash = time.perf_counter() - t
        t = time.perf_counter()
        root = merkle.root_from_leaves(all_leaves)
        nodes_only = time.perf_counter() - t
        with session_scope(url) as s:
            assert root == audit_tree.root(s, n)
        baseline = read_hash + nodes_only
        out["baseline_recompute_root_s"] = round(baseline, 2)
        out["baseline_node_hashing_only_s"] = round(nodes_only, 2)
        out["ratio_inclusion_p99_vs_baseline"] = round(pct(inc, 0.99) / baseline, 5)
        out["ratio_consistency_p99_vs_baseline"] = round(pct(con, 0.99) / baseline, 5)

        def app() -> None:
            with session_scope(url) as s:
                audit.append_event(
                    s,
                    actor="bench",
                    action="bench.append",
                    entity_type="t",
                    entity_id=1,
                    payload={"x": 1},
                )

        appends = timed(app, 200)
        # The event and its audit_pending row, no tree work (the sequencer does that).
        out["append_event_ms_p50"] = round(statistics.median(appends) * 1e3, 2)
        with session_scope(url) as s:
            t = time.perf_counter()
            integrated = audit.integrate(s)
            out["integrate_ms_per_event"] = round(
                (time.perf_counter() - t) / max(integrated, 1) * 1e3, 3
            )
        with session_scope(url) as s:
            t = time.perf_counter()
            for i in range(200):
                audit_tree.append_leaf(s, n + 200 + i, {"i": i})
            out["append_leaf_only_ms_mean"] = round((time.perf_counter() - t) / 200 * 1e3, 3)
            s.rollback()
        out["load_avg"] = os.getloadavg()
        print(json.dumps(out, indent=2))
    finally:
        db.dispose_engines()
        if admin is not None:
            with admin.connect() as conn:
                dbname = make_url(url).database
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = :n AND pid <> pg_backend_pid()"
                    ),
                    {"n": dbname},
                )
                conn.execute(text(f'DROP DATABASE IF EXISTS "{dbname}"'))


if __name__ == "__main__":
    main()
