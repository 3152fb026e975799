"""Routers the app mounts besides the generated operation routes (``api.operations``):
probes, the dashboard, ``/docs``, and the OpenAI-compatible serving endpoints."""

ROUTERS = [
    "api.routes.health",
    "api.routes.dashboard",
    "api.routes.docs",
    "api.operations",
    "api.routes.serving",
    "api.routes.mlflow_webhook",
]
