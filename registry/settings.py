"""One settings object for the whole process.

Every path the registry touches hangs off ``PAIRREG_HOME`` so that the embedded default
(SQLite + local MLflow store) lives in one folder a user can inspect, back up or delete.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Process configuration, read from ``PAIRREG_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="PAIRREG_", extra="ignore")

    home: Path = Field(default=Path("~/.pairreg"), description="Data directory.")
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; defaults to SQLite at $PAIRREG_HOME/registry.db.",
    )
    url: str | None = Field(
        default=None, description="Server URL; when set the CLI works in remote mode."
    )
    token: str | None = Field(default=None, description="Bearer token for remote mode.")
    mlflow_tracking_uri: str | None = Field(
        default=None,
        description="MLflow tracking URI; MLFLOW_TRACKING_URI or a local store by default.",
    )
    hash_workers: int | None = Field(default=None, description="Threads for file hashing.")
    max_body_bytes: int = Field(
        default=1024 * 1024, gt=0, description="Largest request body for most routes (413)."
    )
    max_results_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        gt=0,
        description="Largest body for worker results (/v1/measurements, /v1/jobs/...).",
    )
    max_ingest_body_bytes: int = Field(
        default=16 * 1024 * 1024,
        gt=0,
        description="Largest body for ingest (/v1/requests, /v1/telemetry/...).",
    )
    body_timeout: float = Field(
        default=60.0, gt=0, description="Seconds a request body may take to arrive (408)."
    )
    header_timeout: float = Field(
        default=10.0, gt=0, description="Seconds a request's headers may take (then closed)."
    )
    read_concurrency: int = Field(
        default=8,
        ge=1,
        le=20,
        description="API worker threads for read (GET) operations; they never wait behind "
        "writes (api/lanes.py). Reads are mostly Python sharing one interpreter lock: more "
        "threads add switching, not throughput (docs/reliability.md#load).",
    )
    write_concurrency: int = Field(
        default=4,
        ge=1,
        le=6,
        description="API write operations run at once; further writes wait their turn "
        "without holding a thread or a database connection (api/lanes.py).",
    )
    token_cache_seconds: float = Field(
        default=2.0,
        ge=0,
        le=60,
        description="Seconds the API remembers who a bearer token is (api/auth.py); a token "
        "revoked through another server is refused here within that time. 0: look up every "
        "request.",
    )
    write_processes: int = Field(
        default=0,
        ge=0,
        le=8,
        description="Worker processes for API write operations (api/write_pool.py); 0 runs "
        "them on threads of the server process. With a server database, 2 keeps look-ups "
        "fast under heavy writes (docs/reliability.md#load).",
    )
    write_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="Niceness added to the write worker processes: when the cores are "
        "short, the scheduler serves the reads first.",
    )
    artifact_roots: str | None = Field(
        default=None,
        description="Directories (separated by the OS path separator, ':' on POSIX) under "
        "which a remote client may name local sources; $PAIRREG_HOME/models by default. "
        "The embedded CLI, acting as the local user, is not confined.",
    )
    max_source_files: int = Field(
        default=10_000, ge=1, description="Most files a remote client's local source may hold."
    )
    max_source_bytes: int = Field(
        default=1 << 40, ge=1, description="Most bytes a remote client's local source may hold."
    )
    hub_tokens: dict[str, str] = Field(
        default_factory=dict,
        description="Hugging Face tokens by repository id, organisation or '*' (JSON, e.g. "
        '{"acme": "hf_…", "acme/private-8b": "hf_…"}); a repository with none is read '
        "without a token.",
        repr=False,
    )
    hub_ambient_token: bool = Field(
        default=False,
        description="Let repositories without a configured token use this process's own "
        "Hugging Face login (HF_TOKEN, huggingface-cli login).",
    )
    log_origin: str | None = Field(
        default=None,
        description="Origin line (and key name) of the audit log's C2SP checkpoints; "
        "pairreg/audit/<16 hex of the signing key's SHA-256> by default.",
    )
    metrics_public: bool = Field(
        default=False,
        description="Serve GET /metrics without a token (a private scrape network); "
        "otherwise it needs a token with a registry-reading role.",
    )
    serve_max_prompts: int = Field(
        default=16, ge=1, le=1024, description="Most prompts one /v1/completions request holds."
    )
    serve_max_tokens: int = Field(
        default=256,
        ge=1,
        le=1024,
        description="Largest max_tokens (max_completion_tokens) embedded serving accepts.",
    )
    serve_max_generations: int = Field(
        default=4,
        ge=1,
        description="Requests generating (or loading their model) at once in one server "
        "process; beyond it 503 with Retry-After.",
    )
    serve_max_generations_per_token: int = Field(
        default=2,
        ge=1,
        description="Of those, most for one token; beyond it 429 with Retry-After.",
    )

    webhook_backoff_base: float = Field(
        default=1.0,
        gt=0,
        description="Seconds before the first retry of an outgoing webhook; doubles per "
        "failed attempt (docs/lifecycle.md).",
    )
    webhook_backoff_max: float = Field(
        default=600.0, gt=0, description="Longest wait between two attempts at one webhook."
    )
    webhook_timeout: float = Field(
        default=10.0, gt=0, description="Seconds a webhook receiver has to answer."
    )
    webhook_dispatch: bool = Field(
        default=True,
        description="Run the outgoing webhook dispatcher inside `pairreg serve` "
        "(`pairreg webhooks dispatch` runs it on its own).",
    )
    mlflow_webhook_secret: str | None = Field(
        default=None,
        description="Shared secret of the MLflow registry webhook that calls "
        "POST /v1/mlflow/webhook; unset, the route refuses every delivery.",
    )
    mlflow_webhook_tolerance: float = Field(
        default=300.0,
        gt=0,
        description="Seconds an MLflow delivery's timestamp may differ from this clock.",
    )

    @property
    def home_dir(self) -> Path:
        return self.home.expanduser()

    @property
    def artifact_root_dirs(self) -> tuple[Path, ...]:
        """The configured artifact roots (operator configuration, so ``~`` is expanded)."""
        if not self.artifact_roots:
            return (self.home_dir / "models",)
        parts = [p for p in self.artifact_roots.split(os.pathsep) if p.strip()]
        return tuple(Path(p.strip()).expanduser() for p in parts)

    @property
    def db_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.home_dir / 'registry.db'}"

    @property
    def cache_dir(self) -> Path:
        return self.home_dir / "cache"

    @property
    def credentials_path(self) -> Path:
        return self.home_dir / "credentials"

    @property
    def signing_key_path(self) -> Path:
        return self.home_dir / "audit-signing.key"

    @property
    def public_key_path(self) -> Path:
        return self.home_dir / "audit-signing.pub"


@lru_cache
def get_settings() -> Settings:
    return Settings()


def reset_settings() -> None:
    """Forget cached settings (tests change the environment between cases)."""
    get_settings.cache_clear()
