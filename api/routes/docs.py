"""``/docs``: Swagger UI for the OpenAPI document, every asset served by this server.

FastAPI's own ``/docs`` (and ``/redoc``) load their JavaScript and CSS from a CDN: a page
that holds a user's bearer token would run whatever that CDN serves. Here the page, its
start-up script and Swagger UI itself (``swagger-ui-dist``, vendored from the npm registry
with its license and checked by ``SHA256SUMS``, see ``api/static/vendor/vendor.sh``) come
from this origin, and a Content-Security-Policy lets the page load nothing else and run no
inline script. ReDoc is not served (it would need a second vendored bundle).
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from api.routes.dashboard import STATIC

router = APIRouter(include_in_schema=False)

_PAGE = STATIC / "docs" / "index.html"
# Same origin only; images may be data: URIs (Swagger UI's icons); "Try it out" calls the API
# on this origin.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)


@router.get("/docs", response_class=HTMLResponse)
def docs() -> HTMLResponse:
    return HTMLResponse(
        _PAGE.read_text(encoding="utf-8"),
        headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"},
    )
