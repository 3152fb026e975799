"""Ingest benchmark on PostgreSQL: batch API vs COPY, lookup latency, Tagger.tag() cost.

    .venv/bin/python bench/ingest_bench.py --tags 1000000 --clients 4 --workers 2

1. Creates a scratch database, migrates it, registers a fake pair and makes it live.
2. Starts the API (uvicorn, ``--workers`` processes) and POSTs ``--tags`` tags in batches of
   ``--batch`` from ``--clients`` concurrent HTTP clients: tags/s end to end (JSON encoding,
   HTTP, validation, idempotency check, insert, audit event, commit).
3. In the same run, COPYs the same rows into a scratch table with the same columns and
   indexes: tags/s of the raw database path, and the ratio (target: at least 0.25). Also
   the CPU seconds each path used (API workers + their PostgreSQL backends + HTTP clients,
   vs the COPY client + its backend) and their ratio, which a busy shared machine disturbs
   far less than wall-clock rates.
4. After ``VACUUM ANALYZE`` (the steady state of a running registry) and 200 warm-up
   lookups, looks up ``--lookups`` random request ids through the service layer (server
   side, no HTTP): p50 and p99 (target p99 < 5 ms).
5. Times ``Tagger.tag()`` (target < 20 µs per call).

Prints one JSON object with every figure. The scratch database is dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from registry import db  # noqa: E402
from registry.db import session_scope  # noqa: E402


def _admin(url: str):  # type: ignore[no-untyped-def]
    return create_engine(url, isolation_level="AUTOCOMMIT")


def scratch_db(base_url: str) -> str:
    name = f"pairreg_bench_{uuid.uuid4().hex[:8]}"
    with _admin(base_url).connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    return make_url(base_url).set(database=name).render_as_string(hide_password=False)


def drop_db(base_url: str, url: str) -> None:
    db.dispose_engines()
    name = make_url(url).database
    with _admin(base_url).connect() as conn:
        conn.execute(
            text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
            {"n": name},
        )
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))


def setup_registry(url: str, tmp: Path) -> tuple[str, str]:
    """A pair live on deployment ``bench`` since an hour ago; returns (deployment, token)."""
    from registry.services import artifacts, deployments, pairs, tokens
    from tests.fixtures import write_fake_model
    from tests.requests.conftest import promote_at

    db.upgrade(url)
    target = write_fake_model(tmp / "target", weights=b"t")
    draft = write_fake_model(tmp / "draft", weights=b"d")
    with session_scope(url) as s:
        t = artifacts.add_artifact(s, source=str(target), name="b/t", role="target", actor="b")
        d = artifacts.add_artifact(s, source=str(draft), name="b/d", role="draft", actor="b")
        p = pairs.register_pair(s, target=t.artifact.ref, draft=d.artifact.ref,
                                method="draft_model", k=4, actor="b").pair  # fmt: skip
        deployments.create_deployment(s, name="bench", actor="b")
    promote_at(url, "bench", p.pair_digest, datetime.now(UTC) - timedelta(hours=1))
    with session_scope(url) as s:
        token = tokens.create_token(s, name="bench", role="ingest", actor="b").secret
    return "bench", token


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes so far (Linux ``/proc``); gone ones count 0."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (uvicorn's workers; a server's write worker processes)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo += [int(c) for c in task.read_text().split()]
            except OSError:  # ended meanwhile
                pass
    return out


def backend_pids(url: str) -> list[int]:
    """The scratch database's PostgreSQL backends, except the one asking."""
    engine = _admin(url)
    try:
        with engine.connect() as conn:
            return list(
                conn.execute(
                    text(
                        "SELECT pid FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ).scalars()
            )
    finally:
        engine.dispose()


def make_tags(n: int, deployment: str) -> list[dict]:
    start = datetime.now(UTC) - timedelta(minutes=50)
    return [
        {
            "request_id": f"req-{i:09d}",
            "deployment": deployment,
            "served_at": (start + timedelta(microseconds=i * 997)).isoformat(),
            "input_tokens": 100 + i % 500,
            "output_tokens": 20 + i % 300,
            "spec": {"num_spec_steps": 10, "num_draft_tokens": 40,
                     "num_accepted_draft_tokens": 25, "acceptance_histogram": [2, 1, 3, 2, 2]},
        }
        for i in range(n)
    ]  # fmt: skip


def start_api(url: str, home: Path, port: int, workers: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PAIRREG_DATABASE_URL": url, "PAIRREG_HOME": str(home),
           "PAIRREG_EMBEDDED_WORKER": "0"}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "api.app:create_app", "--port", str(port),
         "--workers", str(workers), "--log-level", "warning", "--no-access-log"],
        cwd=REPO, env=env,
    )  # fmt: skip
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("API did not start")


