"""CLI tables print user data as typed: rich markup in a value is escaped, never applied."""

from __future__ import annotations

import pytest

from cli import render

# A request id is free text up to 200 characters chosen by whoever serves requests.
HOSTILE = "[link=https://evil.example]ok[/link] [red]FAIL[/red] [bold"


@pytest.mark.parametrize("how", ["table", "kv"])
def test_markup_in_data_prints_literally(how: str) -> None:
    with render.console.capture() as cap:
        if how == "table":
            render.table(f"tags {HOSTILE}", ["request [x]"], [[HOSTILE], [None], [{"k": "[b]v"}]])
        else:
            render.kv(f"request {HOSTILE}", [("request", HOSTILE), ("spec", ["[i]x[/i]"])])
    out = cap.get()
    flat = "".join(out.split())  # the table may fold a long cell across lines
    assert "".join(HOSTILE.split()) in flat
    assert '["[i]x[/i]"]' in flat or '{"k":"[b]v"}' in flat


def test_markup_the_cli_writes_still_styles() -> None:
    with render.console.capture() as cap:
        render.kv("t", [("state", render.styled("[red]INCONSISTENT[/]"))])
    out = cap.get()
    assert "INCONSISTENT" in out and "[red]" not in out
