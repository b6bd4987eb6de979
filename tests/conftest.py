"""Settings of every test session: one offline data cache, two threads, the device of REPRO_TEST_DEVICE, and bf16
autocast through float32 products on CPUs without bf16 kernels (as the `repro` command)."""

import os
from pathlib import Path

import pytest
import torch

# One data cache for the whole session: the embedded corpora build once (seconds), nothing is downloaded.
_CACHE = Path(os.environ.get("REPRO_TEST_DATA",
                            Path(__file__).resolve().parent.parent / ".pytest_cache" / "repro-data"))
os.environ["REPRO_DATA"] = str(_CACHE)
os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{_CACHE / 'mlflow-tests.db'}")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
# REPRO_TEST_DEVICE=cuda runs the tests on a GPU (what is meant for it: the parity suite, `tests/parity`): tensors
# are made there unless a test says otherwise, fixtures load there, and float32 products stay float32 (no TF32)
if os.environ.get("REPRO_TEST_DEVICE"):
    torch.set_default_device(os.environ["REPRO_TEST_DEVICE"])
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

# as the `repro` command does: bf16 autocast through float32 products where the CPU has no bf16 kernels (AVX2 only)
from repro.precision import emulate_bf16_matmul  # noqa: E402

emulate_bf16_matmul()

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



# The slow tier's two longest tests each at the head of one worker's queue: pytest-xdist's work stealing hands the
# first worker the first half of the collection and the second worker the rest, and an idle worker takes the tail
# of the other's queue, so both start at once and the short tests balance around them (at their place in the
# collection, the longest had run alone at the end).
LONGEST = ("test_rehearsal_ddp_fits_and_each_papers_largest_model", "test_rehearsal_ci_subset")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    longest = [next((it for it in items if it.originalname == name), None) for name in LONGEST]
    if None in longest:
        return
    rest = [it for it in items if it not in longest]
    half = len(items) // 2
    items[:] = [longest[0], *rest[: half - 1], longest[1], *rest[half - 1 :]]
