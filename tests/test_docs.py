"""Every figure of a README is generated (repro/ops/docs.py): the committed blocks equal what the committed tables
and records give, the speed tables equal their records, and the block machinery refuses what it cannot render."""

from pathlib import Path

import pytest

from repro.cli.commands import readme_blocks
from repro.ops import docs, speed

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("document", docs.documents(ROOT), ids=str)
def test_generated_blocks_equal_what_the_records_give(document, monkeypatch):
    monkeypatch.chdir(ROOT)
    text = (ROOT / document).read_text()
    assert docs.render(text, readme_blocks()) == text, (f"{document}: a generated block differs from its records: "
                                       "run `repro tables readme`")


def test_the_front_page_shows_the_claims_and_the_speed():
    assert {"claims", "speed"} <= set(docs.block_names((ROOT / "README.md").read_text()))


def test_a_file_block_shows_a_generated_table_without_its_title(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "p").mkdir(parents=True)
    (tmp_path / "results" / "p" / "t.md").write_text("# Title\n\n| a |\n|---|\n| 1 |\n")
    text = "<!-- repro:begin file:results/p/t.md -->\n<!-- repro:end file:results/p/t.md -->\n"
    assert docs.render(text) == ("<!-- repro:begin file:results/p/t.md -->\n| a |\n|---|\n| 1 |\n"
                                 "<!-- repro:end file:results/p/t.md -->\n")
    for bad in ("README.md", "results/../x.md", "results/p/missing.md"):
        with pytest.raises(ValueError):
            docs.file_block(bad)


def test_speed_tables_equal_their_records(monkeypatch):
    monkeypatch.chdir(ROOT)
    for table in speed.build():
        assert (ROOT / "results" / "speed" / f"{table.name}.md").read_text() == table.markdown(), \
            f"results/speed/{table.name}.md differs from the records: run `repro tables speed`"


def test_an_unknown_block_is_an_error_and_the_others_are_rendered():
    text = "a\n<!-- repro:begin x -->\nold\n<!-- repro:end x -->\nb\n"
    assert docs.render(text, {"x": lambda: "new"}) == "a\n<!-- repro:begin x -->\nnew\n<!-- repro:end x -->\nb\n"
    with pytest.raises(ValueError, match="unknown generated block 'x'"):
        docs.render(text, {})


def test_speed_rows_are_ranges_over_rounds(tmp_path):
    row = {"config": ["configs/p/paper/a.yaml"], "mode": "train", "precision": "bf16", "device": "NVIDIA H200",
           "torch": "2.11", "batch_size": 2, "tgt_len": 8, "peak_memory_mb": 10.0}
    rows = [row | {"variant": "eager", "round": r, "tokens_per_s": t, "mfu": m, "relative": 1.0}
            for r, t, m in ((1, 100.0, 0.01), (2, 120.0, 0.012))]
    rows += [row | {"variant": "sdpa", "round": r, "tokens_per_s": t, "mfu": m, "relative": t / b}
             for r, t, m, b in ((1, 150.0, 0.015, 100.0), (2, 180.0, 0.018, 120.0))]
    (tmp_path / "r.jsonl").write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    (table,) = speed.build(tmp_path)
    assert [r[4:8] for r in table.rows] == [["eager", "100–120", "1.0%–1.2%", "1.00×"],
                                           ["sdpa", "150–180", "1.5%–1.8%", "1.50×"]]
    block = docs.speed_block(tmp_path)
    assert "eager: 100–120 tok/s | sdpa: 150–180 tok/s (1.50×)" in block


@pytest.mark.slow
def test_a_rerun_stage_leaves_no_readme_behind_its_records(tmp_path, monkeypatch):
    """The quick start's order (`dvc repro`, then the tests) on a copy of the checkout: records rewritten as a rerun
    on another CPU rewrites them (other numbers), then the paper's tables stage (`repro tables mgk`); every document's
    generated blocks then equal what the records give, and the paper's README shows the new numbers."""
    import json
    import math
    import shutil
    import subprocess
    import sys

    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode()
    for rel in filter(None, files.split("\0")):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, tmp_path / rel)
    before = (tmp_path / "papers/mgk/README.md").read_text()
    for path in (tmp_path / "results/mgk/runs/tiny/lm").glob("*.test.json"):
        record = json.loads(path.read_text())
        record["metrics"] = {k: (v + math.log(1.05) if k.endswith("/loss") else v * 1.05 if k.endswith("/ppl") else v)
                             for k, v in record["metrics"].items()}
        path.write_text(json.dumps(record))
    done = subprocess.run([sys.executable, "-m", "repro", "tables", "mgk", "--no-mlflow"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    monkeypatch.chdir(tmp_path)
    for document in docs.documents(tmp_path):
        text = (tmp_path / document).read_text()
        assert docs.render(text, readme_blocks()) == text, f"{document}: a block lags behind the rerun's records"
    assert (tmp_path / "papers/mgk/README.md").read_text() != before


@pytest.mark.parametrize("readme", sorted(ROOT.glob("papers/*/README.md")), ids=lambda p: p.parent.name)
def test_a_papers_readme_reads_in_minutes(readme):
    """At most 250 lines, generated tables included: what is longer goes to docs/ or stays in results/."""
    assert len(readme.read_text().splitlines()) <= 250, f"{readme.relative_to(ROOT)}: move detail to docs/"
