"""Checking an MLflow registry webhook delivery before anything acts on it.

MLflow 3.x signs a delivery like Standard Webhooks, under its own header names:
``X-MLflow-Delivery-Id``, ``X-MLflow-Timestamp`` (Unix seconds) and
``X-MLflow-Signature: v1,<base64 HMAC-SHA256(key, "{delivery_id}.{timestamp}.{body}")>``.
One difference from Standard Webhooks: the HMAC key is the secret's UTF-8 bytes as given to
MLflow (no ``whsec_`` prefix, no base64 decoding). The body is
``{"entity", "action", "timestamp", "data"}``; the event is ``entity.action``
(``model_version.created``, ``model_version_alias.created``, …).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from registry.errors import InvalidInput, Unauthorized

SIGNATURE = "x-mlflow-signature"
TIMESTAMP = "x-mlflow-timestamp"
DELIVERY_ID = "x-mlflow-delivery-id"


@dataclass(frozen=True)
class MlflowDeliveryIn:
    delivery_id: str
    timestamp: int
    event: str
    data: dict[str, Any]


def mlflow_signature(secret: str, delivery_id: str, timestamp: str, body: bytes) -> str:
    """The signature MLflow sends for this body (used by the check and by tests)."""
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    mac = hmac.new(secret.encode("utf-8"), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode("ascii")


def verify_delivery(
    secret: str | None, headers: dict[str, str], body: bytes, *, now: float, tolerance: float
) -> MlflowDeliveryIn:
    """Signature, then freshness, then shape; any failure is a 4xx and nothing is done.

    Unauthorized (401) for anything about who sent it (no secret configured, headers
    missing, signature wrong, timestamp outside the tolerance: a stale signed delivery is
    a replay by another name); InvalidInput (422) for a well-signed body that is not an
    MLflow event."""
    if not secret:
        raise Unauthorized("no MLflow webhook secret is configured (PAIRREG_MLFLOW_WEBHOOK_SECRET)")
    h = {k.lower(): v for k, v in headers.items()}
    delivery_id, ts, signature = h.get(DELIVERY_ID), h.get(TIMESTAMP), h.get(SIGNATURE)
    if not (delivery_id and ts and signature):
        raise Unauthorized(
            "X-MLflow-Delivery-Id, X-MLflow-Timestamp and X-MLflow-Signature are required"
        )
    if len(delivery_id) > 200:
        raise Unauthorized("X-MLflow-Delivery-Id is too long")
    expected = mlflow_signature(secret, delivery_id, ts, body)
    offered = [s.strip() for s in signature.split(" ") if s.strip()]
    if not any(hmac.compare_digest(expected, s) for s in offered):
        raise Unauthorized("X-MLflow-Signature does not match the body")
    try:
        stamp = int(ts)
    except ValueError as exc:
        raise Unauthorized("X-MLflow-Timestamp is not Unix seconds") from exc
    if abs(now - stamp) > tolerance:
        raise Unauthorized(
            f"X-MLflow-Timestamp is {int(now - stamp)} s from this server's clock "
            f"(tolerance {int(tolerance)} s)"
        )
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput("the body is not JSON", field="body") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
        raise InvalidInput("the body has no data object", field="data")
    entity, action = doc.get("entity"), doc.get("action")
    if not isinstance(entity, str) or not isinstance(action, str):
        raise InvalidInput("entity and action are required", field="entity")
    return MlflowDeliveryIn(delivery_id, stamp, f"{entity}.{action}", doc["data"])
