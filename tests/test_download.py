"""The downloader and the corpus sources against local HTTP servers: resume, mirrors, offline, checksums, zips.

Everything is offline: small archives in the real layouts (WikiText-103 v1, enwik8, text8) are built in
tmp_path and served by `http.server.ThreadingHTTPServer` on 127.0.0.1, with a handler that honours (or
ignores) `Range` requests and can drop the connection part-way to simulate an interrupted download.
"""

from __future__ import annotations

import hashlib
import io
import socket
import sys
import threading
import types
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from repro.data import sources
from repro.data.download import (
    ArchiveError,
    ChecksumError,
    DownloadError,
    download,
    extract_member,
    part_path,
    sha256_file,
    sidecar_path,
)

WIKI = {
    "train": " \n = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 : <unk> Chronicles is a tactical role @-@ "
             "playing video game . \n \n = = Gameplay = = \n \n The game 's battle system is 1 @,@ 000 times "
             "faster . \n",
    "valid": " \n = Homarus gammarus = \n \n Homarus gammarus , known as the European lobster , is a species of "
             "clawed lobster @-@ like crustacean . \n",
    "test": " \n = Robert <unk> = \n \n Robert <unk> is an English film , television and theatre actor . \n",
}


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


ENWIK8 = (b'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.3/">\n  <page>\n    <title>AaA</title>\n'
          b"    <text>'''Anarchism''' originated as a term of abuse [[1642]] &amp; \xc3\xa9t\xc3\xa9</text>\n"
          b"  </page>\n") * 40
TEXT8 = b" anarchism originated as a term of abuse first used against early working class radicals" * 50
ARCHIVES = {
    "wikitext-103-v1.zip": _zip({"wikitext-103/": b"", **{f"wikitext-103/wiki.{s}.tokens": t.encode()
                                                           for s, t in WIKI.items()}}),
    "enwik8.zip": _zip({"enwik8": ENWIK8}),
    "text8.zip": _zip({"text8": TEXT8}),
    "blob.bin": bytes(range(256)) * 64,  # 16 KiB, several reads long
}


class Server:
    """A local HTTP server over `files`; records each request's path and Range header."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.honour_range = True
        self.drop_after: int | None = None  # bytes of body sent before the connection is cut
        self.requests: list[tuple[str, str | None]] = []
        self.statuses: list[int] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output clean
                pass

            def do_GET(self):
                name = self.path.lstrip("/")
                rng = self.headers.get("Range")
                server.requests.append((name, rng))
                if name not in server.files:
                    server.statuses.append(404)
                    self.send_error(404)
                    return
                data = server.files[name]
                start = 0
                if rng and server.honour_range:
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    if start >= len(data):
                        server.statuses.append(416)
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                    server.statuses.append(206)
                else:
                    self.send_response(200)
                    server.statuses.append(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if server.drop_after is not None:
                    self.wfile.write(body[: server.drop_after])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = False  # server_close() then joins the request threads
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def server():
    srv = Server(dict(ARCHIVES))
    yield srv
    srv.close()
    assert not srv.thread.is_alive()


@pytest.fixture
def refused_url() -> str:
    """A URL on a port nothing listens on: bound, then released, so connecting is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/file.zip"


BLOB = ARCHIVES["blob.bin"]


# ---------------------------------------------------------------------------------------------- download


def test_download_verifies_sha256_and_is_cached(server, tmp_path):
    dest = tmp_path / "d" / "blob.bin"
    assert download(server.url("blob.bin"), dest, sha256=_sha(BLOB), size=len(BLOB)) == dest
    assert dest.read_bytes() == BLOB
    assert not part_path(dest).exists()
    download(server.url("blob.bin"), dest, sha256=_sha(BLOB))
    assert len(server.requests) == 1  # the second call found the verified file


def test_wrong_sha256_leaves_neither_dest_nor_part(server, tmp_path):
    dest = tmp_path / "blob.bin"
    wrong = "0" * 64
    with pytest.raises(ChecksumError) as err:
        download(server.url("blob.bin"), dest, sha256=wrong)
    assert wrong in str(err.value) and _sha(BLOB) in str(err.value) and server.url("blob.bin") in str(err.value)
    assert not dest.exists() and not part_path(dest).exists()


def test_existing_file_with_wrong_sha256_is_refused(server, tmp_path):
    dest = tmp_path / "blob.bin"
    dest.write_bytes(b"something else")
    with pytest.raises(ChecksumError, match="Delete") as err:
        download(server.url("blob.bin"), dest, sha256=_sha(BLOB))
    assert str(dest) in str(err.value) and _sha(BLOB) in str(err.value)
    assert server.requests == []


