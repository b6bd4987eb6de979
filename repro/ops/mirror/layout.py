"""Where a mirror (`repro.ops.mirror`) keeps what it serves, and the writers of its formats: plain files under
`files/<host>/<path>` (a source URL's host and path), written as zip or gzipped tar archives with fixed dates so that
a build is byte-for-byte repeatable; Hub repositories under `hub/` in the Hugging Face cache layout
(`<kind>s--<org>--<name>/refs/main` + `snapshots/<rev>/…`); `manifest.json` last, the mark of a finished build.

The server (`repro.ops.mirror.server`) reads this layout; the builders of each source family write it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import shutil
import tarfile
import urllib.parse
import zipfile
from pathlib import Path

MANIFEST = "manifest.json"


def write_zip(path: Path, members: dict[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=(2016, 9, 26, 0, 0, 0)), data,
                        compress_type=zipfile.ZIP_DEFLATED)


def write_tar_gz(path: Path, members: dict[str, bytes], *, dirs: bool = True) -> None:
    """A gzipped tar with the members (and their folders first, as `tar czf` of a tree writes them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
        written: set[str] = set()
        for name, data in members.items():
            if dirs:
                parts = name.split("/")[:-1]
                for i in range(1, len(parts) + 1):
                    d = "/".join(parts[:i])
                    if d not in written and d not in (".", ""):
                        written.add(d)
                        info = tarfile.TarInfo(d)
                        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 1_300_000_000
                        tar.addfile(info)
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 1_300_000_000
            tar.addfile(info, io.BytesIO(data))


def file_of(root: Path, url: str) -> Path:
    """Where the mirror keeps the file of a real URL: files/<host>/<path>."""
    p = urllib.parse.urlsplit(url)
    return root / "files" / p.netloc / p.path.lstrip("/")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def hub_repo(root: Path, kind: str, repo: str, files: dict[str, Path | bytes]) -> str:
    """A repository in the Hugging Face cache layout: `<kind>s--<org>--<name>/snapshots/<rev>/…` + `refs/main`."""
    folder = root / "hub" / f"{kind}s--{repo.replace('/', '--')}"
    h = hashlib.sha1()
    blobs = {}
    for name in sorted(files):
        data = files[name] if isinstance(files[name], bytes) else Path(files[name]).read_bytes()
        blobs[name] = data
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    rev = h.hexdigest()
    shutil.rmtree(folder, ignore_errors=True)
    for name, data in blobs.items():
        path = folder / "snapshots" / rev / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(rev)
    return rev
