"""The rehearsal's record (`results/rehearsal/summary.json`, `repro.cli.rehearsal_record`), kept like DVC's lock: each
step holds the digests of its own inputs, found from Python's import graph, so that a change stales only the steps
that read it (`repro rehearse --status`, `--stale`). Checked here: which steps a change to one paper, to the shared
layer or to a comment stales (on a copy of the checkout); the merge of a rerun; the README's block tells the truth
about the record and today's checkout; the recorded steps passed within the machine's limits."""

import json
import os
import shutil
from pathlib import Path

import pytest

from repro.cli import rehearsal_record
from repro.cli.rehearsal_plan import DDP_RUNS, merged_params, read_pipeline, with_upstream
from repro.cli.rehearsal_record import merge, stale_steps, stamp, step_inputs, step_names
from repro.ops import imports

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = ROOT / rehearsal_record.SUMMARY
RUN_IT = "run `repro rehearse --keep-going` (every stage and DDP fit) and commit its summary"


def _summary() -> dict:
    if not SUMMARY.exists():
        pytest.fail(f"no rehearsal is recorded: {RUN_IT}", pytrace=False)
    return json.loads(SUMMARY.read_text())


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A copy of what the rehearsal reads (code, configs, pipeline), its pipeline, and every step's inputs as they
    are, recorded as if every step had just run them."""
    root = tmp_path_factory.mktemp("checkout")
    for rel in ("repro", "papers", "configs"):
        shutil.copytree(ROOT / rel, root / rel, ignore=shutil.ignore_patterns("__pycache__", "*.md"))
    for rel in ("dvc.yaml", "params.paper.yaml", "params.rehearsal.yaml"):
        shutil.copy2(ROOT / rel, root / rel)
    pipeline = read_pipeline(root, merged_params(root))
    now = step_inputs(root, pipeline)
    summary = {"files": {f: d for v in now.values() for f, d in v.items()},
               "stages": [stamp({"stage": s, "exit": 0}, now[s]) for s in step_names(pipeline)]}
    return root, pipeline, summary


def _stale_after(checkout, rel: str, edit) -> set[str]:
    root, pipeline, summary = checkout
    path = root / rel
    before = path.read_text()
    try:
        path.write_text(edit(before))
        return set(stale_steps(summary, step_inputs(root, pipeline)))
    finally:
        path.write_text(before)
        os.utime(path)  # a new modification time: the import graph's cache reads the file again


def test_nothing_is_stale_right_after_every_step_ran(checkout):
    root, pipeline, summary = checkout
    assert stale_steps(summary, step_inputs(root, pipeline)) == {}


def test_a_change_to_one_paper_stales_its_steps_and_the_arenas_that_import_it(checkout):
    _, pipeline, _ = checkout
    stale = _stale_after(checkout, "papers/lamemo/model.py", lambda t: t + "\nCHANGED = 1\n")
    # LaMemo's own stages and DDP fit; the arena's stages that build its models (its tables stage reads records
    # only); no other paper's
    expected = {s for s in step_names(pipeline)
                if s.startswith(("lamemo_", "ddp:lamemo/", "ddp:arena/"))
                or (s.startswith("arena_") and s != "arena_tables")}
    assert stale == expected
    # what `repro rehearse --stale` runs: those stages with their upstream ones, no other paper's
    plan = with_upstream(pipeline, [n for n in pipeline.order if n in stale])
    assert set(plan) >= {n for n in stale if not n.startswith("ddp:")}
    assert all(n.startswith(("lamemo_", "arena_")) for n in plan), plan


def test_a_change_to_the_shared_layer_stales_every_step_that_imports_it(checkout):
    _, pipeline, _ = checkout
    stale = _stale_after(checkout, "repro/lm.py", lambda t: t + "\nCHANGED = 1\n")
    runs = {s for s in pipeline.order if pipeline.cmds[s].startswith("repro runs")}
    assert runs and runs <= stale and {f"ddp:{p}/{c}" for p, c in DDP_RUNS} <= stale


def test_a_comment_or_a_docstring_stales_nothing(checkout):
    edit = lambda t: t.replace('"""', '"""Edited. ', 1) + "\n# a comment\n"  # noqa: E731
    assert _stale_after(checkout, "repro/lm.py", edit) == set()
    assert _stale_after(checkout, "configs/lamemo/paper/enwik8_lamemo.yaml", lambda t: "# a comment\n" + t) == set()


def test_a_changed_config_stales_the_steps_that_run_it_and_says_why(checkout):
    root, pipeline, summary = checkout
    rel = "configs/transformer_xl/paper/ptb.yaml"
    path = root / rel
    before = path.read_text()
    try:
        path.write_text(before + "\nseed_everything: 7\n")
        why = stale_steps(summary, step_inputs(root, pipeline))
    finally:
        path.write_text(before)
    assert "txl_run@ptb" in why and f"{rel} changed" in why["txl_run@ptb"]
    assert not any(s.startswith(("mgk_", "lamemo_", "infinity_former_", "arena_")) for s in why)


def test_digests_follow_what_a_file_does(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text('"""Doc."""\nx = 1  # one\n')
    b.write_text('"""Other doc."""\n\n\nx = 1\n')
    assert imports.digest(a) == imports.digest(b)
    b.write_text("x = 2\n")
    assert imports.digest(a) != imports.digest(b)


def test_a_rerun_replaces_its_steps_and_keeps_the_others():
    old = {"commit": "a" * 40, "files": {"f": "1", "g": "1"},
           "stages": [stamp({"stage": "s1", "exit": 0, "seconds": 10}, {"f": "1"}),
                      stamp({"stage": "s2", "exit": 0, "seconds": 20}, {"g": "1"})]}
    now = {"s1": {"f": "2"}, "s2": {"g": "1"}, "s3": {"g": "1"}}
    assert set(stale_steps(old, now)) == {"s1", "s3"} and "f changed" in stale_steps(old, now)["s1"]
    rerun = [stamp({"stage": "s1", "exit": 0, "seconds": 11}, now["s1"]),
             stamp({"stage": "s3", "exit": 1, "seconds": 5}, now["s3"])]
    merged = merge(old, rerun, now=now, record={"commit": "b" * 40, "minutes": 0.3})
    assert [(s["stage"], s["seconds"]) for s in merged["stages"]] == [("s1", 11), ("s2", 20), ("s3", 5)]
    assert merged["commit"] == "a" * 40 and merged["reruns"][-1]["steps"] == ["s1", "s3"]
    assert merged["failed"] == ["s3"] and merged["files"] == {"f": "2", "g": "1"}
    assert stale_steps(merged, now) == {"s3": "it failed (exit 1)"}


def test_the_record_holds_every_steps_inputs_and_the_commit():
    """Every step names its inputs, each with a digest in `files`; a step's hash is that of those digests unless a
    later merge moved a file it shares with the steps rerun (a rerun cut short leaves such steps): it then reads
    stale, never fresh."""
    summary = _summary()
    assert len(summary["commit"]) >= 40 and summary["stages"]
    _, stale, _ = rehearsal_record.current_state(ROOT)
    for s in summary["stages"]:
        assert s["inputs"] and all(f in summary["files"] for f in s["inputs"]), s["stage"]
        if s["inputs_sha256"] != rehearsal_record.inputs_sha256({f: summary["files"][f] for f in s["inputs"]}):
            assert s["stage"] in stale, s["stage"]


def test_the_recorded_steps_passed_within_the_machines_limits():
    summary = _summary()
    assert summary["failed"] == [] and all(s["exit"] == 0 for s in summary["stages"])
    over = {s["stage"]: s["peak_rss_mb"] for s in summary["stages"]
            if s["peak_rss_mb"] > rehearsal_record.STAGE_PEAK_LIMIT_MB}
    assert not over, f"stages above 16 GiB resident (MiB): {over}"
    disk = summary["disk"]
    assert disk["need_bytes"] + disk["mirror_and_data_bytes"] <= 65e9 and disk["peak_bytes"] <= 65e9


def test_the_readme_block_tells_the_truth_about_the_record_and_todays_checkout(monkeypatch):
    """The block names the last full rehearsal's commit and the steps stale now, which are computed here from the
    record and the checkout: not that nothing is stale, but that the README says what is."""
    from repro.ops import docs

    monkeypatch.chdir(ROOT)
    summary, stale, pipeline = rehearsal_record.current_state(ROOT)
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "rehearsal" in docs.block_names((ROOT / "README.md").read_text())
    assert f"ran commit {summary['commit'][:7]}" in readme
    if stale:
        assert f"Stale now ({len(stale)}," in readme
        if len(stale) <= rehearsal_record.NAMED_STALE:
            assert all(f"`{s}`" in readme for s in stale)
        else:  # counted by paper
            papers = {rehearsal_record.paper_of(s, pipeline) for s in stale}
            counts = {p: sum(rehearsal_record.paper_of(s, pipeline) == p for s in stale) for p in papers}
            assert all(f"{p} {n}" in readme for p, n in counts.items())
    else:
        assert "No step is stale" in readme
    assert " ".join(docs.disk_sentence(summary).split()) in readme, "run `repro tables readme`"


def test_the_status_names_each_paper_and_each_stale_step(checkout):
    root, pipeline, summary = checkout
    lines = rehearsal_record.status_lines({**summary, "commit": "c" * 40, "steps": 3, "minutes": 1.0},
                                          {"txl_run@ptb": "configs/transformer_xl/paper/ptb.yaml changed"}, pipeline)
    assert lines[0].startswith("last full rehearsal: commit ccccccc")
    assert "transformer_xl: 1 of " in "\n".join(lines) and "lamemo: " in "\n".join(lines)
    assert "  txl_run@ptb: configs/transformer_xl/paper/ptb.yaml changed" in lines
    assert lines[-1].startswith("`repro rehearse --stale` reruns the 1 stale step(s)")


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
