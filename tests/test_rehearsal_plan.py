"""The plan of `repro rehearse` (`repro.cli.rehearsal_plan`): DVC's own stages and edges under the rehearsal's
parameters, upstream first; each stage's checkpoints dropped from the scratch workspace once every stage of the plan
that reads them has run, with their hard links in DVC's cache; and the disk need counted stage by stage with those
drops (kept to the end, the checkpoints alone took 70 GB of a 91 GB estimate)."""

import os
import subprocess
from pathlib import Path

import pytest

from repro.cli.disk import RESERVE, Fit, need
from repro.cli.rehearsal import merged_params
from repro.cli.rehearsal_plan import checkpoint_outs, drop_checkpoints, drops, read_pipeline, readers, with_upstream

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pipeline():
    return read_pipeline(ROOT, merged_params(ROOT))


def test_the_plan_is_dvcs_stage_list_upstream_first(pipeline, tmp_path):
    import yaml

    (tmp_path / "dvc.yaml").write_bytes((ROOT / "dvc.yaml").read_bytes())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(merged_params(ROOT)))
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    listed = subprocess.run(["dvc", "stage", "list", "--name-only"], cwd=tmp_path, check=True, capture_output=True,
                            text=True, env={**os.environ, "DVC_NO_ANALYTICS": "1"}).stdout.split()
    assert sorted(pipeline.order) == sorted(listed) and len(listed) > 40
    seen = set()
    for name in pipeline.order:
        assert pipeline.upstream[name] <= seen, name
        seen.add(name)
    assert pipeline.upstream["txl_recl"] == {"txl_run@lm"} and "txl_data" in pipeline.upstream["txl_run@lm1b_large"]


def test_stages_asked_for_come_with_their_upstream_stages(pipeline):
    assert with_upstream(pipeline, ["txl_run@lm1b_large"]) == ["txl_data", "txl_run@lm1b_large"]
    plan = with_upstream(pipeline, ["txl_tables"])
    assert plan[0] == "txl_data" and plan[-1] == "txl_tables"
    assert {"txl_run@lm", "txl_recl", "txl_slowdown"} <= set(plan)
    assert "txl_generate" not in plan and not any(n.startswith("mgk_") for n in plan)  # no table reads them


def test_checkpoints_go_once_their_readers_have_run(pipeline):
    """Transformer-XL's `lm` group is read by RECL and generation: dropped after the later of the two; every other
    group right after its own stage; a plan without the readers drops `lm` after it too."""
    assert checkpoint_outs(pipeline, "txl_run@lm") == ["checkpoints/transformer_xl/paper/lm"]
    assert readers(pipeline, "txl_run@lm") == ["txl_recl", "txl_generate"]
    assert readers(pipeline, "txl_run@lm1b_large") == [] and checkpoint_outs(pipeline, "txl_tables") == []
    plan = list(pipeline.order)
    schedule = dict(zip(plan, drops(pipeline, plan)))
    assert schedule["txl_generate"] == ["txl_run@lm"] and schedule["txl_recl"] == []
    assert schedule["txl_run@lm"] == [] and schedule["txl_run@lm1b_large"] == ["txl_run@lm1b_large"]
    with_checkpoints = [n for n in plan if checkpoint_outs(pipeline, n)]
    assert sorted(n for names in schedule.values() for n in names) == sorted(with_checkpoints)
    short = ["txl_data", "txl_run@lm"]
    assert drops(pipeline, short) == [[], ["txl_run@lm"]]


def test_dropping_removes_the_files_and_their_cache_links(tmp_path):
    ws = tmp_path / "repo"
    group = ws / "checkpoints" / "p" / "paper" / "g"
    group.mkdir(parents=True)
    (group / "a.ckpt").write_bytes(b"x" * 1000)
    os.link(group / "a.ckpt", group / "a.last.ckpt")  # a selection's shared pair: one inode
    cache = ws / ".dvc" / "cache" / "files" / "md5" / "ab"
    cache.mkdir(parents=True)
    os.link(group / "a.ckpt", cache / "cdef")
    (cache / "other").write_bytes(b"y" * 10)  # another stage's file
    assert drop_checkpoints(ws, ["checkpoints/p/paper/g"]) == 1000
    assert not list(group.iterdir()) and [p.name for p in cache.iterdir()] == ["other"]
    assert drop_checkpoints(ws, ["checkpoints/p/paper/missing"]) == 0


