"""A fit with `--run.select` or `--run.resume` and no `--run.checkpoint` writes to a default path derived from its
run section, `checkpoints/<paper>/<profile>/<experiment>.ckpt` (the README's multi-GPU command of a paper
config that selects its model exited at once asking for `--run.checkpoint`).

The fits run through the `repro` entry point in an empty folder outside the repository (whose root is then that
folder, `repro.tracking.repo_root`), with the configs given by absolute path; under DDP the two ranks must write
one pair of files and say the path once."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repro.cli.checkpoints import default_checkpoint

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "configs/transformer_xl/tiny/enwik8_12l.yaml")
SMALL = ["--model.init_args.model.n_layer", "2", "--model.init_args.model.d_model", "32",
         "--model.init_args.model.n_head", "2", "--model.init_args.model.d_head", "16",
         "--model.init_args.model.d_inner", "64", "--model.init_args.memory.mem_len", "16",
         "--data.init_args.batch_size", "4", "--data.init_args.tgt_len", "16",
         "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "2", "--trainer.precision", "32-true",
         "--run.tracking", "none"]
DEFAULT = Path("checkpoints/transformer_xl/tiny/enwik8_12l.ckpt")  # the tiny config's run section


def _cli(args, cwd):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}  # `papers` from outside the repository
    return subprocess.run([sys.executable, "-m", "repro", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=env)


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_the_path_follows_paper_profile_and_experiment(tmp_path):
    run = {"paper": "transformer_xl", "profile": "paper", "experiment": "enwik8_12l"}
    assert default_checkpoint(run, tmp_path) == tmp_path / "checkpoints/transformer_xl/paper/enwik8_12l.ckpt"
    # a rehearsal of the paper profile never replaces (nor resumes from) the real run's checkpoint
    assert default_checkpoint({**run, "rehearsal": True}, tmp_path) == \
        tmp_path / "checkpoints/transformer_xl/rehearsal/enwik8_12l.ckpt"
    assert default_checkpoint({**run, "experiment": ""}, tmp_path) is None


@pytest.mark.slow
def test_select_without_checkpoint_writes_the_default_and_resumes_from_it(tmp_path):
    fit = _cli(["fit", "-c", TINY, *SMALL, "--trainer.max_steps", "4", "--run.select", "val/loss:max"], tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    said = [line for line in fit.stdout.splitlines() if line.startswith("repro: checkpoint")]
    assert said == [f"repro: checkpoint {DEFAULT} (--run.select without --run.checkpoint: the default for paper "
                    "transformer_xl, profile tiny, experiment enwik8_12l)"]
    assert _files(tmp_path) == [str(DEFAULT), str(DEFAULT.with_name("enwik8_12l.last.ckpt"))]
    ckpt = torch.load(tmp_path / DEFAULT, map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 2  # the highest validation loss: the first validation
    # the provenance stored in the checkpoint names the path the run used
    assert f"checkpoint: {tmp_path / DEFAULT}" in ckpt["repro_run"]["config"]

    more = _cli(["fit", "-c", TINY, *SMALL, "--trainer.max_steps", "6", "--run.select", "val/loss:max",
                 "--run.resume", "true"], tmp_path)
    assert more.returncode == 0, more.stderr[-3000:]
    assert f"resuming from {tmp_path / DEFAULT.with_name('enwik8_12l.last.ckpt')}" in more.stdout
    last = torch.load(tmp_path / DEFAULT.with_name("enwik8_12l.last.ckpt"), map_location="cpu", weights_only=True)
    assert last["global_step"] == 6


@pytest.mark.slow
def test_resume_alone_takes_the_same_default(tmp_path):
    """`--run.resume true` without a checkpoint: the same path (nothing to resume yet, so a fresh fit that saves
    its final checkpoint there)."""
    fit = _cli(["fit", "-c", TINY, *SMALL, "--trainer.max_steps", "2", "--run.resume", "true"], tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert "--run.resume without --run.checkpoint" in fit.stdout
    assert _files(tmp_path) == [str(DEFAULT)]


@pytest.mark.slow
def test_a_run_without_a_name_is_refused_in_one_line(tmp_path):
    fit = _cli(["fit", "-c", TINY, *SMALL, "--run.experiment", "", "--run.select", "val/loss:min"], tmp_path)
    assert fit.returncode == 2
    lines = [line for line in fit.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: --run.select needs a checkpoint file") and "--run.checkpoint PATH" in lines[-1]
    assert _files(tmp_path) == []


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch without torch.distributed")
def test_ddp_ranks_agree_on_the_default(tmp_path):
    fit = _cli(["fit", "-c", TINY, *SMALL, "--trainer.max_steps", "4", "--trainer.accelerator", "cpu",
                "--trainer.devices", "2", "--trainer.strategy", "ddp", "--run.select", "val/loss:max"], tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert sum(line.startswith("repro: checkpoint") for line in fit.stdout.splitlines()) == 1  # rank 0 only
    assert _files(tmp_path) == [str(DEFAULT), str(DEFAULT.with_name("enwik8_12l.last.ckpt"))]
    assert torch.load(tmp_path / DEFAULT, map_location="cpu", weights_only=True)["global_step"] == 2
