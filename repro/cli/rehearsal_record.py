"""The record of the last full rehearsal, kept like a DVC stage's (issue 38: nothing showed that the rehearsal was
stale after a change to the paper path, and ten regressions landed unseen): `results/rehearsal/summary.json`,
written by `repro rehearse` of every stage (with its DDP fits), committed, and checked by
tests/test_rehearsal_record.py against the files it ran.

Follows DVC's lock file: the hashes of a stage's dependencies beside its outputs, content hashes (sha256), not
modification times. Differs in what it hashes: not a stage's own deps but the whole paper path (`fingerprint`):

- `code`: every file under `repro/` and `papers/` except their Markdown documents (`*.md`);
- `configs`: the paper profile's configs (`configs/<paper>/paper/`) and the rehearsal's (`configs/rehearsal/`);
- `pipeline`: `dvc.yaml`, `params.paper.yaml`, `params.rehearsal.yaml`.

Left out: tests, the READMEs and docs, the small and tiny profiles' configs, `pyproject.toml` (its test settings
change more often than the entry points it also holds). The files are those git sees (tracked, and untracked but
not ignored), as `repro rehearse` copies them into its workspace.

The summary holds each step's seconds, exit code, peak RSS (MiB, `repro.ops.rss`) and the scratch folder's peak
disk during it, the failures, the disk estimate that `repro rehearse` checked before it began, the machine, and
the fingerprint. The README states the disk need from it (the generated block `rehearsal-disk`,
`repro.ops.docs.rehearsal_disk_block`).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from repro.tracking import SPEED_FLAGS, cpu_flags

SUMMARY = Path("results") / "rehearsal" / "summary.json"
PARTS = ("code", "configs", "pipeline")
PIPELINE_FILES = ("dvc.yaml", "params.paper.yaml", "params.rehearsal.yaml")
# every stage at most this much resident memory (two thirds of the 24 GiB machine it ran on; issue 38)
STAGE_PEAK_LIMIT_MB = 16 * 1024


def part_of(rel: str) -> str | None:
    """The fingerprint's part that holds the file `rel` (a path relative to the repository), or None."""
    parts = rel.split("/")
    if parts[0] in ("repro", "papers") and not rel.endswith(".md"):
        return "code"
    if parts[0] == "configs" and len(parts) > 2 and (parts[1] == "rehearsal" or parts[2] == "paper"):
        return "configs"
    if rel in PIPELINE_FILES:
        return "pipeline"
    return None


def _git_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z"], check=True,
                         capture_output=True).stdout.decode()
    return sorted(f for f in out.split("\0") if f)


def fingerprint(root: Path, files: list[str] | None = None) -> dict:
    """The sha256 of every file of the paper path (`part_of`), of each part (over its files' paths and digests, in
    path order) and of the whole."""
    files = _git_files(root) if files is None else sorted(files)
    digests = {rel: hashlib.sha256((root / rel).read_bytes()).hexdigest() for rel in files
               if part_of(rel) is not None and (root / rel).is_file()}
    hashes = {p: hashlib.sha256() for p in PARTS}
    for rel, digest in digests.items():
        hashes[part_of(rel)].update(f"{rel}\0{digest}\n".encode())
    parts = {p: h.hexdigest() for p, h in hashes.items()}
    whole = hashlib.sha256("".join(f"{p}\0{parts[p]}\n" for p in PARTS).encode()).hexdigest()
    return {"sha256": whole, "parts": parts, "files": digests}


def changed_files(recorded: dict, now: dict) -> list[str]:
    """The files of the paper path added, removed or changed since `recorded` (both `fingerprint`s)."""
    a, b = recorded.get("files", {}), now["files"]
    return sorted(f for f in set(a) | set(b) if a.get(f) != b.get(f))


def machine() -> str:
    """The CPU's model, the instruction sets of `repro.tracking.SPEED_FLAGS` it has, its cores and the memory, e.g.
    "Intel(R) Xeon(R) Platinum 8488C (avx2, avx512f, avx512_bf16, amx_tile, amx_bf16), 2 cores, 24 GiB memory";
    without importing torch (the rehearsal's parent stays without)."""
    name, flags = cpu_flags()
    has = [f for f in SPEED_FLAGS if f in flags]
    isa = f" ({', '.join(has)})" if has else ""
    try:
        memory = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB memory"
    except (ValueError, OSError, AttributeError):
        memory = ""
    return f"{name or 'unknown CPU'}{isa}, {os.cpu_count()} cores{memory}"
