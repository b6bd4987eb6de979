"""Downloads that resume, verify and fail with instructions; single members out of zip archives.

`download` fetches a URL (or the first of several mirrors that answers) into `<dest>.part`, resuming an
interrupted transfer with an HTTP `Range: bytes=N-` request (RFC 9110 §14: a server that honours it answers
206 Partial Content with a `Content-Range`, one that does not answers 200 with the whole file), checks the
size and the published checksums, and only then renames the file onto `dest` (`os.replace`, atomic on POSIX), so
`dest` is either absent or complete.

Checksums: where the source or a maintained library publishes one for the file, the caller pins it (`sha256=`,
and `md5=` / `sha1=` where only those are published, as torchvision's and gluon-nlp's dataset modules do); every
one given is verified, and a file that does not match is refused. With `record_sha256=True` our own sha256 of the
verified file is also written to a sidecar `<dest>.sha256` (the `sha256sum` format, so
`sha256sum -c <dest>.sha256` works too), which later steps use as the file's identity. When nothing is published
for a file (trust on first use), the sidecar holds the checksum computed at the first download and every later use
is verified against it: that detects a file damaged after it was fetched, not one that was wrong upstream.
docs/data.md lists which files have a published checksum and which do not.

When the network is unreachable the error says which URLs were tried, why each failed, and where to put the
file by hand; a file placed there is used without any network access.

A rehearsal mirror (`repro.ops.mirror`, environment variable `REPRO_MIRROR`) changes only the base of every URL
and the checksum verified: the mirror's published `SHA256SUMS` instead of the real checksums and size (its files
are miniatures).

Standard library only (urllib.request, hashlib, zipfile).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from repro.io import atomic_path, atomic_write_text, file_lock

CHUNK = 1 << 20
PROGRESS_EVERY_S = 3.0
USER_AGENT = "repro-memory-transformers/0.1 (python-urllib)"

# What a failed transfer can raise: HTTPError and URLError (refused, DNS, TLS), socket timeouts and resets
# (OSError), truncated or malformed responses (http.client.HTTPException). Local disk errors are re-raised as
# _LocalWriteError first so that a full disk is not reported as "offline".
_NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, OSError)


class DownloadError(RuntimeError):
    """No URL could be fetched: the machine is offline or every mirror is unreachable."""


class ChecksumError(RuntimeError):
    """A file's checksum (SHA-256, MD5 or SHA-1) differs from the published or recorded one."""


class ArchiveError(RuntimeError):
    """A zip archive is corrupt, or lacks the member asked for."""


class _LocalWriteError(RuntimeError):
    pass


def sha256_file(path: str | os.PathLike) -> str:
    return digests_file(path, ("sha256",))["sha256"]


# The algorithms a published checksum may use, with the length of their hex digest.
ALGORITHMS = {"sha256": 64, "sha1": 40, "md5": 32}


@dataclass(frozen=True)
class Published:
    """A file's checksums as published by its source or a maintained library, and where each was read (`source`:
    repository and path, so that anyone can check the value). `download(..., **p.kwargs())` verifies them all."""

    source: str
    sha256: str | None = None
    md5: str | None = None
    sha1: str | None = None
    size: int | None = None

    def kwargs(self) -> dict:
        return {"sha256": self.sha256, "md5": self.md5, "sha1": self.sha1, "size": self.size}


# For a file with no published checksum: trust on first use (`record_sha256=True` records it).
NOT_PUBLISHED = {"sha256": None}


def published_kwargs(table: dict[str, Published], name: str) -> dict:
    """`download` arguments for `name`: its published checksums, or none (trust on first use) when `table` has none."""
    return table[name].kwargs() if name in table else dict(NOT_PUBLISHED)


def digests_file(path: str | os.PathLike, algorithms) -> dict[str, str]:
    """The hex digests of `path` for each of `algorithms` (names of `ALGORITHMS`), in one pass over the file."""
    hashes = {a: hashlib.new(a) for a in algorithms}
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            for h in hashes.values():
                h.update(block)
    return {a: h.hexdigest() for a, h in hashes.items()}