def ingest_via_api(
    port: int, token: str, tags: list[dict], batch: int, clients: int
) -> tuple[float, float]:
    """(seconds, CPU seconds of the HTTP clients) to POST every batch."""
    batches = [tags[i : i + batch] for i in range(0, len(tags), batch)]
    bodies = [json.dumps({"tags": b}).encode() for b in batches]  # encode outside the timing
    lock = threading.Lock()
    errors: list[str] = []

    def worker() -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600,
                          headers={"Authorization": f"Bearer {token}",
                                   "Content-Type": "application/json"}) as c:  # fmt: skip
            while True:
                with lock:
                    if not bodies:
                        return
                    body = bodies.pop()
                r = c.post("/v1/requests", content=body)
                if r.status_code != 201:
                    errors.append(f"{r.status_code} {r.text[:200]}")

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    client_cpu = time.process_time() - cpu0
    if errors:
        raise RuntimeError(f"{len(errors)} batches failed: {errors[:3]}")
    return elapsed, client_cpu


def copy_rows(url: str, tags: list[dict]) -> tuple[float, float]:
    """COPY the same rows (as the ingest would store them) into a scratch table: (seconds,
    CPU seconds of this client and its PostgreSQL backend)."""
    import psycopg

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as conn:
        dep_id, pair_id = conn.execute(
            "SELECT id, current_pair_id FROM deployments WHERE name = 'bench'"
        ).fetchone()
        conn.execute(
            "CREATE TABLE scratch_tags (LIKE request_tags INCLUDING DEFAULTS INCLUDING INDEXES)"
        )
        conn.commit()
        rows = [
            (t["request_id"], datetime.fromisoformat(t["served_at"]), dep_id, pair_id,
             t["input_tokens"], t["output_tokens"], json.dumps(t["spec"]), False, True)
            for t in tags
        ]  # fmt: skip
        backend = [conn.info.backend_pid]
        cpu0 = time.process_time() + cpu_seconds(backend)
        t0 = time.perf_counter()
        with (
            conn.cursor() as cur,
            cur.copy(
                "COPY scratch_tags (request_id, served_at, deployment_id, pair_id, input_tokens, "
                "output_tokens, spec, pair_filled, consistent) FROM STDIN"
            ) as copy,
        ):
            for r in rows:
                copy.write_row(r)
        conn.commit()
        elapsed = time.perf_counter() - t0
        return elapsed, time.process_time() + cpu_seconds(backend) - cpu0


def steady_state(url: str) -> None:
    """VACUUM ANALYZE the tag tables so lookups are not timed against a pending autovacuum."""
    with _admin(url).connect() as conn:
        for table in ("request_ids", "request_tags", "scratch_tags"):
            exists = conn.execute(text("SELECT to_regclass(:t)"), {"t": table}).scalar()
            if exists:
                conn.execute(text(f"VACUUM ANALYZE {table}"))


def lookups(url: str, ids: list[str]) -> dict[str, float]:
    from registry.services import requests as svc

    times = []
    for rid in ids:
        t0 = time.perf_counter()
        with session_scope(url) as s:
            svc.get_request_tag(s, request_id=rid)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {
        "p50_ms": round(statistics.median(times), 3),
        "p99_ms": round(times[int(len(times) * 0.99) - 1], 3),
        "max_ms": round(times[-1], 3),
    }


