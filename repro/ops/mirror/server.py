"""The loopback server of a built mirror (`repro.ops.mirror`), and the settings that point every download at it.

`serve(root)` serves the mirror on 127.0.0.1 (an ephemeral port): plain files under `/<host>/<path>` with HTTP
Range (our downloads resume through it), and the part of the Hub's HTTP API that `huggingface_hub`, `transformers`
and `datasets` use: `resolve`, `api/<kind>/<repo>[/revision|tree|paths-info]`, answered from the `hub/` folder's
cache layout. It stops when its context exits, after `idle_timeout` seconds without a request, or after
`max_seconds`. `environment(url, cache)` gives `REPRO_MIRROR` (read by `repro.data.download.download`) and
`HF_ENDPOINT` (the Hub libraries), with fresh Hub caches, so that the real download code runs end to end.

Not the Hub: no authentication, no uploads, no Xet storage (`HF_HUB_DISABLE_XET`), no pagination of trees; only
what those clients ask for while downloading.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from repro.ops.mirror.layout import MANIFEST, sha256_of


class _Hub:
    """The Hub repositories of a mirror, read from its `hub/` folder (Hugging Face cache layout)."""

    def __init__(self, root: Path):
        self.root = root / "hub"

    def snapshot(self, kind: str, repo: str, rev: str) -> tuple[str, Path] | None:
        folder = self.root / f"{kind}s--{repo.replace('/', '--')}"
        rev = urllib.parse.unquote(rev)
        ref = folder / "refs" / rev
        commit = ref.read_text().strip() if ref.is_file() else rev
        snap = folder / "snapshots" / commit
        return (commit, snap) if re.fullmatch(r"[0-9a-f]{40}", commit) and snap.is_dir() else None

    @staticmethod
    def entry(snap: Path, path: Path) -> dict:
        rel = path.relative_to(snap).as_posix()
        if path.is_dir():
            return {"type": "directory", "oid": hashlib.sha1(rel.encode()).hexdigest(), "path": rel}
        sha = sha256_of(path)
        return {"type": "file", "oid": hashlib.sha1(path.read_bytes()).hexdigest(), "size": path.stat().st_size,
                "path": rel, "lfs": {"oid": sha, "size": path.stat().st_size, "pointerSize": 130}}


def _handler(root: Path, touch):
    hub = _Hub(root)
    files_root = (root / "files").resolve()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "repro-mirror/1"

        def log_message(self, fmt, *args):  # quiet; REPRO_MIRROR_LOG=1 shows every request
            if os.environ.get("REPRO_MIRROR_LOG"):
                sys.stderr.write("mirror: " + fmt % args + "\n")

        def _send(self, code: int, body: bytes = b"", headers: dict | None = None, *, head: bool = False):
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _json(self, obj, *, head=False):
            self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json"}, head=head)

        def _not_found(self, what: str, *, head=False, hub: bool = False):
            headers = {"Content-Type": "text/plain"}
            if hub:  # huggingface_hub tells a missing file from a missing repository by this header
                headers["X-Error-Code"] = "EntryNotFound"
            self._send(404, f"not in the mirror: {what}\n".encode(), headers, head=head)

        def _file(self, path: Path, extra: dict, *, head: bool):
            size = path.stat().st_size
            start, end, code = 0, size - 1, 200
            rng = self.headers.get("Range")
            headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream", **extra}
            if rng:
                m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
                if not m or (not m[1] and not m[2]):
                    return self._send(416, b"", {"Content-Range": f"bytes */{size}"}, head=head)
                if m[1]:
                    start, end = int(m[1]), min(int(m[2]) if m[2] else size - 1, size - 1)
                else:
                    start, end = max(0, size - int(m[2])), size - 1
                if start >= size or start > end:
                    return self._send(416, b"", {"Content-Range": f"bytes */{size}"}, head=head)
                code = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", str(end - start + 1))
            self.end_headers()
            if head:
                return
            with open(path, "rb") as f:
                f.seek(start)
                left = end - start + 1
                while left > 0:
                    block = f.read(min(1 << 20, left))
                    if not block:
                        break
                    self.wfile.write(block)
                    left -= len(block)

        def _route(self, *, head: bool):
            touch()
            url = urllib.parse.urlsplit(self.path)
            path = urllib.parse.unquote(url.path)
            # plain files: /<host>/<path>
            local = (files_root / path.lstrip("/")).resolve()
            if local.is_file() and local.is_relative_to(files_root):
                return self._file(local, {}, head=head)
            # the Hub: /api/{models,datasets}/<repo>[/revision/<rev> | /tree/<rev>[/<path>]]
            m = re.fullmatch(r"/api/(models|datasets)/(.+?)(?:/(revision|tree)/([^/]+)(/.*)?)?/?", path)
            if m and m[2].count("/") <= 1:
                kind = m[1][:-1]
                found = hub.snapshot(kind, m[2], m[4] or "main")
                if found is None:
                    return self._send(404, b'{"error": "Repository not found"}',
                                      {"Content-Type": "application/json", "X-Error-Code": "RepoNotFound"}, head=head)
                commit, snap = found
                if m[3] == "tree":
                    base = snap / (m[5] or "/").lstrip("/")
                    if not base.is_dir():
                        return self._not_found(path, head=head, hub=True)
                    recursive = urllib.parse.parse_qs(url.query).get("recursive", ["false"])[0] in ("true", "1", "True")
                    items = sorted(base.rglob("*") if recursive else base.iterdir())
                    return self._json([hub.entry(snap, p) for p in items], head=head)
                siblings = [{"rfilename": p.relative_to(snap).as_posix()} for p in sorted(snap.rglob("*"))
                            if p.is_file()]
                return self._json({"id": m[2], "modelId": m[2], "sha": commit, "private": False, "disabled": False,
                                   "gated": False, "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
                                   "lastModified": "2024-01-01T00:00:00.000Z", "cardData": {}}, head=head)
            # /[datasets/]<repo>/resolve/<rev>/<file>
            m = re.fullmatch(r"/(datasets/)?(.+?)/resolve/([^/]+)/(.+)", path)
            if m:
                kind = "dataset" if m[1] else "model"
                found = hub.snapshot(kind, m[2], m[3])
                if found is None:
                    return self._send(404, b"Repository not found", {"X-Error-Code": "RepoNotFound"}, head=head)
                commit, snap = found
                target = (snap / m[4]).resolve()
                if not target.is_file() or not target.is_relative_to(snap.resolve()):
                    return self._send(404, b"Entry not found", {"X-Error-Code": "EntryNotFound",
                                                                "X-Repo-Commit": commit}, head=head)
                return self._file(target, {"X-Repo-Commit": commit, "ETag": f'"{sha256_of(target)}"'}, head=head)
            return self._not_found(path, head=head)

        def do_GET(self):
            self._route(head=False)

        def do_HEAD(self):
            self._route(head=True)

        def do_POST(self):
            touch()
            # /api/{models,datasets}/<repo>/paths-info/<rev>: form field `paths` (repeated)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            m = re.fullmatch(r"/api/(models|datasets)/(.+?)/paths-info/([^/]+)", path)
            if not m:
                return self._not_found(path)
            found = hub.snapshot(m[1][:-1], m[2], m[3])
            if found is None:
                return self._send(404, b"Repository not found", {"X-Error-Code": "RepoNotFound"})
            _, snap = found
            if "json" in (self.headers.get("Content-Type") or ""):
                paths = json.loads(body or "{}").get("paths", [])
            else:
                paths = urllib.parse.parse_qs(body).get("paths", [])
            paths = [paths] if isinstance(paths, str) else paths
            out = [hub.entry(snap, snap / p) for p in paths if (snap / p).exists()]
            self._json(out)

    return Handler


class MirrorServer:
    """The loopback server of a mirror folder (see `serve`)."""

    def __init__(self, root: Path, *, idle_timeout: float, max_seconds: float, port: int = 0):
        self.root, self.idle_timeout, self.max_seconds = root, idle_timeout, max_seconds
        self._last = time.monotonic()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(root, self._touch))
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/"
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        daemon=True, name="repro-mirror")
        self._watch = threading.Thread(target=self._watchdog, daemon=True, name="repro-mirror-watchdog")

    def _touch(self) -> None:
        self._last = time.monotonic()

    def _watchdog(self) -> None:
        start = time.monotonic()
        while not self._stopped.wait(0.5):
            now = time.monotonic()
            if now - self._last > self.idle_timeout or now - start > self.max_seconds:
                self.stop()

    def start(self) -> MirrorServer:
        self._thread.start()
        self._watch.start()
        return self

    def stop(self) -> None:
        if not self._stopped.is_set():
            self._stopped.set()
            self._httpd.shutdown()
            self._httpd.server_close()

    @property
    def running(self) -> bool:
        return not self._stopped.is_set()

    def wait(self) -> None:
        self._stopped.wait()


@contextlib.contextmanager
def serve(root: str | os.PathLike, *, idle_timeout: float = 600, max_seconds: float = 6 * 3600,
          port: int = 0) -> Iterator[MirrorServer]:
    """Serve a built mirror on 127.0.0.1 until the block exits (or `idle_timeout` s without a request, or
    `max_seconds` in all)."""
    root = Path(root)
    if not (root / MANIFEST).exists():
        raise ValueError(f"{root} is not a built mirror (no {MANIFEST}): run `repro mirror build {root}` first")
    server = MirrorServer(root, idle_timeout=idle_timeout, max_seconds=max_seconds, port=port).start()
    try:
        yield server
    finally:
        server.stop()


def environment(url: str, cache: str | os.PathLike) -> dict[str, str]:
    """The variables that point every download at the mirror `url`: our downloads (`REPRO_MIRROR`), the Hub
    libraries (`HF_ENDPOINT`, with their caches under `cache` so that nothing real is reused or overwritten)."""
    cache = Path(cache)
    return {"REPRO_MIRROR": url, "HF_ENDPOINT": url.rstrip("/"), "HF_HOME": str(cache / "hf"),
            "HF_HUB_CACHE": str(cache / "hf" / "hub"), "HF_DATASETS_CACHE": str(cache / "hf" / "datasets"),
            "HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_UPDATE_DOWNLOAD_COUNTS": "0", "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
            "HF_TOKEN": ""}
