"""Training on several machines (docs/multinode.md): the documented torchrun and SLURM command lines dry-run as
written, and 2 nodes × 1 process through torchrun on the loopback interface (gloo) give the validation losses of
1 node × 2 processes and of one process with the same global batch: streams sharded by global rank across nodes,
data prepared once per node in that node's own folder, one checkpoint written."""

import csv
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from repro.cli.entry import main

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs/multinode.md"
TINY = str(ROOT / "configs/transformer_xl/tiny/enwik8_12l.yaml")
SMALL = ["--model.init_args.model.n_layer", "1", "--model.init_args.model.d_model", "32",
         "--model.init_args.model.n_head", "2", "--model.init_args.model.d_head", "16",
         "--model.init_args.model.d_inner", "64", "--model.init_args.memory.mem_len", "16",
         "--data.init_args.tgt_len", "16", "--trainer.max_steps", "4", "--trainer.val_check_interval", "2",
         "--trainer.limit_val_batches", "2", "--trainer.precision", "32-true", "--run.tracking", "none",
         "--trainer.accelerator", "cpu"]


def documented_fits() -> dict[str, list[str]]:
    """The `repro fit` arguments of the torchrun line (after `-m repro`) and of the SLURM script (`srun repro`)."""
    text = DOC.read_text()
    (torchrun,) = re.findall(r"^torchrun .*$", text, flags=re.M)
    (srun,) = re.findall(r"^srun repro .*$", text, flags=re.M)
    t = shlex.split(torchrun)
    return {"torchrun": t[t.index("-m") + 2:], "slurm": shlex.split(srun)[2:]}


@pytest.mark.parametrize("launcher", ["torchrun", "slurm"])
def test_the_documented_command_dry_runs(launcher, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr("sys.argv", ["repro"])
    args = documented_fits()[launcher]
    args = [a.replace("/shared/", f"{tmp_path}/") for a in args]
    main([*args, "--run.dry_run", "true"])
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("dry run: ")]
    assert line.startswith("dry run: fit paper/wt103_large") and "×8, ddp" in line, line
    assert not list(tmp_path.iterdir())


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _valid(curve: Path) -> list[float]:
    return [float(r["loss"]) for r in csv.DictReader(curve.open()) if r["split"] == "valid"]


@pytest.mark.slow
def test_two_nodes_give_the_losses_of_one_node_and_of_one_process(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("REPRO_DATA", None)

    def torchrun(nnodes: int, nproc: int, name: str) -> Path:
        port, procs, curve = _port(), [], tmp_path / f"{name}.csv"
        for rank in range(nnodes):
            node = tmp_path / name / f"node{rank}"  # each node's own folder: its own data cache
            node.mkdir(parents=True)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node-rank", str(rank),
                   "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(port),
                   "-m", "repro", "fit", "-c", TINY, *SMALL, "--data.init_args.batch_size", "4",
                   "--trainer.num_nodes", str(nnodes), "--trainer.devices", str(nproc), "--trainer.strategy", "ddp",
                   "--run.curves", str(curve), "--run.checkpoint", str(tmp_path / name / "ckpt" / "a.ckpt")]
            procs.append(subprocess.Popen(cmd, cwd=node, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        outs = [p.communicate(timeout=900)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outs)
        return curve

    two_nodes = torchrun(2, 1, "nodes")
    one_node = torchrun(1, 2, "ranks")
    single = tmp_path / "single.csv"
    done = subprocess.run([sys.executable, "-m", "repro", "fit", "-c", TINY, *SMALL, "--data.init_args.batch_size",
                           "8", "--run.curves", str(single)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(_valid(two_nodes)) == 2
    assert _valid(two_nodes) == pytest.approx(_valid(one_node), rel=1e-5)
    assert _valid(two_nodes) == pytest.approx(_valid(single), rel=1e-4)
    for n in range(2):  # each node built its data in its own folder
        assert any((tmp_path / "nodes" / f"node{n}" / "data").rglob("*"))
    written = sorted(p.name for p in (tmp_path / "nodes" / "ckpt").iterdir())
    assert written == ["a.ckpt"]  # one checkpoint (the final one replaces a.last.ckpt), no lock left
