"""The dashboard: a static single-page app that reads the same API with the user's token.

No server-side sessions or cookies: the page keeps the token in the browser's local
storage and sends it as a bearer token, so the roles apply exactly as for any client (and
``GET /v1/whoami`` tells the page which actions to show at all). Everything it loads is
served from the package: its own HTML, CSS and JavaScript, and uPlot vendored from the npm
registry with its license (``api/static/vendor``). No CDN.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from registry.errors import NotFound

router = APIRouter(include_in_schema=False)

STATIC = Path(__file__).resolve().parent.parent / "static"
_PAGE = STATIC / "dashboard" / "index.html"
_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".png": "image/png",
    "": "text/plain; charset=utf-8",  # LICENSE, SHA256SUMS
}
# Content-Security-Policy: only this origin's scripts, styles, images and API calls.
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/dashboard")


@router.get("/dashboard", response_class=HTMLResponse)
def dashboard() -> HTMLResponse:
    return HTMLResponse(
        _PAGE.read_text(encoding="utf-8"), headers={"Content-Security-Policy": _CSP}
    )


@router.get("/dashboard/static/{path:path}")
def static_file(path: str) -> FileResponse:
    """A file of the dashboard or its vendored libraries; nothing outside ``api/static``."""
    target = (STATIC / path).resolve()
    if (
        not target.is_relative_to(STATIC)
        or not target.is_file()
        or target.suffix not in _TYPES
        or target.name.startswith(".")
    ):
        raise NotFound(f"no dashboard file {path}", field="path")
    return FileResponse(
        target,
        media_type=_TYPES[target.suffix],
        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
    )
