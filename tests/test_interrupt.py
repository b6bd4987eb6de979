"""Interrupted training loses nothing: `repro fit` stopped by SIGINT (Ctrl-C) or killed by SIGKILL mid-fit, then
resumed with the documented command (the same command plus `--run.resume true`), reaches the loss trajectory of
an uninterrupted run, step for step; the killed run's MLflow run ends as KILLED and the resumed run cites it.

Each fit is a real `python -m repro fit` process on a 2-layer Transformer-XL (dropout on, so the restored RNG state
matters), slowed by a user callback given with `--trainer.callbacks+=` — which also checks that `--run.curves` no
longer drops the configured callbacks.
"""

import csv
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow  # every test here runs `repro fit` in subprocesses and interrupts them

TINY = "configs/transformer_xl/tiny/enwik8_12l.yaml"
STEPS = 12
SMALL = ["--model.init_args.model.n_layer", "2", "--model.init_args.model.d_model", "32",
         "--model.init_args.model.n_head", "2", "--model.init_args.model.d_head", "16",
         "--model.init_args.model.d_inner", "64", "--model.init_args.model.dropout", "0.1",
         "--model.init_args.memory.mem_len", "16", "--model.init_args.optim.warmup_steps", "2",
         "--data.init_args.batch_size", "4", "--data.init_args.tgt_len", "16",
         "--trainer.max_steps", str(STEPS), "--trainer.log_every_n_steps", "1", "--trainer.precision", "32-true",
         "--trainer.limit_val_batches", "0", "--run.last_every_steps", "3", "--run.last_every_minutes", "0"]

SLOW = '''
import time
from lightning.pytorch import Callback

class Slow(Callback):
    """A step of ~0.2 s, so that a signal lands mid-fit."""
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        time.sleep(0.2)
'''


def _fit_args(d, *, tracking="none"):
    return ["fit", "-c", TINY, *SMALL, "--run.checkpoint", str(d / "a.ckpt"), "--run.curves", str(d / "a.csv"),
            "--run.tracking", tracking, "--trainer.callbacks+=slow.Slow"]


def _env(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(tmp_path),
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}


def _losses(path):
    rows = [r for r in csv.DictReader(open(path)) if r["split"] == "train"]
    return {int(r["step"]): float(r["loss"]) for r in rows}


def _interrupted(args, *, root, env, sig, last):
    """Start a fit, wait for its first last checkpoint, send `sig` (after `delay` s), return the finished process."""
    proc = subprocess.Popen([sys.executable, "-m", "repro", *args], cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not last.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline
        time.sleep(0.05)
    time.sleep(0.3)  # a step or two after the first last checkpoint (step 3): mid-fit, not on a boundary
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def straight(root, tmp_path_factory):
    d = tmp_path_factory.mktemp("straight")
    done = subprocess.run([sys.executable, "-m", "repro", *_fit_args(d)], cwd=root, env=_env(d),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (d / "a.last.ckpt").exists()  # the final checkpoint supersedes it
    losses = _losses(d / "a.csv")
    assert sorted(losses) == list(range(1, STEPS + 1))
    return losses


def _resume_and_compare(root, d, env, straight, *, tracking="none"):
    done = subprocess.run([sys.executable, "-m", "repro", *_fit_args(d, tracking=tracking), "--run.resume", "true"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming from" in done.stdout
    resumed = _losses(d / "a.csv")
    assert sorted(resumed) == list(range(1, STEPS + 1))  # the curve before the interruption came with the checkpoint
    for step in range(1, STEPS + 1):
        assert resumed[step] == pytest.approx(straight[step], rel=1e-5), step
    return done


def test_ctrl_c_saves_a_last_checkpoint_and_resumes_the_same_trajectory(root, tmp_path, straight):
    env, last = _env(tmp_path), tmp_path / "a.last.ckpt"
    code, _, err = _interrupted(_fit_args(tmp_path), root=root, env=env, sig=signal.SIGINT, last=last)
    assert code != 0
    assert "resume with: repro fit" in err and "--run.resume true" in err, err[-2000:]
    import torch

    state = torch.load(last, weights_only=True)
    stopped_at = state["global_step"]
    assert 3 < stopped_at < STEPS  # saved where Ctrl-C stopped it, not at the last periodic save
    assert state["repro"]["train_memory"][0].shape == (4, 16, 32)
    assert state["repro_run"]["module_class"] == "papers.transformer_xl.module.TransformerXLLM"
    assert len(_losses(tmp_path / "a.csv")) == stopped_at  # the curve so far was written too
    _resume_and_compare(root, tmp_path, env, straight)
    assert not last.exists()


def test_sigkill_resumes_from_the_periodic_checkpoint_and_marks_the_run_killed(root, tmp_path, straight):
    from mlflow.tracking import MlflowClient

    env, last = _env(tmp_path), tmp_path / "a.last.ckpt"
    code, _, _ = _interrupted(_fit_args(tmp_path, tracking="mlflow"), root=root, env=env, sig=signal.SIGKILL,
                              last=last)
    assert code == -signal.SIGKILL
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (killed,) = client.search_runs([client.get_experiment_by_name("transformer_xl").experiment_id])
    assert killed.info.status == "RUNNING"  # what a SIGKILL leaves behind
    _resume_and_compare(root, tmp_path, env, straight, tracking="mlflow")
    runs = {r.info.run_id: r for r in client.search_runs([killed.info.experiment_id])}
    assert runs[killed.info.run_id].info.status == "KILLED"
    (resumed,) = [r for r in runs.values() if r.info.run_id != killed.info.run_id]
    assert resumed.info.status == "FINISHED"
    assert resumed.data.tags["resumed_from_run"] == killed.info.run_id
    assert resumed.data.tags["experiment"] == "enwik8_12l" and resumed.data.tags["seed"] == "1111"
    assert resumed.data.tags["git_commit"] and resumed.data.tags["checkpoint"].endswith("a.ckpt")


def test_slurms_warning_signal_saves_requeues_and_the_requeued_job_resumes(root, tmp_path, straight):
    """Under SLURM (its job id in the environment, a stand-in `scontrol` on the path), SIGUSR1 (`--signal=
    SIGUSR1@90`) saves the last checkpoint at the end of the step and requeues the job; the requeued job's
    command (with `--run.resume true`) continues with the losses of an uninterrupted run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.log"}\n')
    scontrol.chmod(0o755)
    env = {**_env(tmp_path), "SLURM_JOB_ID": "4242", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    last = tmp_path / "a.last.ckpt"
    code, _, err = _interrupted(_fit_args(tmp_path), root=root, env=env, sig=signal.SIGUSR1, last=last)
    assert code != 0 and "repro: requeued SLURM job 4242" in err, err[-2000:]
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    import torch

    assert 3 < torch.load(last, weights_only=True)["global_step"] < STEPS
    _resume_and_compare(root, tmp_path, env, straight)
