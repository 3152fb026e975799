"""Routers by area; ``api.app`` mounts every module listed in ``ROUTERS`` that exists."""

ROUTERS = [
    "api.routes.health",
    "api.routes.dashboard",
    "api.routes.artifacts",
    "api.routes.pairs",
    "api.routes.audit",
    "api.routes.tokens",
    "api.routes.governance",
    "api.routes.requests",
]
