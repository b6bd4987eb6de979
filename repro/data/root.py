"""Where the data lives: `data/` in the working directory, or `$REPRO_DATA`, or a data module's `data_dir`.

A leaf of the data layer (it imports nothing of repro), so that every builder of data (corpora, tokenizers, text
streams, dialogue sets, Long Range Arena) can ask for it without importing the corpora module, which imports
them in turn.
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir(override: str | os.PathLike | None = None) -> Path:
    return Path(override or os.environ.get("REPRO_DATA") or "data")
