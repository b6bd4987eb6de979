"""Runs that collide are refused in one line before they start (`repro.cli.collisions`): a second fit on a
checkpoint path that a live fit holds names that process; a resume whose model, data, seed or optimiser settings
differ from the checkpoint's names the first setting and both values, unless `--run.resume_changed true`."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from repro.cli.collisions import CheckpointLock, changed_settings, check_resume, lock_path

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "configs/transformer_xl/tiny/enwik8_12l.yaml")
SMALL = ["--model.init_args.model.n_layer", "1", "--model.init_args.model.d_model", "32",
         "--model.init_args.model.n_head", "2", "--model.init_args.model.d_head", "16",
         "--model.init_args.model.d_inner", "64", "--model.init_args.memory.mem_len", "16",
         "--data.init_args.batch_size", "4", "--data.init_args.tgt_len", "16", "--trainer.max_steps", "2",
         "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1", "--trainer.precision", "32-true",
         "--run.tracking", "none"]


def _cli(args, cwd):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "repro", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=env)


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _hold(ckpt: Path, pid: int, host: str | None = None) -> None:
    lock_path(ckpt).parent.mkdir(parents=True, exist_ok=True)
    lock_path(ckpt).write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(),
                                           "started": "2026-01-01 00:00:00", "command": "repro fit -c a.yaml"}))


def test_a_live_holder_is_named_and_a_dead_ones_lock_is_taken_over(tmp_path, sleeper):
    ckpt = tmp_path / "a.ckpt"
    _hold(ckpt, sleeper)
    with pytest.raises(ValueError) as err:
        CheckpointLock(ckpt).acquire()
    assert str(err.value) == (f"{ckpt} is being written by process {sleeper} since 2026-01-01 00:00:00 "
                              "(repro fit -c a.yaml): wait for it to end, or give this fit another --run.checkpoint")
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _hold(ckpt, int(done.stdout))  # that process has ended
    lock = CheckpointLock(ckpt, command="repro fit")
    assert "no longer runs" in lock.acquire() and json.loads(lock_path(ckpt).read_text())["pid"] == os.getpid()
    lock.release()
    assert not lock_path(ckpt).exists()
    _hold(ckpt, 1, host="another-node")
    with pytest.raises(ValueError, match=f"on another-node .*if that run is over, delete {lock_path(ckpt)}"):
        CheckpointLock(ckpt).acquire()


def test_the_settings_that_change_a_run_are_compared():
    saved = {"model": {"init_args": {"memory": {"mem_len": 512}, "optim": {"lr": 1e-3}}}, "seed_everything": 1,
             "trainer": {"max_steps": 10, "devices": 1}, "run": {"checkpoint": "a.ckpt"}}
    now = {"model": {"init_args": {"memory": {"mem_len": 256}, "optim": {"lr": 1e-3}}}, "seed_everything": 1,
           "trainer": {"max_steps": 20, "devices": 2}, "run": {"checkpoint": "b.ckpt"}}
    assert changed_settings(saved, now) == [("model.init_args.memory.mem_len", 512, 256)]
    import yaml

    with pytest.raises(ValueError, match=r"trained with model.init_args.memory.mem_len = 512, this command gives 256"):
        check_resume("a.last.ckpt", yaml.safe_dump(saved), yaml.safe_dump(now), allow=False)
    assert check_resume("a.last.ckpt", yaml.safe_dump(saved), yaml.safe_dump(now), allow=True)


@pytest.mark.slow
def test_two_fits_on_one_checkpoint_and_a_resume_with_another_memory(tmp_path, sleeper):
    ckpt = tmp_path / "a.ckpt"
    _hold(ckpt, sleeper)
    second = _cli(["fit", "-c", TINY, *SMALL, "--run.checkpoint", str(ckpt)], tmp_path)
    assert second.returncode == 2 and f"is being written by process {sleeper}" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1 and not ckpt.exists()
    lock_path(ckpt).unlink()

    first = _cli(["fit", "-c", TINY, *SMALL, "--run.checkpoint", str(ckpt), "--run.select", "val/loss:min"],
                 tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert ckpt.exists() and not lock_path(ckpt).exists()  # the lock goes with the fit
    resume = ["fit", "-c", TINY, *SMALL, "--run.checkpoint", str(ckpt), "--run.select", "val/loss:min",
              "--run.resume", "true", "--trainer.max_steps", "4"]
    other = _cli([*resume, "--model.init_args.memory.mem_len", "8"], tmp_path)
    assert other.returncode == 2, other.stderr[-2000:]
    assert "trained with model.init_args.memory.mem_len = 16, this command gives 8" in other.stderr
    assert "--run.resume_changed true" in other.stderr
    same = _cli(resume, tmp_path)  # the same settings, more steps: continues
    assert same.returncode == 0, same.stderr[-2000:]
    allowed = _cli([*resume, "--trainer.max_steps", "6", "--model.init_args.memory.mem_len", "8",
                    "--run.resume_changed", "true"], tmp_path)
    assert allowed.returncode == 0, allowed.stderr[-2000:]