def sidecar_path(dest: str | os.PathLike) -> Path:
    dest = Path(dest)
    return dest.with_name(dest.name + ".sha256")


def part_path(dest: str | os.PathLike) -> Path:
    dest = Path(dest)
    return dest.with_name(dest.name + ".part")


def read_sidecar(dest: str | os.PathLike) -> str | None:
    """The SHA-256 recorded for `dest`, or None when none was recorded."""
    path = sidecar_path(dest)
    try:
        text = path.read_text(encoding="utf-8").split()
    except FileNotFoundError:
        return None
    if not text or len(text[0]) != 64:
        raise ChecksumError(f"{path} is not a sha256 sidecar (expected '<64 hex digits>  <name>'); delete it "
                            f"and {Path(dest).name} will be verified afresh")
    return text[0].lower()


def _write_sidecar(dest: Path, digest: str) -> None:
    atomic_write_text(sidecar_path(dest), f"{digest}  {dest.name}\n")


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


def download(
    url: str | Sequence[str],
    dest: str | os.PathLike,
    *,
    sha256: str | None,
    md5: str | None = None,
    sha1: str | None = None,
    size: int | None = None,
    timeout: float = 60,
    record_sha256: bool = False,
) -> Path:
    """Fetch `url` (or the first working mirror of a list) to `dest`, verified, and return `dest`.

    Args:
        url: a URL, or mirrors tried in order.
        dest: where the file goes; its folder is created.
        sha256: the published SHA-256, or None when none is published.
        md5: a published MD5, for files whose source or maintained library publishes only that (torchvision's
            CIFAR-10 record, for one). Every checksum given (sha256, md5, sha1) is verified.
        sha1: a published SHA-1 (gluon-nlp's records).
        size: the expected size in bytes, if known.
        timeout: seconds without an answer (connect or read) before a mirror counts as unreachable.
        record_sha256: write our sha256 of the verified file to `<dest>.sha256`. With no published checksum,
            the one recorded at the first download is what every later call verifies against.

    A `dest` already present is verified and returned without any network access. An interrupted transfer
    leaves `<dest>.part`; the next call resumes it.
    """
    urls = [url] if isinstance(url, str) else list(url)
    if not urls:
        raise ValueError("download() needs at least one URL")
    published, origin = _published(sha256=sha256, md5=md5, sha1=sha1), "published"
    if base := os.environ.get(MIRROR_ENV):
        # the mirror's files are miniatures: its SHA256SUMS replace every real checksum, and the real size is moot
        urls, mirror_sha256 = _through_mirror(urls, base, timeout=timeout)
        published, origin, size = {"sha256": mirror_sha256}, "mirror", None
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)

    # two processes that need one file (the workers of `repro runs`) take turns: the second finds it downloaded,
    # instead of both appending to one `.part`
    with file_lock(dest.with_name(dest.name + ".lock")):
        return _download(urls, dest, published=published, published_origin=origin, size=size, timeout=timeout,
                         record=record_sha256)


def _published(**digests: str | None) -> dict[str, str]:
    out = {}
    for algo, value in digests.items():
        if value is None:
            continue
        value = value.strip().lower()
        if len(value) != ALGORITHMS[algo] or any(c not in "0123456789abcdef" for c in value):
            raise ValueError(f"{algo}={value!r} is not a {algo} digest ({ALGORITHMS[algo]} hex digits): copy it "
                             "exactly from where it is published")
        out[algo] = value
    return out


