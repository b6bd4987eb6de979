"""The committed record of the last full rehearsal (`results/rehearsal/summary.json`, `repro.cli.rehearsal_record`),
checked like a DVC stage's lock (issue 38): the paper path's code and configs hash as they did when it ran, else a
fresh `repro rehearse` is due; it passed (0 failed steps, every stage at most 16 GiB resident, the disk need at most
65 GB); the README states its disk need. The fingerprint itself: contents, not modification times, of a documented
set of files."""

import json
import os
from pathlib import Path

import pytest

from repro.cli import rehearsal_record
from repro.cli.rehearsal_record import changed_files, fingerprint, part_of

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = ROOT / rehearsal_record.SUMMARY
RUN_IT = ("run `repro rehearse --keep-going` (every stage, 50-90 minutes on 2 cores) and commit "
          f"{rehearsal_record.SUMMARY}")


def _summary() -> dict:
    if not SUMMARY.exists():
        pytest.fail(f"no full rehearsal is recorded: {RUN_IT}", pytrace=False)
    return json.loads(SUMMARY.read_text())


def test_the_fingerprint_covers_the_paper_path_and_nothing_else():
    inside = ["repro/lm.py", "repro/ops/mirror.py", "papers/transformer_xl/model.py",
              "papers/transformer_xl/generation_prompt.txt", "papers/mgk/deviations.yaml",
              "configs/transformer_xl/paper/enwik8_24l.yaml", "configs/transformer_xl/paper/enwik8_24l.eval.yaml",
              "configs/rehearsal/trainer.yaml", "dvc.yaml", "params.paper.yaml", "params.rehearsal.yaml"]
    outside = ["README.md", "papers/transformer_xl/README.md", "configs/transformer_xl/small/enwik8_12l.yaml",
               "configs/transformer_xl/tiny/enwik8_12l.yaml", "tests/test_lm.py", "params.yaml", "pyproject.toml",
               "results/rehearsal/summary.json", "CHANGELOG.md", "docs/layout.md"]
    assert all(part_of(f) for f in inside) and not any(part_of(f) for f in outside)


def test_the_fingerprint_hashes_contents_not_times(tmp_path):
    files = {"repro/a.py": "x = 1\n", "papers/p/README.md": "# p\n", "configs/p/paper/e.yaml": "a: 1\n",
             "configs/p/small/e.yaml": "a: 1\n", "dvc.yaml": "stages: {}\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    before = fingerprint(tmp_path, list(files))
    os.utime(tmp_path / "repro/a.py", (0, 0))
    (tmp_path / "papers/p/README.md").write_text("# p, documented\n")
    (tmp_path / "configs/p/small/e.yaml").write_text("a: 2\n")
    assert fingerprint(tmp_path, list(files)) == before
    (tmp_path / "configs/p/paper/e.yaml").write_text("a: 2\n")
    after = fingerprint(tmp_path, list(files))
    assert changed_files(before, after) == ["configs/p/paper/e.yaml"] and after["parts"]["code"] == \
        before["parts"]["code"] != after["parts"]["configs"]
    assert changed_files(after, fingerprint(tmp_path, [*files, "repro/missing.py"])) == []


def test_the_last_full_rehearsal_ran_todays_paper_path():
    recorded = _summary()["fingerprint"]
    changed = changed_files(recorded, fingerprint(ROOT))
    if changed:
        shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        pytest.fail(f"the paper path changed since the last full rehearsal ({shown}): {RUN_IT}", pytrace=False)


def test_the_last_full_rehearsal_passed_within_the_machines_limits():
    from repro.cli.rehearsal import DDP_RUNS, merged_params
    from repro.cli.rehearsal_plan import read_pipeline

    summary = _summary()
    stages = [s["stage"] for s in summary["stages"]]
    assert summary["failed"] == [] and all(s["exit"] == 0 for s in summary["stages"])
    assert stages == [*read_pipeline(ROOT, merged_params(ROOT)).order, *(f"ddp:{p}/{c}" for p, c in DDP_RUNS)]
    over = {s["stage"]: s["peak_rss_mb"] for s in summary["stages"]
            if s["peak_rss_mb"] > rehearsal_record.STAGE_PEAK_LIMIT_MB}
    assert not over, f"stages above 16 GiB resident (MiB): {over}"
    disk = summary["disk"]
    assert disk["need_bytes"] + disk["mirror_and_data_bytes"] <= 65e9 and disk["peak_bytes"] <= 65e9


def test_the_readme_states_the_rehearsals_disk_need():
    from repro.ops import docs

    readme = (ROOT / "README.md").read_text()
    sentence = docs.disk_sentence(_summary())
    assert "rehearsal-disk" in docs.block_names(readme) and " ".join(sentence.split()) in " ".join(readme.split()), \
        "README.md's rehearsal-disk block is not the summary's sentence: run `repro tables readme`"


def test_the_disk_block_says_when_no_rehearsal_is_recorded(tmp_path):
    from repro.ops import docs

    assert "No full rehearsal is recorded" in docs.rehearsal_disk_block(tmp_path / "summary.json")
    summary = {"disk": {"need_bytes": 36.8e9, "mirror_and_data_bytes": 2.1e9, "peak_bytes": 30.2e9}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    block = docs.rehearsal_disk_block(tmp_path / "summary.json")
    assert block.startswith("A full rehearsal needs about 39 GB of free disk: 37 GB") and "peaked at 30 GB" in block
    assert max(len(line) for line in block.splitlines()) <= 116


def test_the_machine_names_the_cpu_its_speed_flags_cores_and_memory():
    """One string: the model, the instruction sets that decide the CPU kernels' speed (those /proc/cpuinfo lists of
    `repro.tracking.SPEED_FLAGS`), the cores and the memory; read without torch, as the rehearsal's parent has none."""
    import subprocess
    import sys

    from repro.tracking import SPEED_FLAGS, cpu_flags

    code = ("import sys\nfrom repro.cli import rehearsal_record\n"
            "print(rehearsal_record.machine(), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=True)
    text, torch_imported = done.stdout.strip().rsplit(" ", 1)
    assert torch_imported == "False" and text == rehearsal_record.machine()
    name, flags = cpu_flags()
    has = [f for f in SPEED_FLAGS if f in flags]
    assert text.startswith(name or "unknown CPU") and f" {os.cpu_count()} cores, " in text and text.endswith(" memory")
    assert (f"({', '.join(has)})" in text) == bool(has) and "\n" not in text