def test_the_need_counts_what_is_on_disk_at_once_with_drops(tmp_path):
    g = 10**9
    a = Fit(str(tmp_path / "a.ckpt"), 0, 5 * g, select=True, shared=True)  # kept 5; 2 × 5 more while saving
    b = Fit(str(tmp_path / "b.ckpt"), 0, 10 * g, select=True, shared=True)  # kept 10; 2 × 10 more while saving
    c = Fit(str(tmp_path / "c.ckpt"), 0, 1 * g, select=False)  # kept 1; 1 more while saving
    groups = [[a], [], [b], [c]]
    # a is kept until the second stage (its reader) has run; b and c go right after their own stage
    assert need(groups, replacing=False, drops=[[], [0], [2], [3]]) == (10 + 20) * g + RESERVE
    # nothing dropped: everything accumulates (a, b, then c while it saves)
    assert need(groups, replacing=False, drops=[[], [], [], []]) == max(5 + 10, 15, 15 + 20, 16 + 1) * g + RESERVE
    # a kept to the end: it sits beside b while b saves
    assert need(groups, replacing=False, drops=[[], [], [2], [3, 0]]) == (5 + 10 + 20) * g + RESERVE


@pytest.mark.slow
def test_the_full_rehearsal_fits_in_65_gb(pipeline, tmp_path, monkeypatch):
    """The estimate of every stage and the DDP fits, with the drops, at the paper models' sizes: at most 65 GB."""
    from repro.cli import disk
    from repro.cli.rehearsal import check_disk

    monkeypatch.setattr(disk, "free_bytes", lambda where: (10**15, Path(where)))
    plan = list(pipeline.order)
    need_bytes = check_disk(ROOT, tmp_path / "work", plan, drops(pipeline, plan), ddp=True,
                            params=merged_params(ROOT))
    kept = check_disk(ROOT, tmp_path / "work", plan, [[] for _ in plan], ddp=True, params=merged_params(ROOT),
                      keep_ddp=True)
    assert need_bytes <= 65e9 < kept


def test_stages_run_in_order_and_drop_what_their_readers_have_read(tmp_path, monkeypatch):
    """`run_stages` with a drop schedule: the checkpoint a stage writes is there for its reader, gone after it, and
    each stage's entry holds the scratch folder's peak disk during it; `on_step` sees every stage as it ends (a rerun
    of stale steps writes its record there, so that a rehearsal cut short keeps what it finished)."""
    import sys

    from repro.cli import rehearsal

    ws = tmp_path / "repo"
    ws.mkdir()
    ckpt = ws / "checkpoints" / "p" / "paper" / "g" / "a.ckpt"
    commands = {"write": [sys.executable, "-c", f"import pathlib; p = pathlib.Path({str(ckpt)!r}); "
                                                "p.parent.mkdir(parents=True); p.write_bytes(bytes(5_000_000))"],
                "read": [sys.executable, "-c", f"import pathlib; assert pathlib.Path({str(ckpt)!r}).is_file()"],
                "after": [sys.executable, "-c", "pass"]}
    monkeypatch.setattr(rehearsal, "stage_command", lambda name: commands[name])
    seen = []
    with rehearsal.DiskPeak(tmp_path, every=0.05) as disk:
        summary = rehearsal.run_stages(["write", "read", "after"], ws, dict(os.environ), keep_going=False,
                                       drop={"read": ["checkpoints/p/paper/g"]}, disk=disk,
                                       on_step=lambda entries: seen.append([e["stage"] for e in entries]))
    assert [r["exit"] for r in summary] == [0, 0, 0] and not ckpt.exists()
    assert seen == [["write"], ["write", "read"], ["write", "read", "after"]]
    assert summary[0]["disk_peak_mb"] >= 5 and summary[2]["disk_peak_mb"] < 5
