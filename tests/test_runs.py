"""`repro runs`: the experiment groups of the DVC pipeline (spec grammar, the steps it runs, parallel workers)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from repro.runs import _next_spec, run_spec, runs_steps

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
    steps = runs_steps("p", "tiny", "g", ["a@3", "b+v"], tests="train,eval:other", configs_root=str(tmp_path / "configs"))
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
    # the after-run hook gets (config, checkpoint, experiment) once per spec, after its last test
    assert [post for _, post in steps] == [None, None, (str(cfg / "a.yaml"), "checkpoints/p/tiny/g/a.seed3.ckpt",
                                                         "a.seed3"), None, None,
                                           (str(cfg / "b.yaml"), "checkpoints/p/tiny/g/b_v.ckpt", "b_v")]
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
    groups = {"transformer_xl": [params["transformer_xl"]["runs"]], "mgk": [params["mgk"]["runs"], params["mgk"]["lra"]],
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
    done = subprocess.run([sys.executable, "-m", "repro", "fit", "-c", str(cfg_dir / "x.yaml"), "--seed_everything", "5",
                           "--run.tracking", "none", "--run.record", str(alone)],
                          cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(alone.read_text())["metrics"] == rec["x.seed5.fit.json"]["metrics"]


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