def sql_lookups(url: str, ids: list[str]) -> dict[str, float]:
    """The same lookup as plain SQL on one open connection: the database's share."""
    import psycopg

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    sql = (
        "SELECT t.*, i.tag_digest, i.batch_id, p.pair_digest, d.name FROM request_ids i "
        "JOIN request_tags t ON t.request_id = i.request_id AND t.served_at = i.served_at "
        "JOIN pairs p ON p.id = t.pair_id JOIN deployments d ON d.id = t.deployment_id "
        "WHERE i.client_request_id = %s"  # the client's id (keys are <source>/<id>)
    )
    times = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for rid in ids:
            t0 = time.perf_counter()
            assert conn.execute(sql, (rid,), prepare=True).fetchone() is not None
            times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {
        "p50_ms": round(statistics.median(times), 3),
        "p99_ms": round(times[int(len(times) * 0.99) - 1], 3),
    }


def tagger_cost(n: int = 200_000) -> float:
    from api.tagger import Tagger

    with tempfile.TemporaryDirectory() as d:
        t = Tagger("http://127.0.0.1:9", None, d, start=False)
        t0 = time.perf_counter()
        for i in range(n):
            t.tag(f"r{i}", "bench", input_tokens=10, output_tokens=20)
        return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--pg",
        default=os.environ.get(
            "PAIRREG_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
        ),
    )
    ap.add_argument("--tags", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    ap.add_argument("--lookups", type=int, default=2000)
    ap.add_argument("--port", type=int, default=18765)
    ap.add_argument("--keep", action="store_true", help="Keep the scratch database.")
    args = ap.parse_args()

    url = scratch_db(args.pg)
    proc = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            deployment, token = setup_registry(url, Path(tmp))
            tags = make_tags(args.tags, deployment)
            proc = start_api(url, Path(tmp) / "home", args.port, args.workers)
            servers = process_tree(proc.pid)
            backends0 = backend_pids(url)
            server0, backend0 = cpu_seconds(servers), cpu_seconds(backends0)
            api_s, client_cpu = ingest_via_api(args.port, token, tags, args.batch, args.clients)
            # API workers, their PostgreSQL backends and the HTTP clients (this process).
            # (Backends that appeared during the run started from zero.)
            backends = sorted(set(backend_pids(url)) | set(backends0))
            server_cpu = cpu_seconds(servers) - server0
            backend_cpu = cpu_seconds(backends) - backend0
            api_cpu = server_cpu + backend_cpu + client_cpu
            proc.terminate()
            proc.wait(30)
            proc = None
            copy_s, copy_cpu = copy_rows(url, tags)
            with session_scope(url) as s:
                stored = s.execute(text("SELECT count(*) FROM request_tags")).scalar()
            # Steady state, as a running registry would be: statistics current (not the
            # autovacuum pass that a million fresh rows trigger) and the lookup path warm.
            steady_state(url)
            sample = random.Random(0).sample(range(args.tags), min(args.lookups, args.tags))
            warm = random.Random(1).sample(range(args.tags), min(200, args.tags))
            lookups(url, [tags[i]["request_id"] for i in warm])
            lat = lookups(url, [tags[i]["request_id"] for i in sample])
            sql_lat = sql_lookups(url, [tags[i]["request_id"] for i in sample])
            api_rate = args.tags / api_s
            n_batches = -(-args.tags // args.batch)
            copy_rate = args.tags / copy_s
            print(json.dumps({
                "tags": args.tags, "stored": stored, "batch": args.batch,
                "clients": args.clients, "api_workers": args.workers,
                "api_seconds": round(api_s, 2), "api_tags_per_s": round(api_rate),
                "copy_seconds": round(copy_s, 2), "copy_tags_per_s": round(copy_rate),
                "ratio_api_to_copy": round(api_rate / copy_rate, 3),
                "api_cpu_seconds": round(api_cpu, 2), "copy_cpu_seconds": round(copy_cpu, 2),
                "cpu_ratio_api_to_copy": round(copy_cpu / api_cpu, 3),
                "api_cpu_per_batch_s": {
                    "api_workers": round(server_cpu / n_batches, 4),
                    "postgresql_backends": round(backend_cpu / n_batches, 4),
                    "http_clients": round(client_cpu / n_batches, 4),
                },
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "lookup_by_request_id_service": lat,
                "lookup_by_request_id_sql": sql_lat,
                "tagger_tag_us": round(tagger_cost(), 2),
                "cpus": os.cpu_count(),
            }, indent=2))  # fmt: skip
    finally:
        if proc is not None:
            proc.kill()
        if not args.keep:
            drop_db(args.pg, url)


if __name__ == "__main__":
    main()
