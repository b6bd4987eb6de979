"""Where MLflow runs go: `$MLFLOW_TRACKING_URI`, or the sqlite database `mlflow.db` at the repository root."""

from __future__ import annotations

import os
from pathlib import Path


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path('mlflow.db').resolve()}"


def experiment_id(name: str, client=None) -> str:
    """The id of the MLflow experiment `name`, created if missing (and the database with it)."""
    from mlflow.tracking import MlflowClient

    client = client or MlflowClient(tracking_uri())
    exp = client.get_experiment_by_name(name)
    return exp.experiment_id if exp is not None else client.create_experiment(name)
