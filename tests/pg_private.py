"""A private PostgreSQL cluster for fault tests: its own data directory and port, so a
test can restart or stop it without touching the shared server others are using.

initdb refuses to run as root, so as root the cluster belongs to the ``postgres`` user
(``runuser``); otherwise to whoever runs the tests. Binaries are found on PATH or under
``/usr/lib/postgresql/<version>/bin``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.serve_process import free_port


def pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    return candidates[0] if candidates else None


class PrivatePostgres:
    def __init__(self) -> None:
        initdb, pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            raise RuntimeError("initdb/pg_ctl not found (install postgresql)")
        self.initdb, self.pg_ctl = initdb, pg_ctl
        self.user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError as exc:
                raise RuntimeError("running as root and no postgres user for initdb") from exc
            self.user = "postgres"
        # Not under pytest's tmp_path: that is mode 0700 and root's, unreadable to postgres.
        self.root = Path(tempfile.mkdtemp(prefix="pairreg-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = free_port()
        if self.user:
            shutil.chown(self.root, self.user)
        self._run(self.initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")  # fmt: skip

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=120)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                "-c fsync=off -c max_connections=100")  # fmt: skip
        self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w",
                  "-t", "60", "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run(self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop",
                  check=False)  # fmt: skip

    def restart(self, down_for: float = 0.0) -> None:
        """Stop (fast: every connection is cut, open transactions roll back), stay down
        ``down_for`` seconds, start again."""
        self.stop("fast")
        time.sleep(down_for)
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