def _download(urls: list[str], dest: Path, *, published: dict[str, str], published_origin: str,
              size: int | None, timeout: float, record: bool) -> Path:
    checks, origin = _expected(dest, published=published, published_origin=published_origin, record=record)

    if dest.exists():
        _verify_existing(dest, checks=checks, origin=origin, size=size, record=record)
        return dest

    part = part_path(dest)
    errors: list[tuple[str, BaseException]] = []
    for u in urls:
        try:
            _fetch(u, part, timeout=timeout, size=size)
        except _LocalWriteError as err:
            raise RuntimeError(f"could not write {part}: {err.__cause__}; free disk space or fix the "
                               "permissions and run again (the partial download is kept and resumes)") from err
        except _NETWORK_ERRORS as err:
            if isinstance(err, urllib.error.HTTPError):
                err.close()  # it holds the error page's socket open
            errors.append((u, err))
            continue
        _finish(u, part, dest, checks=checks, origin=origin, size=size, record=record)
        return dest
    raise DownloadError(_offline_message(dest, errors, checks=checks, origin=origin, record=record))


# A rehearsal mirror (`repro.ops.mirror`): when set, every URL `scheme://host/path` is fetched from
# `<mirror>/host/path` instead, and verified against the checksum the mirror publishes in `<mirror>/SHA256SUMS`
# (its files are miniatures, not the real ones). Unset, nothing changes: the real URLs and the real checksums.
MIRROR_ENV = "REPRO_MIRROR"
_mirror_sums: dict[str, dict[str, str]] = {}


def mirror_path(url: str) -> str:
    """The path of a real URL in a mirror: `host/path`."""
    p = urllib.parse.urlsplit(url)
    return f"{p.netloc}/{p.path.lstrip('/')}"


def _through_mirror(urls: list[str], base: str, *, timeout: float) -> tuple[list[str], str]:
    base = base.rstrip("/") + "/"
    if base not in _mirror_sums:
        try:
            with _open(base + "SHA256SUMS", start=0, timeout=timeout) as resp:
                text = resp.read().decode("utf-8")
        except _NETWORK_ERRORS as err:
            raise DownloadError(f"{MIRROR_ENV}={base} is set but its SHA256SUMS cannot be read ({err}): start the "
                                "mirror (`repro mirror serve DIR`) or unset the variable") from err
        _mirror_sums[base] = {name: digest for digest, name in (line.split(None, 1) for line in text.splitlines()
                                                                 if line.strip())}
    sums = _mirror_sums[base]
    for u in urls:
        if (rel := mirror_path(u)) in sums:
            # the mirror's copy of the first URL it holds; its published checksum replaces the real one
            return [base + rel], sums[rel]
    raise DownloadError(f"the mirror {base} holds none of {', '.join(urls)}: rebuild it (`repro mirror build DIR`)")


def _expected(dest: Path, *, published: dict[str, str], published_origin: str,
              record: bool) -> tuple[dict[str, str], str]:
    """The checksums to verify (algorithm → hex digest) and where they come from: "published" (or "mirror"),
    "recorded" (the sidecar of an earlier download of a file with no published checksum) or "none"."""
    if published:
        return published, published_origin
    if record:
        recorded = read_sidecar(dest)
        if recorded is not None:
            return {"sha256": recorded}, "recorded"
    return {}, "none"


def _mismatch(what: str, *, algo: str, expected: str, actual: str, origin: str) -> str:
    if origin == "recorded":
        return (f"{what} has {algo} {actual}, but {expected} was recorded when it was first downloaded "
                f"(not a published checksum): the file changed since")
    if origin == "mirror":
        return f"{what} has {algo} {actual}, expected {expected} (the mirror's SHA256SUMS)"
    return f"{what} has {algo} {actual}, expected the published {algo} {expected}"


def _first_mismatch(actual: dict[str, str], checks: dict[str, str]) -> tuple[str, str] | None:
    for algo, expected in checks.items():
        if actual[algo] != expected:
            return algo, expected
    return None


def _record(dest: Path, digest: str, *, origin: str, found: bool) -> None:
    """Write our sha256 of the verified `dest` to its sidecar (unless it already holds it)."""
    if origin == "recorded":
        return  # verified against the sidecar itself
    try:
        if read_sidecar(dest) == digest:
            return
    except ChecksumError:
        pass  # a malformed sidecar: replaced below
    _write_sidecar(dest, digest)
    if origin == "none":
        how = "the file as found" if found else "this download"
        _say(f"recorded sha256 {digest} of {dest} in {sidecar_path(dest)} (computed from {how}, not verified "
             "against a published value; later runs verify against it)")


