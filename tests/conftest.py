import os
from pathlib import Path

import pytest
import torch

# One data cache for the whole session: the embedded corpora build once (seconds), nothing is downloaded.
_CACHE = Path(os.environ.get("REPRO_TEST_DATA", Path(__file__).resolve().parent.parent / ".pytest_cache" / "repro-data"))
os.environ["REPRO_DATA"] = str(_CACHE)
os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{_CACHE / 'mlflow-tests.db'}")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def params_specs(section) -> list[str]:
    """Every `repro runs` spec of a params.yaml section (nested dicts of space-separated spec strings)."""
    if isinstance(section, str):
        return section.split()
    if isinstance(section, dict):
        return [s for v in section.values() for s in params_specs(v)]
    return []
