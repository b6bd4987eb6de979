"""Two processes preparing one corpus in one data folder (`REPRO_DATA`, as the ranks of a node or the nodes that
share a folder do): one builds it, the other waits on the build's lock (`repro.io.build_lock`, `flock`) and takes
the finished cache; neither sees a half-written file. Where nodes share a folder, the filesystem must honour `flock`
across machines (docs/multinode.md); the default folder is node-local."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = """
import os, sys
from repro.data.corpora import build
folder = build("embedded-char")
print(os.stat(folder / "tokens.pt").st_ino, (folder / "meta.json").exists())
"""


def test_two_processes_build_one_corpus_once(tmp_path):
    env = {**os.environ, "REPRO_DATA": str(tmp_path / "data"), "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", CODE], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-1000:] for _, err in outs]
    seen = {out.strip() for out, _ in outs}
    assert len(seen) == 1 and seen.pop().endswith(" True")  # the same file: built once, by one of them
    assert not list((tmp_path / "data" / "cache").glob("**/*.tmp*"))
