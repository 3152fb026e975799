"""Benchmark pairreg's manifest hashing against coreutils ``sha256sum``.

Usage::

    python bench/hash_bench.py [--size-gib 1.0] [--dir DIR] [--files 8] [--repeat 3]
                               [--workers N] [--keep]

What it does:

1. Creates ``--files`` files totalling ``--size-gib`` GiB under ``--dir`` (default: a fresh
   temporary directory, removed afterwards unless ``--keep``; an existing directory with the
   expected files is reused). Content is an ``os.urandom`` block per file with a per-MiB
   counter stamped in, so no two MiB are equal; SHA-256 cost does not depend on content, and
   the page cache does not compress, so this is as good as real weights and fast to write.
2. Warms the page cache by reading every file once (``sha256sum``), so both contenders are
   timed **from a warm cache**: the comparison is of hashing throughput, not disk speed.
3. Times, alternating, ``--repeat`` runs of
   * ``sha256sum FILE...`` — one process, files one after another (the serial baseline);
   * a child Python process running only ``registry.artifacts.manifest.build_manifest(DIR)``.
   For the child, the reported time is measured inside it around ``build_manifest`` (not
   interpreter start-up), and peak memory is its ``ru_maxrss`` from ``os.wait4`` — the whole
   process's resident set high-water mark, interpreter included.
4. Checks both produced the same SHA-256 per file, and prints median times, the ratio
   pairreg / sha256sum and the peak RSS. Targets: ratio ≤ 0.6 on 2 cores, peak < 150 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20
BLOCK = 8 * MIB


def generate(directory: Path, total_bytes: int, n_files: int) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    per_file = total_bytes // n_files
    paths = []
    for i in range(n_files):
        path = directory / f"model-{i + 1:05d}-of-{n_files:05d}.safetensors"
        paths.append(path)
        if path.is_file() and path.stat().st_size == per_file:
            continue
        block = bytearray(os.urandom(BLOCK))
        written = 0
        with open(path, "wb") as fh:
            while written < per_file:
                n = min(BLOCK, per_file - written)
                for off in range(0, n, MIB):  # unique stamp per MiB
                    block[off : off + 8] = (written + off).to_bytes(8, "little")
                fh.write(memoryview(block)[:n])
                written += n
    return paths


def run_sha256sum(paths: list[Path]) -> tuple[float, dict[str, str]]:
    start = time.perf_counter()
    out = subprocess.run(
        ["sha256sum", *map(str, paths)], check=True, capture_output=True, text=True
    ).stdout
    elapsed = time.perf_counter() - start
    digests = {}
    for line in out.splitlines():
        digest, name = line.split(maxsplit=1)
        digests[Path(name.lstrip("*")).name] = digest
    return elapsed, digests


CHILD = """
import json, sys, time
sys.path.insert(0, {root!r})
from registry.artifacts.manifest import build_manifest
t = time.perf_counter()
m = build_manifest({directory!r}, workers={workers!r})
dt = time.perf_counter() - t
print(json.dumps({{"seconds": dt, "entries": m.entries}}))
"""


def run_pairreg(directory: Path, workers: int | None) -> tuple[float, float, int, dict[str, str]]:
    """Returns (hashing seconds, process wall seconds, peak RSS KiB, digests)."""
    code = CHILD.format(root=str(ROOT), directory=str(directory), workers=workers)
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"pairreg child failed with {proc.returncode}")
        out.seek(0)
        result = json.loads(out.read())
    digests = {e["path"]: e["sha256"] for e in result["entries"]}
    return result["seconds"], wall, usage.ru_maxrss, digests


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None, help="default: one per core")
    ap.add_argument("--keep", action="store_true", help="keep a generated temporary directory")
    args = ap.parse_args(argv)
    if shutil.which("sha256sum") is None:
        raise SystemExit("sha256sum (GNU coreutils) is required for the baseline")

    owned = args.dir is None
    directory = Path(tempfile.mkdtemp(prefix="pairreg-hash-bench-")) if owned else args.dir
    try:
        total = int(args.size_gib * (1 << 30))
        t0 = time.perf_counter()
        paths = generate(directory, total, args.files)
        size = sum(p.stat().st_size for p in paths)
        print(
            f"data: {len(paths)} files, {size / (1 << 30):.2f} GiB in {directory} "
            f"(prepared in {time.perf_counter() - t0:.1f}s)"
        )
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        print(f"cores: {cores}; timing from a warm page cache (one untimed warm-up read)")
        run_sha256sum(paths)  # warm-up

        base_times, ours_times, walls, rss = [], [], [], []
        for _ in range(args.repeat):
            t, ref = run_sha256sum(paths)
            base_times.append(t)
            secs, wall, maxrss, got = run_pairreg(directory, args.workers)
            ours_times.append(secs)
            walls.append(wall)
            rss.append(maxrss)
            if got != ref:
                raise SystemExit("MISMATCH: pairreg and sha256sum disagree")
        base = statistics.median(base_times)
        ours = statistics.median(ours_times)
        wall = statistics.median(walls)
        gib = size / (1 << 30)
        print(
            f"sha256sum (serial):      {base:7.3f} s  ({gib / base:6.2f} GiB/s)  runs {base_times}"
        )
        print(
            f"pairreg build_manifest:  {ours:7.3f} s  ({gib / ours:6.2f} GiB/s)  runs {ours_times}"
        )
        print(f"pairreg process wall:    {wall:7.3f} s  (incl. interpreter start-up)")
        print(f"ratio pairreg/sha256sum: {ours / base:7.3f}  (target <= 0.6)")
        print(f"pairreg peak RSS:        {max(rss) / 1024:7.1f} MiB (target < 150)")
        print("digests: identical for every file")
        return 0
    finally:
        if owned and not args.keep:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