def test_interrupted_download_resumes_with_range(server, tmp_path):
    dest = tmp_path / "blob.bin"
    server.drop_after = 5000
    with pytest.raises(DownloadError, match="resumes"):
        download(server.url("blob.bin"), dest, sha256=_sha(BLOB), timeout=5)
    assert part_path(dest).read_bytes() == BLOB[:5000] and not dest.exists()

    server.drop_after = None
    download(server.url("blob.bin"), dest, sha256=_sha(BLOB), timeout=5)
    assert server.requests[-1] == ("blob.bin", "bytes=5000-") and server.statuses[-1] == 206
    assert dest.read_bytes() == BLOB and not part_path(dest).exists()


def test_server_ignoring_range_restarts_from_zero(server, tmp_path):
    dest = tmp_path / "blob.bin"
    part_path(dest).write_bytes(b"stale bytes that must not survive")
    server.honour_range = False
    download(server.url("blob.bin"), dest, sha256=_sha(BLOB))
    assert server.requests == [("blob.bin", "bytes=33-")] and server.statuses == [200]
    assert dest.read_bytes() == BLOB


def test_part_longer_than_the_file_starts_over(server, tmp_path):
    dest = tmp_path / "blob.bin"
    part_path(dest).write_bytes(b"x" * (len(BLOB) + 10))  # the server answers 416
    download(server.url("blob.bin"), dest, sha256=_sha(BLOB))
    assert server.statuses == [416, 200] and dest.read_bytes() == BLOB


def test_mirror_fallback(server, refused_url, tmp_path):
    dest = tmp_path / "blob.bin"
    download([refused_url, server.url("missing.bin"), server.url("blob.bin")], dest, sha256=_sha(BLOB))
    assert dest.read_bytes() == BLOB
    assert [r[0] for r in server.requests] == ["missing.bin", "blob.bin"] and server.statuses == [404, 200]


def test_offline_error_says_where_to_put_the_file(refused_url, tmp_path):
    dest = tmp_path / "raw" / "enwik8.zip"
    other = refused_url.replace("file.zip", "mirror.zip")
    with pytest.raises(DownloadError) as err:
        download([refused_url, other], dest, sha256="ab" * 32)
    msg = str(err.value)
    assert isinstance(err.value, RuntimeError)
    assert refused_url in msg and other in msg and "offline" in msg
    assert str(dest.resolve()) in msg and "place it by hand" in msg and "ab" * 32 in msg
    assert not dest.exists() and not part_path(dest).exists()


def test_timeout_counts_as_unreachable(tmp_path):
    # A listening socket that never accepts: the connection is made, no answer ever comes.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        url = f"http://127.0.0.1:{s.getsockname()[1]}/blob.bin"
        with pytest.raises(DownloadError, match="timed out"):
            download(url, tmp_path / "blob.bin", sha256=None, timeout=0.3)


def test_recorded_sha256_detects_a_file_changed_after_download(server, tmp_path):
    dest = tmp_path / "blob.bin"
    download(server.url("blob.bin"), dest, sha256=None, record_sha256=True)
    assert sidecar_path(dest).read_text() == f"{_sha(BLOB)}  blob.bin\n"
    download(server.url("blob.bin"), dest, sha256=None, record_sha256=True)  # still intact
    data = bytearray(BLOB)
    data[100] ^= 1
    dest.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="recorded when it was first downloaded") as err:
        download(server.url("blob.bin"), dest, sha256=None, record_sha256=True)
    assert _sha(BLOB) in str(err.value) and _sha(bytes(data)) in str(err.value)
    assert len(server.requests) == 1


def test_recorded_sha256_checks_a_redownload(server, tmp_path):
    dest = tmp_path / "blob.bin"
    sidecar_path(dest).write_text(f"{'cd' * 32}  blob.bin\n")
    with pytest.raises(ChecksumError, match="recorded") as err:
        download(server.url("blob.bin"), dest, sha256=None, record_sha256=True)
    assert "cd" * 32 in str(err.value) and not dest.exists() and not part_path(dest).exists()


# ---------------------------------------------------------------------------------------------- zips


def test_extract_member_and_its_errors(tmp_path):
    good = tmp_path / "enwik8.zip"
    good.write_bytes(ARCHIVES["enwik8.zip"])
    out = extract_member(good, "enwik8", tmp_path / "out" / "enwik8")
    assert out.read_bytes() == ENWIK8
    with pytest.raises(ArchiveError, match="no member 'text8'.*it has: enwik8"):
        extract_member(good, "text8", tmp_path / "text8")

    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"<html>403 Forbidden</html>")
    with pytest.raises(ArchiveError, match="delete it"):
        extract_member(bad, "enwik8", tmp_path / "x")
    damaged = bytearray(ARCHIVES["enwik8.zip"])
    damaged[60:80] = bytes(20)  # inside the compressed data: a CRC or inflate error
    bad.write_bytes(bytes(damaged))
    with pytest.raises(ArchiveError, match="delete it"):
        extract_member(bad, "enwik8", tmp_path / "x")
    assert not (tmp_path / "x").exists() and list(tmp_path.glob(".x.*")) == []


