"""Parity fixtures: the one file format and the helpers shared by every `make_<paper>.py` and `test_<paper>_parity.py`.

A fixture is one `.pt` file per case under `tests/parity/<paper>/`, written by `make_<paper>.py CHECKOUT` from a
checkout of the authors' repository (their code is imported from that path at run time, with run-time shims only;
none of it is copied here). It holds plain tensors and a `meta` dict of strings and numbers:

    {"tensors": {name: Tensor}, "meta": {"repo": "owner/name", "commit": "<40 hex>", "case": str, ...}}

and loads with `torch.load(weights_only=True)`. On disk it is torch's legacy (non-zip) serialization, gzipped: the
zip format spends about a kilobyte per tensor on its archive, which doubled the fixtures' size (739 KB against 360).
Tensor names are the authors' (their state-dict keys, prefixed `weight.`) plus the inputs and outputs (`input.*`,
`output.*`); each parity test maps them onto our modules through an explicit name map, so that a renamed or missing
parameter fails loudly.
"""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
TOLERANCE = 1e-4  # fp32 agreement asked of every parity test unless its test says why not


def checkout_commit(checkout: Path) -> str:
    """The commit of an authors' checkout: `git rev-parse HEAD`, else a `COMMIT` file (an exported tree)."""
    checkout = Path(checkout)
    try:
        out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True)
        return out.stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        pass
    marker = checkout / "COMMIT"
    if marker.is_file():
        return marker.read_text().strip()
    raise SystemExit(f"{checkout}: no git history and no COMMIT file; clone the authors' repository there "
                     f"(or write its commit hash into {marker})")


def save_fixture(path: Path, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """Write one fixture atomically (a temporary file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"tensors": {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}, "meta": dict(meta)}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    buffer = io.BytesIO()
    torch.save(payload, buffer, _use_new_zipfile_serialization=False)
    try:
        # mtime=0: the same tensors give the same bytes, so a regenerated fixture shows no spurious diff
        Path(tmp).write_bytes(gzip.compress(buffer.getvalue(), compresslevel=9, mtime=0))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_fixture(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    data = Path(path).read_bytes()
    if data[:2] == b"\x1f\x8b":  # gzip (save_fixture); a plain torch file also loads
        data = gzip.decompress(data)
    # on the test device (tests/conftest.py: REPRO_TEST_DEVICE, e.g. cuda; the CPU by default)
    payload = torch.load(io.BytesIO(data), map_location=os.environ.get("REPRO_TEST_DEVICE", "cpu"), weights_only=True)
    return payload["tensors"], payload["meta"]


@contextmanager
def on_path(directory: Path):
    """Import the authors' modules from `directory` for the duration of the block (and forget them after)."""
    directory = str(Path(directory).resolve())
    before = set(sys.modules)
    sys.path.insert(0, directory)
    try:
        yield
    finally:
        sys.path.remove(directory)
        for name in set(sys.modules) - before:
            module = sys.modules.get(name)
            origin = getattr(module, "__file__", None) or ""
            if origin.startswith(directory):
                del sys.modules[name]


def enlarge_(module: torch.nn.Module, *, std: float = 0.2, seed: int = 0) -> None:
    """Re-draw every parameter so that each mechanism matters: matrices and biases N(0, std), LayerNorm gains
    1 + N(0, std).

    Default initialisations (N(0, 0.02), zero biases) leave memories and biases too small to move a loss beyond
    the tolerance; with these a broken mechanism changes the outputs by far more than `TOLERANCE`.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64, device="cpu")  # the same on any device
            noise = noise.to(p.device, p.dtype) * std
            if isinstance(p, torch.nn.Parameter) and ("layer_norm" in name or ".ln" in name or "norm" in name) \
                    and name.endswith("weight"):
                p.copy_(1.0 + noise)
            else:
                p.copy_(noise)


def parsed_config(*configs: str) -> dict:
    """The parse of `repro fit -c CONFIG [-c EVAL]` (paths from the repository root; no class instantiated), as a flat
    dict of dotted keys without `init_args` (`model.n_layer`, `model.optim.lr`, `data.batch_size`, `trainer.max_steps`):
    what a run of these configs is given, dataclass defaults filled in."""
    from repro.cli.lightning_cli import ReproCLI

    class ParseOnly(ReproCLI):
        def instantiate_classes(self) -> None:
            self.model = self.datamodule = self.trainer = None

    args = [a for c in configs for a in ("-c", str(HERE.parent.parent / c))] + ["--run.tracking", "none"]
    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        cfg = ParseOnly(args=args, run=False).config.as_dict()
    finally:
        sys.argv = argv

    flat = {}

    def walk(prefix, node):
        if isinstance(node, dict) and not (prefix.endswith("callbacks")):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            flat[prefix] = node

    walk("", cfg)
    return {k.replace(".init_args.", ".").replace("model.model.", "model."): v for k, v in flat.items()}
