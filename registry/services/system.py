"""Setting up a registry home: schema, signing key, first admin token, credentials file."""

from __future__ import annotations

import getpass
import json
import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select

from registry import db
from registry.db import session_scope
from registry.services.tokens import create_token
from registry.settings import Settings
from registry.tables import ApiToken
from registry.trust.audit import ensure_signing_key

ADMIN_TOKEN_NAME = "admin"


def os_actor() -> str:
    """Who acts in embedded mode: the operating-system user, marked as local."""
    try:
        return f"local:{getpass.getuser()}"
    except (KeyError, OSError):
        return f"local:uid{os.getuid()}"


@dataclass
class InitReport:
    home: Path
    database_url: str
    schema_revision: str | None
    upgraded: bool
    admin_token_created: bool
    credentials_path: Path
    public_key_path: Path


def write_credentials(path: Path, token: str, url: str | None = None) -> None:
    """Store the admin secret readable by the owner only (0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"token": token, "name": ADMIN_TOKEN_NAME, "url": url}, fh)
    path.chmod(0o600)


def read_credentials(path: Path) -> dict[str, str] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def initialise(settings: Settings) -> InitReport:
    """Idempotent: a second run changes nothing and creates no second admin token."""
    home = settings.home_dir
    home.mkdir(parents=True, exist_ok=True)
    (home / "cache").mkdir(exist_ok=True)
    url = settings.db_url
    before = db.current_revision(url)
    head = db.head_revision()
    upgraded = before != head
    if upgraded:
        db.upgrade(url)
    ensure_signing_key(settings.signing_key_path, settings.public_key_path)
    created = False
    with session_scope(url) as session:
        has_admin = session.scalar(
            select(func.count()).select_from(ApiToken).where(ApiToken.role == "admin")
        )
        if not has_admin:
            minted = create_token(session, name=ADMIN_TOKEN_NAME, role="admin", actor=os_actor())
            write_credentials(settings.credentials_path, minted.secret)
            created = True
    return InitReport(
        home=home,
        database_url=url,
        schema_revision=head,
        upgraded=upgraded,
        admin_token_created=created,
        credentials_path=settings.credentials_path,
        public_key_path=settings.public_key_path,
    )
