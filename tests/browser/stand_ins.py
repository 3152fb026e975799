"""Stand-ins for operations other parts of the service declare (online α per deployment,
pair economics), mounted only when the app does not serve them, so the dashboard's panels
for them are exercised either way. Their shapes follow the declared operations
(``OnlineAlpha``: buckets oldest first with counts, α and the validated α, one monitor per
pair; ``EconomicsReport``: points by batch size, hardware, measured speed-up); the browser
tests compare the charts with whatever the API answers, stand-in or real.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import Depends, FastAPI

from api.auth import require
from registry.governance import roles

ONLINE_PATH = "/v1/deployments/{name}/online-alpha"
ECONOMICS_PATH = "/v1/pairs/{pair}/economics"
BUCKETS = 6


def _online_alpha(name: str) -> dict[str, Any]:
    now = datetime.now(UTC).replace(microsecond=0)
    buckets = []
    for i in range(BUCKETS):
        drafted, accepted = 3200, 2400 - 90 * i
        start = now - timedelta(minutes=5 * (BUCKETS - i))
        buckets.append(
            {
                "start": start.isoformat(),
                "end": (start + timedelta(minutes=5)).isoformat(),
                "requests": 100 + 7 * i,
                "tested": 100 + 7 * i,
                "drafted": drafted,
                "accepted": accepted,
                "alpha": accepted / drafted,
                "validated_alpha": 0.75,
                "e_value": 1.0 + i,
                "state": "watching",
            }
        )
    return {
        "deployment": name,
        "bucket_seconds": 300,
        "method": "stand-in",
        "monitors": [
            {
                "pair_digest": "0" * 64,
                "live": True,
                "state": "watching",
                "validated_alpha": 0.75,
                "alpha": 0.7,
                "tested": 645,
                "e_value": 6.0,
                "level": 0.01,
                "alarms": 0,
                "flag_id": None,
            }
        ],  # fmt: skip
        "buckets": buckets,
    }


def _economics(pair: str) -> dict[str, Any]:
    points = []
    for batch, speedup in ((1, 2.1), (8, 1.7), (32, 1.2), (128, 0.8)):
        points.append(
            {"batch": batch, "fits": batch <= 32, "speedup": speedup, "bound": "memory",
             "plain_tokens_per_s": 40.0, "spec_tokens_per_s": 40.0 * speedup,
             "cost_per_million_plain": 2.0, "cost_per_million_emitted": 2.0 / speedup,
             "cost_per_million_accepted_draft": 3.0}
        )  # fmt: skip
    return {
        "pair_digest": pair,
        "tau": 2.9,
        "tau_source": "stand-in",
        "dtype": "bfloat16",
        "context": 4096,
        "hardware": {"name": "stand-in", "kind": "shipped"},
        "max_batch_plain": 40,
        "max_batch_spec": 32,
        "draft_memory_fraction": 0.05,
        "break_even_batch": 128,
        "points": points,
        "measured": None,
        "notes": ["a stand-in for the economics operation"],
    }


def mount_missing(app: FastAPI) -> list[str]:
    """Add the stand-ins whose paths the app does not serve; return the paths added."""
    served = set(app.openapi()["paths"])
    added = []
    if ONLINE_PATH not in served:

        def online_alpha(
            name: str, _: object = Depends(require(roles.READ_REGISTRY))
        ) -> dict[str, Any]:
            return _online_alpha(name)

        app.add_api_route(ONLINE_PATH, online_alpha, methods=["GET"])
        added.append(ONLINE_PATH)
    if ECONOMICS_PATH not in served:

        def economics(
            pair: str, _: object = Depends(require(roles.READ_REGISTRY))
        ) -> dict[str, Any]:
            return _economics(pair)

        app.add_api_route(ECONOMICS_PATH, economics, methods=["GET"])
        added.append(ECONOMICS_PATH)
    app.openapi_schema = None  # the page discovers them in /openapi.json
    return added
