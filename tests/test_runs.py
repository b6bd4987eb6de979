"""`repro runs`: the experiment groups of the DVC pipeline (spec grammar, the steps it runs, parallel workers)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from repro.cli.runs import _next_spec, run_spec, runs_steps

ROOT = Path(__file__).resolve().parents[1]


def test_spec_grammar():
    assert run_spec("wt103_base") == ("wt103_base", None, None, "wt103_base")
    assert run_spec("char_txl@2") == ("char_txl", None, 2, "char_txl.seed2")
    assert run_spec("lra_listops+mgk1_softe@1") == ("lra_listops", "mgk1_softe", 1, "lra_listops_mgk1_softe.seed1")
    for bad in ("", "a b", "x@", "x+@1", "x@1@2", "x;rm"):
        with pytest.raises(ValueError, match="CONFIG\\[\\+VARIANT\\]\\[@SEED\\]"):
            run_spec(bad)


def test_steps_of_a_group(tmp_path):
    cfg = tmp_path / "configs" / "p" / "tiny"
    cfg.mkdir(parents=True)
    for name in ("a.yaml", "a.eval.yaml", "b.yaml"):
        (cfg / name).write_text("{}\n")
    steps = runs_steps("p", "tiny", "g", ["a@3", "b+v"], tests="train,eval:other",
                       configs_root=str(tmp_path / "configs"))
    args = [s for s, _ in steps]
    fit_a, test_a_train, test_a_eval, fit_b, test_b_train, test_b_eval = args
    assert fit_a[:2] == ["fit", "-c"] and fit_a[fit_a.index("--seed_everything") + 1] == "3"
    assert fit_a[fit_a.index("--run.checkpoint") + 1] == "checkpoints/p/tiny/g/a.seed3.ckpt"
    assert fit_a[fit_a.index("--run.curves") + 1] == "results/p/curves/tiny/g/a.seed3.csv"
    assert test_a_train.count("-c") == 1 and test_a_eval.count("-c") == 2  # the .eval.yaml only in `eval`
    assert test_a_eval[test_a_eval.index("--run.record") + 1] == "results/p/runs/tiny/g/a.seed3.other.test.json"
    assert test_a_eval[test_a_eval.index("--run.experiment") + 1] == "a.seed3.other"
    assert test_b_eval.count("-c") == 1  # b has no .eval.yaml: tested with its training config
    assert fit_b[fit_b.index("--model.init_args.variant") + 1] == "v" and "--seed_everything" not in fit_b
    # the after-run hook gets (config, checkpoint, experiment, rehearsal configs) once per spec, after its last test
    assert [post for _, post in steps] == [None, None, (str(cfg / "a.yaml"), "checkpoints/p/tiny/g/a.seed3.ckpt",
                                                         "a.seed3", ()), None, None,
                                           (str(cfg / "b.yaml"), "checkpoints/p/tiny/g/b_v.ckpt", "b_v", ())]
    with pytest.raises(ValueError, match="no config"):
        runs_steps("p", "tiny", "g", ["c"], configs_root=str(tmp_path / "configs"))
    with pytest.raises(ValueError, match="train\\|eval"):
        runs_steps("p", "tiny", "g", ["a"], tests="valid", configs_root=str(tmp_path / "configs"))


def test_the_work_queue_hands_out_each_spec_once_in_order(tmp_path):
    queue = tmp_path / "queue"
    queue.write_text("a@1\nb\n\nc+v\n")
    assert [_next_spec(queue) for _ in range(4)] == ["a@1", "b", "c+v", None]
    assert queue.read_text() == ""


def _specs(value) -> list[str]:
    return value.split() if isinstance(value, str) else [s for v in value.values() for s in v.split()]


def test_every_pipeline_spec_names_a_config_of_its_profile():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    profile = params["profile"]
    groups = {"transformer_xl": [params["transformer_xl"]["runs"]],
              "mgk": [params["mgk"]["runs"], params["mgk"]["lra"]],
              "lamemo": [params["lamemo"]["runs"]],
              "infinity_former": [params["infinity_former"]["sorting"], params["infinity_former"]["gpt2"],
                                  params["infinity_former"]["gpt2_dog"]]}
    seen = set()
    for paper, values in groups.items():
        for value in values:
            for spec in _specs(value):
                config, _, _, exp = run_spec(spec)
                assert (ROOT / "configs" / paper / profile / f"{config}.yaml").exists(), (paper, spec)
                assert (paper, exp) not in seen, f"{paper}: experiment {exp} listed twice"
                seen.add((paper, exp))


@pytest.mark.slow
def test_workers_share_a_group_and_each_run_equals_the_same_run_alone(tmp_path):
    cfg_dir = tmp_path / "configs" / "transformer_xl" / "tiny"
    cfg_dir.mkdir(parents=True)
    src = ROOT / "configs" / "transformer_xl" / "tiny"
    cfg = yaml.safe_load((src / "enwik8_12l.yaml").read_text())
    cfg["trainer"].update(max_steps=3, limit_val_batches=2, val_check_interval=3)
    (cfg_dir / "x.yaml").write_text(yaml.safe_dump(cfg))
    ev = yaml.safe_load((src / "enwik8_12l.eval.yaml").read_text())
    ev.setdefault("trainer", {})["limit_test_batches"] = 2
    (cfg_dir / "x.eval.yaml").write_text(yaml.safe_dump(ev))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REPRO_DATA": str(ROOT / "data"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    done = subprocess.run([sys.executable, "-m", "repro", "runs", "--paper", "transformer_xl", "--profile", "tiny",
                           "--group", "g", "--jobs", "2", "--tests", "eval,train:alt", "x", "x@5"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "[0] " in done.stdout and "[1] " in done.stdout  # two workers, their output prefixed
    # into a pipe (a pipeline's log, under the command line DVC shows): one line per experiment with the summary
    # of each of its runs, no header (a terminal gets one)
    lines = done.stdout.splitlines()
    assert len(lines) == 2, lines
    assert sorted(line[4:].split(":")[0] for line in lines) == ["x", "x.seed5"]
    assert all(" fit  train loss " in line and "| test  loss " in line and "| test.alt  loss " in line
               for line in lines), lines
    assert done.stderr.strip() == "", done.stderr[-2000:]
    # tracking: every test run names the fit run whose checkpoint it read
    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    found = client.search_runs([client.get_experiment_by_name("transformer_xl").experiment_id])
    fits = {r.data.tags["experiment"]: r.info.run_id for r in found if r.data.tags["subcommand"] == "fit"}
    tests = [r for r in found if r.data.tags["subcommand"] == "test"]
    assert len(fits) == 2 and len(tests) == 4
    for r in tests:
        assert r.data.tags["fit_run"] == fits[r.data.tags["experiment"].replace(".alt", "")]
        assert r.data.tags["ckpt_path"].endswith(".ckpt") and r.data.tags["profile"] == "tiny"
    assert not any(k.startswith("data/prepare_data") or k.startswith("data/allow_zero") for r in found
                   for k in r.data.params)  # no Lightning internals as parameters
    runs = tmp_path / "results" / "transformer_xl" / "runs" / "tiny" / "g"
    assert sorted(p.name for p in runs.iterdir()) == sorted(
        f"{e}.{s}.json" for e in ("x", "x.seed5") for s in ("fit", "test", "alt.test"))
    assert (tmp_path / "checkpoints" / "transformer_xl" / "tiny" / "g" / "x.seed5.ckpt").exists()
    assert (tmp_path / "results" / "transformer_xl" / "curves" / "tiny" / "g" / "x.csv").exists()
    rec = {p.name: json.loads(p.read_text()) for p in runs.iterdir()}
    assert rec["x.seed5.alt.test.json"]["experiment"] == "x.seed5.alt"
    assert rec["x.fit.json"]["metrics"] != rec["x.seed5.fit.json"]["metrics"]  # another seed, another run
    # the worker's run (one thread) equals the same fit run alone on one thread
    alone = tmp_path / "alone.json"
    done = subprocess.run([sys.executable, "-m", "repro", "fit", "-c", str(cfg_dir / "x.yaml"),
                           "--seed_everything", "5", "--run.tracking", "none", "--run.record", str(alone)],
                          cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(alone.read_text())["metrics"] == rec["x.seed5.fit.json"]["metrics"]


@pytest.mark.slow
def test_a_failing_worker_fails_the_group(tmp_path):
    cfg_dir = tmp_path / "configs" / "transformer_xl" / "tiny"
    cfg_dir.mkdir(parents=True)
    (cfg_dir / "broken.yaml").write_text("model:\n  class_path: no.such.Module\n")
    (cfg_dir / "also_broken.yaml").write_text("model:\n  class_path: no.such.Module\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    done = subprocess.run([sys.executable, "-m", "repro", "runs", "--paper", "transformer_xl", "--profile", "tiny",
                           "--group", "g", "--jobs", "2", "broken", "also_broken"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert "worker(s) [0, 1] failed" in done.stdout + done.stderr


BUILD = """
import os, sys, time
from pathlib import Path
go = Path(sys.argv[2])
while not go.exists():  # both processes start building at the same moment
    time.sleep(0.01)
