"""The dashboard: one static page that reads the same API with the user's token.

No server-side sessions or cookies: the page keeps the token in the browser's local
storage and sends it as a bearer token, so the roles apply exactly as for any client.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, RedirectResponse

router = APIRouter(include_in_schema=False)

_PAGE = Path(__file__).resolve().parent.parent / "static" / "dashboard.html"


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/dashboard")


@router.get("/dashboard", response_class=HTMLResponse)
def dashboard() -> HTMLResponse:
    return HTMLResponse(_PAGE.read_text(encoding="utf-8"))