# ---------------------------------------------------------------------------------------------- sources


def test_wikitext103_files(server, refused_url, tmp_path):
    raw = tmp_path / "raw" / "wt103"
    files = sources.wikitext103_files(raw, urls=[server.url("wikitext-103-v1.zip")], hf_fallback=False)
    assert set(files) == {"train", "valid", "test"}
    for s, path in files.items():
        assert path == raw / "wikitext-103" / f"wiki.{s}.tokens" and path.read_text(encoding="utf-8") == WIKI[s]
    assert sidecar_path(raw / "wikitext-103-v1.zip").exists()
    mtime = files["train"].stat().st_mtime_ns
    again = sources.wikitext103_files(raw, urls=[refused_url], hf_fallback=False)  # no network, no re-extraction
    assert again == files and files["train"].stat().st_mtime_ns == mtime and len(server.requests) == 1

    files["valid"].write_text("truncated")  # an extracted file that no longer matches is extracted again
    sources.wikitext103_files(raw, urls=[refused_url], hf_fallback=False)
    assert files["valid"].read_text(encoding="utf-8") == WIKI["valid"]


def test_wikitext103_corrupt_archive_is_reported(refused_url, tmp_path):
    raw = tmp_path / "wt103"
    raw.mkdir()
    (raw / "wikitext-103-v1.zip").write_bytes(ARCHIVES["wikitext-103-v1.zip"][:300])  # truncated by hand
    with pytest.raises(ArchiveError, match="delete it"):
        sources.wikitext103_files(raw, urls=[refused_url], hf_fallback=False)
    assert not (raw / "wikitext-103" / "wiki.train.tokens").exists()


def test_wikitext103_hugging_face_fallback(refused_url, tmp_path, monkeypatch):
    rows = {split: [line + "\n" if line.strip() else "" for line in WIKI[s].split("\n")[:-1]]
            for s, split in [("train", "train"), ("valid", "validation"), ("test", "test")]}

    class FakeDataset:
        def __init__(self, texts):
            self.texts = texts

        def iter(self, batch_size):
            for i in range(0, len(self.texts), batch_size):
                yield {"text": self.texts[i : i + batch_size]}

    def load_dataset(path, name, *, split):
        assert (path, name) == ("Salesforce/wikitext", "wikitext-103-v1")
        return FakeDataset(rows[split])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    raw = tmp_path / "wt103"
    files = sources.wikitext103_files(raw, urls=[refused_url])
    for s, path in files.items():  # blank lines lose their single space; the tokens are the same
        assert path.read_text(encoding="utf-8").split("\n") == [ln if ln.strip() else "" for ln in WIKI[s].split("\n")]

    def unreachable(*args, **kwargs):
        raise ConnectionError("no route to the Hub")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=unreachable))
    with pytest.raises(DownloadError, match="(?s)place it by hand.*Hugging Face fallback.*no route"):
        sources.wikitext103_files(tmp_path / "other", urls=[refused_url])


def test_enwik8_and_text8_bytes(server, refused_url, tmp_path):
    enwik8 = sources.enwik8_bytes(tmp_path / "enwik8", urls=[server.url("enwik8.zip")], expected_size=len(ENWIK8))
    text8 = sources.text8_bytes(tmp_path / "text8", urls=[server.url("text8.zip")], expected_size=len(TEXT8))
    assert enwik8 == ENWIK8 and text8 == TEXT8
    with pytest.raises(ValueError, match="expected 100,000,000"):
        sources.enwik8_bytes(tmp_path / "enwik8", urls=[refused_url])  # cached archive, default size


def test_hand_placed_archive_needs_no_network(refused_url, tmp_path, capsys):
    raw = tmp_path / "text8"
    raw.mkdir()
    (raw / "text8.zip").write_bytes(ARCHIVES["text8.zip"])
    assert sources.text8_bytes(raw, urls=[refused_url], expected_size=len(TEXT8)) == TEXT8
    assert sidecar_path(raw / "text8.zip").read_text().split()[0] == sha256_file(raw / "text8.zip")
    assert "not verified against a published value" in capsys.readouterr().err

    (raw / "text8.zip").write_bytes(ARCHIVES["enwik8.zip"])  # swapped afterwards: the recorded checksum objects
    with pytest.raises(ChecksumError, match="recorded"):
        sources.text8_bytes(raw, urls=[refused_url], expected_size=len(TEXT8))


def test_known_sha256_are_not_invented():
    assert set(sources.KNOWN_SHA256) == {"wikitext-103-v1.zip", "enwik8.zip", "text8.zip"}
    assert all(v is None or len(v) == 64 for v in sources.KNOWN_SHA256.values())
