"""`build_mirror(root)`: every source of the paper profile written into a mirror folder (`repro.ops.mirror`), each
family by its own builder (`corpora`, `lra`, `hub`), then `files/SHA256SUMS` and the manifest, last.

A finished mirror with the same settings (format, GPT-2 size, seed) is reused; anything else is rebuilt from
scratch, so a build interrupted half-way never passes for a finished one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from repro.ops.mirror.corpora import (
    build_cmu_dog,
    build_hutter,
    build_lm1b,
    build_ptb,
    build_wikitext,
)
from repro.ops.mirror.hub import GPT2_SHAPES, build_gpt2, build_pg19
from repro.ops.mirror.layout import MANIFEST, sha256_of
from repro.ops.mirror.lra import build_lra
from repro.ops.mirror.text import Words

FORMAT_VERSION = 2  # 2: the real vocabulary sizes (REAL_VOCAB)


def build_mirror(root: str | os.PathLike, *, gpt2_size: str = "paper", seed: int = 0,
                 force: bool = False) -> Path:
    """Write every source into `root` (see `repro.ops.mirror`) and return it; a finished mirror with the same
    settings is reused."""
    root = Path(root)
    settings = {"format": FORMAT_VERSION, "gpt2_size": gpt2_size, "seed": seed}
    if gpt2_size not in GPT2_SHAPES:
        raise ValueError(f"gpt2_size is one of {sorted(GPT2_SHAPES)}, got {gpt2_size!r}")
    stamp = root / MANIFEST
    if not force and stamp.exists() and json.loads(stamp.read_text()).get("settings") == settings:
        return root
    stamp.unlink(missing_ok=True)
    shutil.rmtree(root / "files", ignore_errors=True)
    shutil.rmtree(root / "hub", ignore_errors=True)
    words = Words(seed)
    info: dict = {}
    build_wikitext(root, words, {"train": 60, "valid": 6, "test": 6}, info)
    build_hutter(root, words, info)
    build_lm1b(root, words, info)
    build_ptb(root, words, info)
    build_cmu_dog(root, words, info)
    build_lra(root, words, info)
    build_pg19(root, words, info)
    texts = [" ".join(words.sentence()) + "\n" for _ in range(3000)]
    build_gpt2(root, texts, gpt2_size, info)
    files = sorted(p for p in (root / "files").rglob("*") if p.is_file() and p.name != "SHA256SUMS")
    (root / "files" / "SHA256SUMS").write_text(
        "".join(f"{sha256_of(p)}  {p.relative_to(root / 'files').as_posix()}\n" for p in files))
    stamp.write_text(json.dumps({"settings": settings, "sources": info}, indent=1))
    return root
