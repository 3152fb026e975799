"""Output helpers: rich tables for people, ``--json`` for machines, one-line errors."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

console = Console()
err_console = Console(stderr=True)


def to_jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    return value


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(value), indent=2, sort_keys=True, default=str) + "\n")


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    t = Table(title=title, show_lines=False)
    for col in columns:
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(*["" if v is None else str(v) for v in row])
    console.print(t)


def kv(title: str, pairs: Sequence[tuple[str, Any]]) -> None:
    t = Table(title=title, show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value", overflow="fold")
    for key, value in pairs:
        if isinstance(value, dict | list):
            value = json.dumps(value, sort_keys=True)
        t.add_row(key, "" if value is None else str(value))
    console.print(t)


def short(digest: str | None, n: int = 12) -> str:
    return digest[:n] if digest else "-"


def error_line(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
