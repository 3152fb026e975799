"""Load test: many concurrent clients against one ``pairreg serve`` on PostgreSQL.

    .venv/bin/python bench/load_bench.py --clients 50 --duration 30

1. Creates a scratch PostgreSQL database (dropped at the end), migrates it, and seeds two
   validated pairs on deployment ``prod`` (synthetic measurements, the governance tests'
   helpers), 20,000 request tags, and fake model directories for registrations.
2. Starts ``pairreg serve`` (loopback, random port, no embedded worker) with
   ``PAIRREG_WRITE_PROCESSES`` write worker processes (``--write-processes``, default 2;
   0 runs writes on threads of the server process, as before).
3. Times 100 look-ups from one client (the baseline: same machine, same moment), then runs
   ``--clients`` concurrent asyncio clients (aiohttp) for ``--warmup`` seconds and then for
   ``--duration`` seconds more, each picking operations at random with the weights below:
   look-ups of a pair and of a request tag, audit-event queries, ingest batches of
   ``--batch`` new tags, artifact registrations and promotions (which alternate the live
   pair of ``prod``).
4. Reports per operation, over the ``--duration`` window: count, p50 / p99 / max latency;
   throughput; errors (5xx, transport errors, unexpected 4xx; a 409 on a promotion another
   client just made is the intended answer and counted apart); the look-up p99 of each
   5-second slice; the server's memory (RSS of the server process and of its write
   workers, at start, halfway and the end, and their peak VmHWM); the CPU of the server,
   its workers and this client; the load average; then runs ``pairreg audit verify``.

The warm-up is the standard discard of a load test: all clients start at once and open
their connections, and the server's processes and database backends take their first
requests. It is not hidden: its look-ups are reported apart (``warmup``), with their p99.

``--think-ms`` gives each client an exponential think time between requests (default 0:
a closed loop, each client sends its next request as soon as the last is answered).

The client is aiohttp: httpx's asyncio client cost about 2 ms of CPU per request on the
same two cores as the server (0.29 cores at 140 requests/s), aiohttp about a third of that.

Targets: no 5xx, no unexpected errors, look-up p99 < 50 ms at 50 clients, memory bounded
(the RSS at the end within 1.5x the RSS halfway). Prints one JSON object; exits 1 when a
target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from ingest_bench import drop_db, process_tree, scratch_db  # noqa: E402

from registry import db  # noqa: E402
from registry.db import session_scope  # noqa: E402

PG_URL = os.environ.get(
    "PAIRREG_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
WEIGHTS = {
    "pair_lookup": 30,
    "request_lookup": 30,
    "audit_query": 10,
    "ingest_batch": 20,
    "register_artifact": 5,
    "promote": 5,
}
LOOKUPS = ("pair_lookup", "request_lookup")
SEED_TAGS = 20_000
BASELINE_LOOKUPS = 100
SLICE_S = 5


def seed(url: str, tmp: Path, registrations: int) -> dict[str, Any]:
    """Two validated pairs, ``prod`` live on the first, seed tags, registration dirs."""
    from sqlalchemy import select

    from registry.refs import resolve_deployment
    from registry.services import deployments, validation
    from registry.tables import Pair
    from tests.fixtures import write_fake_model
    from tests.governance.helpers import (
        ACTOR,
        add_model,
        make_pair,
        put_test_policy,
        store,
        synthetic_result,
    )

    db.upgrade(url)
    put_test_policy(url)
    t1 = add_model(url, tmp, "load/target", "target", b"t1")
    pairs = []
    for i, weights in enumerate((b"d1", b"d2")):
        d = add_model(url, tmp, "load/draft", "draft", weights)
        digest = make_pair(url, t1, d)
        store(url, digest, synthetic_result({"code": 0.8, "prose": 0.7}, seed=i))
        with session_scope(url) as s:
            res = validation.validate_pair(
                s, ref=digest, policy="test", runner_version="test-1", actor=ACTOR
            )
            assert res.validation and res.validation.passed
        pairs.append(digest)
    with session_scope(url) as s:
        deployments.create_deployment(s, name="prod", policy="test", actor=ACTOR)
        dep = resolve_deployment(s, "prod")
        pair = s.scalar(select(Pair).where(Pair.pair_digest == pairs[0]))
        ev = deployments._move(s, dep, action="promote", to_pair=pair, reason="seed",
                               validation_id=None, expect_version=None, actor=ACTOR)  # fmt: skip
        ev.at = datetime.now(UTC) - timedelta(hours=1)
    from registry.records.requests import TagIn
    from registry.services.requests import ingest_requests

    start = datetime.now(UTC) - timedelta(minutes=50)
    ids = [f"seed-{i:07d}" for i in range(SEED_TAGS)]
    for lo in range(0, SEED_TAGS, 5000):
        tags = [
            TagIn(request_id=rid, deployment="prod",
                  served_at=start + timedelta(milliseconds=i), input_tokens=10, output_tokens=20)
            for i, rid in enumerate(ids[lo : lo + 5000], start=lo)
        ]  # fmt: skip
        with session_scope(url) as s:
            ingest_requests(s, tags=tags, actor=ACTOR)
    dirs = [
        str(write_fake_model(tmp / f"reg-{i}", weights=f"reg-{i}".encode()))
        for i in range(registrations)
    ]
    db.dispose_engines()
    return {"pairs": pairs, "request_ids": ids, "dirs": dirs}


def start_server(
    url: str, home: Path, port: int, write_processes: int = 2
) -> subprocess.Popen[bytes]:
    # the registration directories lie beside the home: that folder is the artifact root
    # remote registrations are confined to
    env = {**os.environ, "PAIRREG_DATABASE_URL": url, "PAIRREG_HOME": str(home),
           "PAIRREG_ARTIFACT_ROOTS": str(home.parent),
           "PAIRREG_WRITE_PROCESSES": str(write_processes),
           "PAIRREG_EMBEDDED_WORKER": "0", "PAIRREG_MLFLOW": "0"}  # fmt: skip
    for key in ("PAIRREG_URL", "PAIRREG_TOKEN"):
        env.pop(key, None)
    log = open(home / "server.log", "ab")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--log-level", "warning"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server did not start: {(home / 'server.log').read_text()[-2000:]}")


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:  # gone
        pass
    return 0


def tree_kb(pid: int, field: str = "VmRSS") -> int:
    return sum(rss_kb(p, field) for p in process_tree(pid))


class Load:
    def __init__(self, data: dict[str, Any], batch: int):
        self.data = data
        self.batch = batch
        self.lat: dict[str, list[float]] = defaultdict(list)
        self.started: dict[str, list[float]] = defaultdict(list)  # perf_counter at send
        self.warmup_lat: dict[str, list[float]] = defaultdict(list)
        self.measure_from = 0.0  # perf_counter: requests sent before it are the warm-up
        self.status: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        self.transport_errors: dict[str, int] = defaultdict(int)
        self.unexpected: list[str] = []
        self.seq = itertools.count()
        self.dirs = iter(data["dirs"])
        self.ops = list(WEIGHTS)
        self.weights = list(WEIGHTS.values())

    def request_for(self, op: str, rng: random.Random) -> tuple[str, str, dict[str, Any]] | None:
        if op == "pair_lookup":
            return "GET", f"/v1/pairs/{rng.choice(self.data['pairs'])}", {}
        if op == "request_lookup":
            return "GET", f"/v1/requests/{rng.choice(self.data['request_ids'])}", {}
        if op == "audit_query":
            action = rng.choice(["requests.ingested", "promote", "artifact.added"])
            return "GET", "/v1/audit/events", {"params": {"limit": 20, "action": action}}
        if op == "ingest_batch":
            now = datetime.now(UTC).isoformat()
            n = next(self.seq)
            tags = [
                {"request_id": f"load-{n:07d}-{i:04d}", "deployment": "prod", "served_at": now,
                 "input_tokens": 100, "output_tokens": 50,
                 "spec": {"num_spec_steps": 10, "num_draft_tokens": 40,
                          "num_accepted_draft_tokens": 25, "acceptance_histogram": [2, 1, 3, 2, 2]}}
                for i in range(self.batch)
            ]  # fmt: skip
            return "POST", "/v1/requests", {"json": {"tags": tags}}
        if op == "register_artifact":
            source = next(self.dirs, None)
            if source is None:
                return None
            name = f"load/reg-{Path(source).name}"
            body = {"source": source, "name": name, "role": "target"}
            return "POST", "/v1/artifacts", {"json": body}
        pair = rng.choice(self.data["pairs"])
        body = {"pair": pair, "reason": "load test"}
        return "POST", "/v1/deployments/prod/promote", {"json": body}

    def expected(self, op: str, code: int) -> bool:
        if code < 300:
            return True
        # another client promoted the same pair a moment ago: "already live" is the answer
        return op == "promote" and code == 409

    async def client(
        self, http: aiohttp.ClientSession, deadline: float, seed_: int, think_s: float = 0.0
    ) -> None:
        rng = random.Random(seed_)
        while time.monotonic() < deadline:
            if think_s > 0:  # a user between requests: exponential, mean think_s
                await asyncio.sleep(min(rng.expovariate(1 / think_s), deadline - time.monotonic()))
                if time.monotonic() >= deadline:
                    break
            op = rng.choices(self.ops, self.weights)[0]
            req = self.request_for(op, rng)
            if req is None:
                continue
            method, path, kwargs = req
            t0 = time.perf_counter()
            try:
                async with http.request(method, path, **kwargs) as resp:
                    body = await resp.read()
                    code = resp.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.transport_errors[op] += 1
                self.unexpected.append(f"{op}: {type(exc).__name__}: {exc}")
                continue
            elapsed = time.perf_counter() - t0
            if t0 < self.measure_from:
                self.warmup_lat[op].append(elapsed)
            else:
                self.lat[op].append(elapsed)
                self.started[op].append(t0)
            self.status[op][code] += 1
            if not self.expected(op, code):
                self.unexpected.append(f"{op}: {code} {body[:200]!r}")


async def run_load(
    url: str,
    token: str,
    load: Load,
    clients: int,
    duration: float,
    pid: int,
    think_s: float,
    warmup: float,
) -> dict[str, Any]:
    # keepalive under the server's 5 s keep-alive: a connection the server is about to
    # close is not reused (otherwise a request can meet the close)
    connector = aiohttp.TCPConnector(limit=clients, keepalive_timeout=2.0)
    headers = {"Authorization": f"Bearer {token}"}
    rss: list[tuple[float, int]] = []
    async with aiohttp.ClientSession(
        base_url=url, headers=headers, connector=connector,
        timeout=aiohttp.ClientTimeout(total=60),
    ) as http:  # fmt: skip
        # one of each read, so import and first-query costs are not timed
        for rid in load.data["request_ids"][:5]:
            async with http.get(f"/v1/requests/{rid}") as r:
                await r.read()
        async with http.get(f"/v1/pairs/{load.data['pairs'][0]}") as r:
            await r.read()
        # baseline, same machine, same moment: one client, look-ups one after another
        rng = random.Random(-1)
        baseline: list[float] = []
        for _ in range(BASELINE_LOOKUPS):
            op = rng.choice(LOOKUPS)
            req = load.request_for(op, rng)
            assert req is not None
            t0 = time.perf_counter()
            async with http.request(req[0], req[1], **req[2]) as r:
                await r.read()
                r.raise_for_status()
            baseline.append(time.perf_counter() - t0)
        load1_before = os.getloadavg()[0]
        start = time.monotonic()
        load.measure_from = time.perf_counter() + warmup
        deadline = start + warmup + duration
        marks: dict[str, Any] = {}

        async def sample() -> None:
            await asyncio.sleep(warmup)
            marks["start_perf"] = time.perf_counter()
            marks["cpu"] = (
                {p: cpu_s(p) for p in process_tree(pid)},
                time.process_time(),
                time.monotonic(),
            )
            while time.monotonic() < deadline:
                rss.append((time.monotonic() - start - warmup, tree_kb(pid)))
                await asyncio.sleep(0.5)

        tasks = [load.client(http, deadline, i, think_s) for i in range(clients)]
        await asyncio.gather(sample(), *tasks)
        procs0, client0, t_measure = marks["cpu"]
        elapsed = time.monotonic() - t_measure
        server_cpu = cpu_s(pid) - procs0.get(pid, 0.0)
        workers_cpu = sum(cpu_s(p) - c for p, c in procs0.items() if p != pid)
        client_cpu = time.process_time() - client0
        cpu = {"server_cores": round(server_cpu / elapsed, 2),
               "write_workers_cores": round(workers_cpu / elapsed, 2),
               "bench_client_cores": round(client_cpu / elapsed, 2)}  # fmt: skip
    return {"elapsed_s": elapsed, "rss": rss, "load1_before": load1_before, "baseline": baseline,
            "load1_after": os.getloadavg()[0], "cpu": cpu,
            "start_perf": marks["start_perf"]}  # fmt: skip


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--duration", type=float, default=30.0, help="Seconds of load.")
    ap.add_argument("--batch", type=int, default=100, help="Tags per ingest batch.")
    ap.add_argument("--postgres", default=PG_URL, help="Server to create the scratch DB on.")
    ap.add_argument(
        "--registrations",
        type=int,
        default=400,
        help="Fresh model directories to register (each registered once).",
    )
    ap.add_argument(
        "--think-ms",
        type=float,
        default=0.0,
        help="Mean think time between a client's requests (exponential); 0, the default, "
        "is a closed loop with a request always in flight per client.",
    )
    ap.add_argument(
        "--warmup",
        type=float,
        default=5.0,
        help="Seconds every client runs before the measured window (reported apart).",
    )
    ap.add_argument(
        "--write-processes",
        type=int,
        default=2,
        help="PAIRREG_WRITE_PROCESSES for the server (0: writes on the server's threads).",
    )
    ap.add_argument("--keep", action="store_true", help="Keep the scratch database and files.")
    args = ap.parse_args()

    from registry.services.system import initialise, read_credentials
    from registry.settings import Settings
    from tests.serve_process import free_port

    url = scratch_db(args.postgres)
    tmp = Path(tempfile.mkdtemp(prefix="pairreg-load-"))
    home = tmp / "home"
    proc: subprocess.Popen[bytes] | None = None
    try:
        # 5% of operations; once the directories run out, registrations are skipped
        data = seed(url, tmp, args.registrations)
        settings = Settings(home=home, database_url=url)
        initialise(settings)
        creds = read_credentials(settings.credentials_path)
        assert creds is not None, "no admin credentials after initialise"
        token = creds["token"]
        db.dispose_engines()
        port = free_port()
        proc = start_server(url, home, port, args.write_processes)
        rss_start = tree_kb(proc.pid)
        load = Load(data, args.batch)
        run = asyncio.run(
            run_load(
                f"http://127.0.0.1:{port}",
                token,
                load,
                args.clients,
                args.duration,
                proc.pid,
                args.think_ms / 1000,
                args.warmup,
            )
        )
        peak_kb = tree_kb(proc.pid, "VmHWM")
        rss = run["rss"]
        half = [kb for t, kb in rss if t <= run["elapsed_s"] / 2]
        rss_half = max(half) if half else rss_start
        rss_end = rss[-1][1] if rss else tree_kb(proc.pid)
        verify = subprocess.run(
            [sys.executable, "-m", "cli.main", "audit", "verify"],
            cwd=REPO, capture_output=True, text=True, timeout=600,
            env={**os.environ, "PAIRREG_DATABASE_URL": url, "PAIRREG_HOME": str(home)},
        )  # fmt: skip
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if not args.keep:
            drop_db(args.postgres, url)
            shutil.rmtree(tmp, ignore_errors=True)

    total = sum(len(v) for v in load.lat.values())
    five_xx = sum(n for st in load.status.values() for code, n in st.items() if code >= 500)
    intended_4xx = sum(
        n for op, st in load.status.items() for code, n in st.items()
        if 400 <= code < 500 and load.expected(op, code)
    )  # fmt: skip
    ops = {
        op: {
            "count": len(load.lat[op]),
            "p50_ms": round(pct(load.lat[op], 0.50) * 1000, 1),
            "p99_ms": round(pct(load.lat[op], 0.99) * 1000, 1),
            "max_ms": round(max(load.lat[op], default=float("nan")) * 1000, 1),
            "statuses": dict(sorted(load.status[op].items())),
        }
        for op in WEIGHTS
        if load.lat[op]
    }
    lookup_lat = [x for op in LOOKUPS for x in load.lat[op]]
    warmup_lat = [x for op in LOOKUPS for x in load.warmup_lat[op]]
    # the look-up p99 of each 5-second slice of the measured window: steady, or not?
    slices: dict[int, list[float]] = defaultdict(list)
    for op in LOOKUPS:
        for x, t0 in zip(load.lat[op], load.started[op], strict=True):
            slices[int((t0 - run["start_perf"]) // SLICE_S)].append(x)
    slice_p99 = [round(pct(slices[i], 0.99) * 1000, 1) for i in sorted(slices)]
    report = {
        "clients": args.clients,
        "think_ms": args.think_ms,
        "duration_s": round(run["elapsed_s"], 1),
        "requests": total,
        "throughput_rps": round(total / run["elapsed_s"], 1),
        "tags_ingested": len(load.lat["ingest_batch"]) * args.batch,
        "operations": ops,
        "lookup_p50_ms": round(pct(lookup_lat, 0.50) * 1000, 1),
        "lookup_p99_ms": round(pct(lookup_lat, 0.99) * 1000, 1),
        f"lookup_p99_ms_per_{SLICE_S}s": slice_p99,
        "warmup": {
            "seconds": args.warmup,
            "lookups": len(warmup_lat),
            "lookup_p50_ms": round(pct(warmup_lat, 0.50) * 1000, 1),
            "lookup_p99_ms": round(pct(warmup_lat, 0.99) * 1000, 1),
            "lookup_max_ms": round(max(warmup_lat, default=float("nan")) * 1000, 1),
        },
        "baseline_1_client_lookup_p50_ms": round(pct(run["baseline"], 0.50) * 1000, 1),
        "baseline_1_client_lookup_p99_ms": round(pct(run["baseline"], 0.99) * 1000, 1),
        "lookup_p99_vs_1_client_p99": round(
            pct(lookup_lat, 0.99) / max(pct(run["baseline"], 0.99), 1e-9), 1
        ),
        "errors_5xx": five_xx,
        "transport_errors": sum(load.transport_errors.values()),
        "unexpected_errors": len(load.unexpected),
        "unexpected_sample": load.unexpected[:5],
        "intended_4xx": intended_4xx,
        "write_processes": args.write_processes,
        "server_rss_mib": {  # the server process and its write workers
            "start": round(rss_start / 1024, 1),
            "half": round(rss_half / 1024, 1),
            "end": round(rss_end / 1024, 1),
            "peak": round(peak_kb / 1024, 1),
        },
        "audit_verify": {"rc": verify.returncode, "out": verify.stdout.strip()[-300:]},
        "cpu_during_load": run["cpu"],
        "machine": {
            "cpus": os.cpu_count(),
            "load1_before": round(run["load1_before"], 2),
            "load1_after": round(run["load1_after"], 2),
        },
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    targets = {
        "no_5xx": five_xx == 0,
        "no_unexpected_errors": not load.unexpected,
        "lookup_p99_under_50ms": report["lookup_p99_ms"] < 50,
        "memory_bounded": rss_end <= 1.5 * max(rss_half, 1),
        "audit_verifies": verify.returncode == 0,
    }
    report["targets"] = targets
    print(json.dumps(report, indent=2))
    return 0 if all(targets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
