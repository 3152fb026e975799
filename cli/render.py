"""Output helpers: rich tables for people, ``--json`` for machines, one-line errors."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

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


def cell(value: Any) -> str | Text:
    """A table cell. Values are data (names, ids, reasons, policy text a client chose), so
    rich markup in them is escaped: ``[red]`` or ``[link=…]`` in a deployment name prints as
    typed instead of restyling the table. Styled text the CLI means goes in as a ``Text``."""
    if isinstance(value, Text):
        return value
    if value is None:
        return ""
    if isinstance(value, dict | list):
        value = json.dumps(value, sort_keys=True)
    return escape(str(value))


def styled(markup: str) -> Text:
    """Markup the CLI itself writes (never data), for a table cell."""
    return Text.from_markup(markup)


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    t = Table(title=None if title is None else escape(title), show_lines=False)
    for col in columns:
        t.add_column(escape(col), overflow="fold")
    for row in rows:
        t.add_row(*[cell(v) for v in row])
    console.print(t)


def kv(title: str, pairs: Sequence[tuple[str, Any]]) -> None:
    t = Table(title=escape(title), show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value", overflow="fold")
    for key, value in pairs:
        t.add_row(cell(key), cell(value))
    console.print(t)


def short(digest: str | None, n: int = 12) -> str:
    return digest[:n] if digest else "-"


def error_line(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