def _verify_existing(dest: Path, *, checks: dict[str, str], origin: str, size: int | None, record: bool) -> None:
    if size is not None and (actual_size := dest.stat().st_size) != size:
        raise ChecksumError(f"{dest} has {actual_size:,} bytes, expected {size:,}; delete it and run again to "
                            "download it afresh")
    wanted = set(checks) | ({"sha256"} if record else set())
    if not wanted:
        return
    actual = digests_file(dest, wanted)
    if bad := _first_mismatch(actual, checks):
        algo, expected = bad
        extra = f" (and its recorded checksum {sidecar_path(dest)})" if origin == "recorded" else ""
        raise ChecksumError(f"{_mismatch(str(dest), algo=algo, expected=expected, actual=actual[algo], origin=origin)}"
                            f". Delete {dest}{extra} and run again to download it afresh.")
    if record:  # placed by hand with nothing to check against yet: remembered from now on
        _record(dest, actual["sha256"], origin=origin, found=True)


def _open(url: str, *, start: int, timeout: float):
    headers = {"User-Agent": USER_AGENT}
    if start:
        headers["Range"] = f"bytes={start}-"
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)


def _range_start(content_range: str | None) -> int | None:
    # "bytes 100-999/1000" → 100
    try:
        unit, spec = content_range.split(" ", 1)
        return int(spec.split("-", 1)[0]) if unit.lower() == "bytes" else None
    except (AttributeError, ValueError):
        return None


