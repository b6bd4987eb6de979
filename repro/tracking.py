"""Where MLflow runs go: `$MLFLOW_TRACKING_URI`, or the sqlite database `mlflow.db` at the repository root."""

from __future__ import annotations

import os
from pathlib import Path


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path('mlflow.db').resolve()}"