if sys.argv[1] == "sorting":
    from repro.data.sorting import SortingSpec, load
    load(SortingSpec(length=64, n_train=3000, n_valid=300, n_test=300, seed=0))  # checks every split's sha256
else:
    from repro.data.corpora import load_corpus
    load_corpus("embedded-char")
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sorting", "corpus"])
def test_two_processes_build_one_data_set_at_once(tmp_path, kind):
    """The workers of a group (or two `repro fit` of one task) may build one data set together: they take turns
    under its lock, and both read a complete, checksummed build."""
    import time

    env = {**os.environ, "REPRO_DATA": str(tmp_path / "data")}
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", BUILD, kind, str(go)], cwd=ROOT, env=env,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    time.sleep(1.5)  # both have imported torch and wait
    go.touch()
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    built = list((tmp_path / "data").rglob("meta.json"))
    assert len(built) == 1 and not list((tmp_path / "data").rglob("*.part"))


def test_tensor_files_are_the_same_bytes_for_the_same_tensors(tmp_path):
    """Two writers of one data file produce one content (the sha256 a build records holds for both)."""
    import torch

    from repro.io import save_tensors

    t = {"x": torch.arange(10)}
    save_tensors(tmp_path / "a.pt", t)
    save_tensors(tmp_path / "b.pt", t)
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "b.pt").read_bytes()


def test_records_and_tables_are_written_with_the_users_umask(tmp_path):
    from repro.io import atomic_write_json, atomic_write_text, save_tensors

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "table.md", "| a |\n")
        atomic_write_json(tmp_path / "record.json", {"a": 1})
        save_tensors(tmp_path / "t.pt", {})
        os.umask(0o027)
        atomic_write_text(tmp_path / "private.md", "x")
    finally:
        os.umask(old)
    for name in ("table.md", "record.json", "t.pt"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644, name
    assert (tmp_path / "private.md").stat().st_mode & 0o777 == 0o640
