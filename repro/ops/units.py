"""Sizes in words: bytes as the commands and the READMEs print them (`gb`). A leaf module that imports nothing, so
that the command layer (`repro.cli.disk`'s refusals) and the library (`repro.ops.docs`' README blocks) share one
formatter.

Follows the decimal units of `df -H` and of disk vendors (1 GB = 10⁹ bytes), not the binary MiB and GiB in which
the records state memory (`repro.ops.rss`).
"""

from __future__ import annotations


def gb(n_bytes: float, digits: int = 1) -> str:
    """`n_bytes` in gigabytes with `digits` decimals: `gb(36.8e9)` is "36.8 GB", `gb(36.8e9, digits=0)` "37 GB"."""
    return f"{n_bytes / 1e9:.{digits}f} GB"
