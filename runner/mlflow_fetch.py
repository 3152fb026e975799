"""Fetching an MLflow model version's files for registration (the registry never imports
mlflow; the API edge calls this between checking a webhook and registering its version).

The files come from MLflow's artifact store through the tracking server
(``models:/<name>/<version>``), into a directory of their own; pairreg then hashes them
like any local directory, so what is registered is the bytes fetched, by content digest.
A version logged with a flavour keeps the Hugging Face files one level down (the
transformers flavour writes them under ``model/``): a single subdirectory holding
``config.json`` is taken as the model's directory when the top level has none.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path


class MlflowFetchError(Exception):
    """The tracking server or its artifact store could not give the version's files."""


@dataclass(frozen=True)
class FetchedFiles:
    directory: Path
    source: str
    run_id: str | None


def _model_dir(root: Path) -> Path:
    if (root / "config.json").is_file():
        return root
    subs = [p for p in root.iterdir() if p.is_dir() and (p / "config.json").is_file()]
    return subs[0] if len(subs) == 1 else root


def fetch_model_version(tracking_uri: str, name: str, version: str, dest: Path) -> FetchedFiles:
    """Download ``models:/name/version`` into ``dest`` (replaced whole, never half-written:
    the files land in a sibling temporary directory that is renamed into place)."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    try:
        mv = client.get_model_version(name, version)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".incoming-", dir=dest.parent))
        try:
            # The version's own artifact location, resolved by this registry (a bare
            # models:/ URI would be resolved against the process's default registry).
            mlflow.artifacts.download_artifacts(
                artifact_uri=client.get_model_version_download_uri(name, version),
                dst_path=str(tmp),
                tracking_uri=tracking_uri,
            )
            if dest.exists():
                shutil.rmtree(dest)
            tmp.rename(dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    except (MlflowException, OSError) as exc:
        raise MlflowFetchError(f"models:/{name}/{version}: {exc}") from exc
    return FetchedFiles(_model_dir(dest), str(mv.source), mv.run_id)
