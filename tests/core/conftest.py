"""Helpers for the registry-core tests: run the real ``pairreg`` entry point in-process, count
what the database holds, and build small model directories."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from registry.db import session_scope
from registry.settings import Settings, reset_settings
from registry.tables import Artifact, AuditEvent, Lineage, Pair
from tests.fixtures import write_fake_model
from tests.hubserver import hub_server  # noqa: F401 - re-exported pytest fixture


@dataclass
class CliResult:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., CliResult]:
    """Run ``pairreg ARGS`` through ``cli.main.main`` (the console script's function), so the
    exit code and the one-line error are exactly what a user sees."""
    from cli import render
    from cli.main import main

    monkeypatch.setattr(render.console, "width", 250)  # tables unwrapped, one row per line

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["pairreg", *args])
        reset_settings()
        try:
            main()
            rc = 0
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(rc, captured.out, captured.err)

    return run


def counts(url: str) -> dict[str, int]:
    """Rows that registration writes; equal before and after means nothing was written."""
    with session_scope(url) as s:
        return {
            model.__tablename__: int(s.scalar(select(func.count()).select_from(model)) or 0)
            for model in (Artifact, Lineage, Pair, AuditEvent)
        }


def audit_actions(url: str) -> list[str]:
    with session_scope(url) as s:
        return list(s.scalars(select(AuditEvent.action).order_by(AuditEvent.seq)))


def audit_events(url: str, action: str) -> list[AuditEvent]:
    with session_scope(url) as s:
        rows = list(
            s.scalars(
                select(AuditEvent).where(AuditEvent.action == action).order_by(AuditEvent.seq)
            )
        )
        s.expunge_all()
        return rows


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    """Two target versions, a compatible draft, heads of the right and wrong width."""
    base = tmp_path / "models"
    return {
        "t1": write_fake_model(base / "t1", weights=b"target-v1"),
        "t2": write_fake_model(base / "t2", weights=b"target-v2"),
        "draft": write_fake_model(base / "draft", hidden_size=32, weights=b"draft"),
        "heads": write_fake_model(
            base / "heads",
            weights=b"heads",
            config_extra={"medusa_num_heads": 3, "medusa_num_layers": 1},
            tokenizer=False,
        ),
        "heads_wide": write_fake_model(
            base / "heads_wide", hidden_size=128, weights=b"heads-wide", tokenizer=False
        ),
    }


@pytest.fixture
def url(home: Settings) -> str:
    return home.db_url
