"""The downloader and the corpus sources against local HTTP servers: resume, mirrors, offline, checksums, zips.

Everything is offline: small archives in the real layouts (WikiText-103 v1, enwik8, text8) are built in
tmp_path and served by `http.server.ThreadingHTTPServer` on 127.0.0.1, with a handler that honours (or
ignores) `Range` requests and can drop the connection part-way to simulate an interrupted download. The
published checksums pinned for the real files are replaced by the miniatures' own for the source tests
(`miniatures_published`), so that the pinned path runs; the real values are checked for form and provenance.
"""

from __future__ import annotations

import hashlib
import io
import os
import socket
import sys
import threading
import time
import types
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from repro.data import download as dl
from repro.data import sources
from repro.data.download import (
    ALGORITHMS,
    ArchiveError,
    ChecksumError,
    DownloadError,
    Published,
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


@pytest.fixture
def miniatures_published(monkeypatch):
    """The source tests serve miniatures under the real names: pin their own checksums in place of the real ones."""
    table = {name: Published(source="test miniature", sha256=_sha(data), size=len(data))
             for name, data in ARCHIVES.items() if name in sources.PUBLISHED}
    monkeypatch.setattr(sources, "PUBLISHED", table)
    return table


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


def test_wikitext103_files(server, refused_url, tmp_path, miniatures_published):
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


def test_wikitext103_corrupt_archive_is_reported(refused_url, tmp_path, monkeypatch):
    raw = tmp_path / "wt103"
    raw.mkdir()
    monkeypatch.setattr(sources, "PUBLISHED", {})  # nothing published: the zip reader is what objects
    (raw / "wikitext-103-v1.zip").write_bytes(ARCHIVES["wikitext-103-v1.zip"][:300])  # truncated by hand
    with pytest.raises(ArchiveError, match="delete it"):
        sources.wikitext103_files(raw, urls=[refused_url], hf_fallback=False)
    assert not (raw / "wikitext-103" / "wiki.train.tokens").exists()


def test_wikitext103_fallback_with_the_hub_unreachable_fails_at_once(refused_url, tmp_path, monkeypatch, capfd):
    """Offline, the Hugging Face fallback reads the hub's cache only: one error at once, not ~30 s of the hub
    client's retry messages (found running `repro prepare` of the paper configs on this offline machine)."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    for module in (huggingface_hub.constants, datasets.config):  # loaded already, as in a long process
        monkeypatch.setattr(module, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)
    t0 = time.time()
    with pytest.raises(DownloadError, match="Hugging Face fallback .* failed too: the hub is unreachable and its "
                                            "cache lacks the dataset .run once with network access"):
        sources.wikitext103_files(tmp_path / "wt103", urls=[refused_url], timeout=2)
    assert time.time() - t0 < 15
    assert os.environ["HF_HUB_OFFLINE"] == "1" and "Retrying" not in capfd.readouterr().err


def test_wikitext103_hugging_face_fallback(refused_url, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # the fake `datasets` below stands for a reachable hub
    monkeypatch.setattr("repro.data.sources.hub_offline", lambda timeout=3.0: False)
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


def test_enwik8_and_text8_bytes(server, refused_url, tmp_path, miniatures_published):
    enwik8 = sources.enwik8_bytes(tmp_path / "enwik8", urls=[server.url("enwik8.zip")], expected_size=len(ENWIK8))
    text8 = sources.text8_bytes(tmp_path / "text8", urls=[server.url("text8.zip")], expected_size=len(TEXT8))
    assert enwik8 == ENWIK8 and text8 == TEXT8
    with pytest.raises(ValueError, match="expected 100,000,000"):
        sources.enwik8_bytes(tmp_path / "enwik8", urls=[refused_url])  # cached archive, default size


def test_hand_placed_archive_needs_no_network(refused_url, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sources, "PUBLISHED", {})  # a file with no published checksum: trusted on first use
    raw = tmp_path / "text8"
    raw.mkdir()
    (raw / "text8.zip").write_bytes(ARCHIVES["text8.zip"])
    assert sources.text8_bytes(raw, urls=[refused_url], expected_size=len(TEXT8)) == TEXT8
    assert sidecar_path(raw / "text8.zip").read_text().split()[0] == sha256_file(raw / "text8.zip")
    assert "not verified against a published value" in capsys.readouterr().err

    (raw / "text8.zip").write_bytes(ARCHIVES["enwik8.zip"])  # swapped afterwards: the recorded checksum objects
    with pytest.raises(ChecksumError, match="recorded"):
        sources.text8_bytes(raw, urls=[refused_url], expected_size=len(TEXT8))


# ------------------------------------------------------------------------------------- published checksums


def _one_line_refusal(err, *, name: str, expected: str, actual: str, todo: str) -> None:
    msg = str(err.value)
    assert "\n" not in msg, msg
    assert name in msg and expected in msg and actual in msg and todo in msg, msg


def test_download_refuses_bytes_that_differ_from_the_published_sha256(server, tmp_path):
    dest = tmp_path / "wikitext-103-v1.zip"
    with pytest.raises(ChecksumError) as err:
        download(server.url("blob.bin"), dest, sha256="ab" * 32, record_sha256=True)
    _one_line_refusal(err, name="wikitext-103-v1.zip", expected="ab" * 32, actual=_sha(BLOB), todo="Run again")
    assert "published" in str(err.value)
    assert not dest.exists() and not part_path(dest).exists() and not sidecar_path(dest).exists()


def test_published_md5_is_verified_and_our_sha256_recorded(server, tmp_path):
    dest = tmp_path / "cifar-10-python.tar.gz"
    md5 = hashlib.md5(BLOB).hexdigest()
    download(server.url("blob.bin"), dest, sha256=None, md5=md5.upper(), record_sha256=True)  # case is not the value
    assert dest.read_bytes() == BLOB
    assert sidecar_path(dest).read_text() == f"{_sha(BLOB)}  {dest.name}\n"  # our sha256, as for every download
    download(server.url("blob.bin"), dest, sha256=None, md5=md5, record_sha256=True)  # verified, not fetched again
    assert len(server.requests) == 1

    other = tmp_path / "other" / "cifar-10-python.tar.gz"
    with pytest.raises(ChecksumError) as err:
        download(server.url("blob.bin"), other, sha256=None, md5="0" * 32, record_sha256=True)
    _one_line_refusal(err, name="cifar-10-python.tar.gz", expected="0" * 32, actual=md5, todo="fetch the file by hand")
    assert "md5" in str(err.value) and not other.exists() and not part_path(other).exists()


def test_a_file_in_place_that_differs_from_the_published_md5_is_refused(server, tmp_path):
    dest = tmp_path / "cifar-10-python.tar.gz"
    dest.write_bytes(b"a stale or damaged copy")
    md5 = hashlib.md5(BLOB).hexdigest()
    with pytest.raises(ChecksumError) as err:
        download(server.url("blob.bin"), dest, sha256=None, md5=md5, record_sha256=True)
    _one_line_refusal(err, name=str(dest), expected=md5, actual=hashlib.md5(b"a stale or damaged copy").hexdigest(),
                      todo="Delete")
    assert server.requests == [] and not sidecar_path(dest).exists()


def test_every_published_checksum_given_is_verified(server, tmp_path):
    sha1 = hashlib.sha1(BLOB).hexdigest()
    download(server.url("blob.bin"), tmp_path / "a.bin", sha256=_sha(BLOB), sha1=sha1, size=len(BLOB))
    with pytest.raises(ChecksumError, match="sha1") as err:  # sha256 right, sha1 wrong: refused all the same
        download(server.url("blob.bin"), tmp_path / "b.bin", sha256=_sha(BLOB), sha1="1" * 40)
    _one_line_refusal(err, name="b.bin", expected="1" * 40, actual=sha1, todo="Run again")
    with pytest.raises(ChecksumError, match="expected 9") as err:  # the published size is checked first
        download(server.url("blob.bin"), tmp_path / "c.bin", sha256=_sha(BLOB), size=9)
    assert "c.bin" in str(err.value) and "\n" not in str(err.value)


def test_a_malformed_published_checksum_is_a_programming_error(tmp_path):
    with pytest.raises(ValueError, match="md5 digest"):
        download("http://127.0.0.1:9/x", tmp_path / "x", sha256=None, md5="c58f3010")


def test_pinned_source_refuses_other_bytes(server, refused_url, tmp_path, miniatures_published):
    """text8 with its (miniature's) sha256 pinned: the server sends enwik8.zip's bytes under the name; refused,
    nothing kept, and no checksum recorded that would make the wrong file trusted later."""
    server.files["text8.zip"] = ARCHIVES["enwik8.zip"]
    sources.PUBLISHED["text8.zip"] = Published(source="test miniature", sha256=_sha(ARCHIVES["text8.zip"]))
    raw = tmp_path / "text8"
    with pytest.raises(ChecksumError) as err:
        sources.text8_bytes(raw, urls=[server.url("text8.zip")], expected_size=len(TEXT8))
    _one_line_refusal(err, name="text8.zip", expected=_sha(ARCHIVES["text8.zip"]), actual=_sha(ARCHIVES["enwik8.zip"]),
                      todo="Run again")
    assert not (raw / "text8.zip").exists() and not part_path(raw / "text8.zip").exists()
    assert not sidecar_path(raw / "text8.zip").exists()


def test_the_mirror_replaces_every_published_checksum_and_size(tmp_path, monkeypatch):
    """Under REPRO_MIRROR the file is the mirror's miniature: verified against its SHA256SUMS only."""
    mini = b"miniature of a real archive"
    mirror = Server({"SHA256SUMS": f"{_sha(mini)}  example.org/data/real.zip\n".encode(),
                     "example.org/data/real.zip": mini})
    try:
        monkeypatch.setenv(dl.MIRROR_ENV, mirror.url(""))
        dest = tmp_path / "real.zip"
        download("https://example.org/data/real.zip", dest, sha256="ab" * 32, md5="cd" * 16, size=10**9,
                 record_sha256=True)
        assert dest.read_bytes() == mini and sidecar_path(dest).read_text().split()[0] == _sha(mini)
        dest.write_bytes(mini[:-1] + b"X")  # damaged afterwards: the mirror's checksum objects
        with pytest.raises(ChecksumError, match="mirror's SHA256SUMS"):
            download("https://example.org/data/real.zip", dest, sha256="ab" * 32, md5="cd" * 16, record_sha256=True)
    finally:
        mirror.close()


def test_published_checksums_are_well_formed_and_say_where_they_come_from():
    from repro.data import lra_sources
    from repro.text import streams

    assert set(sources.PUBLISHED) == {"wikitext-103-v1.zip", "enwik8.zip", "text8.zip",
                                      "1-billion-word-language-modeling-benchmark-r13output.tar.gz"}
    tables = [p.kwargs() for p in sources.PUBLISHED.values()]
    tables += [streams.WT103_RAW_PUBLISHED, lra_sources.IMDB_PUBLISHED, lra_sources.CIFAR10_PUBLISHED]
    for table in tables:
        assert table.get("sha256") is not None  # a sha256 for every pinned file
        for algo, n in ALGORITHMS.items():
            value = table.get(algo)
            assert value is None or (len(value) == n and value == value.lower() and int(value, 16) >= 0)
    for p in sources.PUBLISHED.values():  # repository and path of the record
        assert p.source.count("/") >= 2 and " " in p.source


def test_the_data_page_lists_every_downloaded_file_with_its_checksum_source():
    from repro.data import lra_sources
    from repro.text import cmudog, streams

    page = (Path(__file__).resolve().parent.parent / "docs" / "data.md").read_text(encoding="utf-8")
    section = page.split("## Downloaded files and their checksums", 1)[1].split("\n## ", 1)[0]
    names = [*sources.PUBLISHED, "1b_word_vocab.txt", "simple-examples.tgz", streams.WT103_RAW_URLS[0].rsplit("/")[-1],
             *(url.rsplit("/")[-1]
               for url in (lra_sources.LRA_RELEASE_URL, lra_sources.IMDB_URL, lra_sources.CIFAR10_URL)),
             f"{cmudog.CMU_DOG_COMMIT[:12]}"]
    for name in names:
        assert name in section, name
    pinned = [p.sha256 for p in sources.PUBLISHED.values()]
    pinned += [streams.WT103_RAW_PUBLISHED["sha256"], lra_sources.IMDB_PUBLISHED["sha256"],
               lra_sources.CIFAR10_PUBLISHED["sha256"]]
    assert all(h[:12] in section for h in pinned)
    assert section.count("no published checksum") >= 4  # vocabulary, PTB, lra_release.gz, CMU-DoG