def _fetch(url: str, part: Path, *, timeout: float, size: int | None) -> None:
    """Bring `part` up to the complete file from `url`, resuming what it holds."""
    start = part.stat().st_size if part.exists() else 0
    if size is not None and start > size:  # not a prefix of the file we want
        start = 0
    try:
        resp = _open(url, start=start, timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code != 416 or not start:
            raise
        # Range Not Satisfiable: the partial file is no prefix of this one (or already whole, which cannot be
        # told apart without a checksum); start over.
        err.close()
        start = 0
        resp = _open(url, start=0, timeout=timeout)
    status = resp.status or 200  # file:// URLs have no status
    if start and status == 206 and _range_start(resp.headers.get("Content-Range")) != start:
        resp.close()  # a part of the file we did not ask for: take the whole file instead
        start = 0
        resp = _open(url, start=0, timeout=timeout)
    elif start and status != 206:
        start = 0  # the server ignored Range and sends the whole file: restart from zero
    with resp:
        length = resp.headers.get("Content-Length")
        remaining = int(length) if length and length.isdigit() else None
        total = start + remaining if remaining is not None else size
        if start:
            _say(f"resuming {url} at {_human(start)}")
        else:
            _say(f"downloading {url}" + (f" ({_human(total)})" if total else ""))
        try:
            out = open(part, "ab" if start else "wb")
        except OSError as err:
            raise _LocalWriteError(str(err)) from err
        got = start
        shown = time.monotonic()
        tty = sys.stderr.isatty()
        with out:
            while True:
                block = resp.read(CHUNK)
                if not block:
                    break
                try:
                    out.write(block)
                except OSError as err:
                    raise _LocalWriteError(str(err)) from err
                got += len(block)
                if tty and time.monotonic() - shown >= PROGRESS_EVERY_S:
                    shown = time.monotonic()
                    _say(f"  {_human(got)} / {_human(total)}" if total else f"  {_human(got)}")
        # HTTPResponse.read(n) returns b"" when the connection drops early instead of raising: compare with
        # the announced length ourselves.
        if remaining is not None and got - start < remaining:
            raise http.client.IncompleteRead(b"", remaining - (got - start))


def _finish(url: str, part: Path, dest: Path, *, checks: dict[str, str], origin: str, size: int | None,
            record: bool) -> None:
    actual_size = part.stat().st_size
    if size is not None and actual_size != size:
        part.unlink()
        raise ChecksumError(f"{dest.name} downloaded from {url} has {actual_size:,} bytes, expected {size:,}; the "
                            f"download was deleted. Run again to retry, or fetch the file by hand to {dest}.")
    wanted = set(checks) | ({"sha256"} if record else set())
    actual = digests_file(part, wanted) if wanted else {}
    if bad := _first_mismatch(actual, checks):
        algo, expected = bad
        part.unlink()
        hint = (f" If the file was legitimately updated upstream, delete {sidecar_path(dest)} as well."
                if origin == "recorded" else "")
        what = f"{dest.name} downloaded from {url}"
        raise ChecksumError(f"{_mismatch(what, algo=algo, expected=expected, actual=actual[algo], origin=origin)}; "
                            f"the download was deleted. Run again to retry, or fetch the file by hand to {dest}.{hint}")
    os.replace(part, dest)
    if record:
        _record(dest, actual["sha256"], origin=origin, found=False)


def _offline_message(dest: Path, errors: list[tuple[str, BaseException]], *, checks: dict[str, str],
                     origin: str, record: bool) -> str:
    tried = "\n".join(f"  {u}: {type(e).__name__}: {e}" for u, e in errors)
    listed = ", ".join(f"{algo} {v}" for algo, v in checks.items())
    if origin in ("published", "mirror"):
        must = f"It must have {listed}" + (" (the mirror's SHA256SUMS)." if origin == "mirror" else " (published).")
    elif origin == "recorded":
        must = f"It must have {listed} (recorded in {sidecar_path(dest)} at an earlier download)."
    else:
        must = "No published checksum is known for it" + ("; its sha256 is recorded at first use." if record else ".")
    part = part_path(dest)
    kept = (f"\nThe partial download ({part.stat().st_size:,} bytes) is kept in {part}; running again resumes it."
            if part.exists() else "")
    return (f"could not download {dest.name}: this machine seems to be offline, or the URLs are unreachable.\n"
            f"Tried:\n{tried}\n"
            f"To go on without network, fetch the file elsewhere and place it by hand at:\n  {dest.resolve()}\n"
            f"{must}{kept}")


# ---------------------------------------------------------------------------------------------- zip files


def _corrupt(zip_path: Path, err: BaseException) -> ArchiveError:
    return ArchiveError(f"{zip_path} is not a readable zip archive ({type(err).__name__}: {err}); it is probably "
                        f"a truncated or damaged download: delete it (and {sidecar_path(zip_path).name} if "
                        "present) and run again to download it afresh")


def _member_info(zf: zipfile.ZipFile, zip_path: Path, member: str) -> zipfile.ZipInfo:
    try:
        return zf.getinfo(member)
    except KeyError:
        names = zf.namelist()
        shown = ", ".join(names[:20]) + (f", … ({len(names)} in all)" if len(names) > 20 else "")
        raise ArchiveError(f"{zip_path} has no member {member!r}; it has: {shown or '(nothing)'}. "
                           "Is it the right archive?") from None


def extract_member(zip_path: str | os.PathLike, member: str, dest: str | os.PathLike) -> Path:
    """Write one member of `zip_path` to `dest`, atomically (a failed extraction leaves no `dest`)."""
    zip_path, dest = Path(zip_path), Path(dest)
    try:
        with zipfile.ZipFile(zip_path) as zf:
            info = _member_info(zf, zip_path, member)
            with atomic_path(dest) as tmp, zf.open(info) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, CHUNK)  # zipfile checks the CRC-32 at the member's end
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        raise _corrupt(zip_path, err) from err
    return dest


def read_member(zip_path: str | os.PathLike, member: str) -> bytes:
    """The bytes of one member of `zip_path`, with the errors of `extract_member`."""
    zip_path = Path(zip_path)
    try:
        with zipfile.ZipFile(zip_path) as zf:
            return zf.read(_member_info(zf, zip_path, member))
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        raise _corrupt(zip_path, err) from err
