"""`repro.callbacks.RankSeeds`: under DDP each rank draws its own dropout masks from seed + rank, as LaMemo's
`train_ddp.py` seeds `torch.manual_seed(args.seed + rank)`; nothing changes in one process or in a resumed fit, and
a stream rotation without its own seed stays the same on every rank. The hooks are called as the Trainer calls them
(setup of the fit, then the start of training), with the trainer's rank, world size and step."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from repro.callbacks import RankSeeds
from repro.nn.dropout import dropout

SEED = 1111


def _first_mask(rank: int, world: int, step: int = 0, dm=None) -> tuple[torch.Tensor, int, float]:
    """The first dropout mask a rank draws after the callback's hooks, its torch seed and numpy's first draw."""
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    trainer = SimpleNamespace(world_size=world, global_rank=rank, global_step=step, datamodule=dm)
    cb = RankSeeds()
    cb.setup(trainer, None, "fit")
    cb.on_train_start(trainer, None)
    mask = dropout(torch.ones(4, 64), 0.5, True) != 0
    return mask, torch.initial_seed(), float(np.random.rand())


def _plain_mask() -> torch.Tensor:
    torch.manual_seed(SEED)
    return dropout(torch.ones(4, 64), 0.5, True) != 0


def test_ranks_draw_the_masks_of_seed_plus_rank():
    masks = {}
    for rank in (0, 1):
        masks[rank], seed, draw = _first_mask(rank, world=2)
        assert seed == SEED + rank
        torch.manual_seed(SEED + rank)  # the reference's seeding of that rank
        assert torch.equal(masks[rank], dropout(torch.ones(4, 64), 0.5, True) != 0)
        np.random.seed(SEED + rank)
        assert draw == float(np.random.rand())
    assert not torch.equal(masks[0], masks[1])  # 256 units at p = 0.5: equal masks by chance have p = 2^-256


@pytest.mark.parametrize("world, step", [(1, 0), (2, 7)])
def test_one_process_or_a_resumed_fit_keeps_its_generators(world, step):
    mask, seed, _ = _first_mask(1, world=world, step=step)
    assert seed == SEED and torch.equal(mask, _plain_mask())


def test_a_rotation_without_its_own_seed_is_pinned_to_the_runs_seed():
    dm = SimpleNamespace(roll=True, roll_seed=None)
    _first_mask(1, world=2, dm=dm)
    assert dm.roll_seed == SEED  # not seed + rank: every rank rotates the streams alike
    own = SimpleNamespace(roll=True, roll_seed=5)
    _first_mask(1, world=2, dm=own)
    assert own.roll_seed == 5


def test_lamemos_paper_training_configs_seed_each_rank_and_no_other_config_does(root):
    with_it = set()
    for path in sorted((root / "configs").rglob("*.yaml")):
        callbacks = ((yaml.safe_load(path.read_text()) or {}).get("trainer") or {}).get("callbacks") or []
        if any(c.get("class_path") == "repro.callbacks.RankSeeds" for c in callbacks):
            with_it.add(path.relative_to(root).as_posix())
    # the arena's paper configs take LaMemo's training protocol (thu-coai/LaMemo train_ddp.py) whole, at enwik8 and
    # at WikiText-103
    arena = {p.relative_to(root).as_posix() for p in (root / "configs/arena/paper").glob("*.yaml")}
    assert arena and with_it == {f"configs/lamemo/paper/{c}_{m}.yaml" for c in ("wt103", "enwik8", "text8")
                                 for m in ("lamemo", "txl")} | arena


PROBE = '''
import json, os
import torch
from lightning.pytorch import Callback

class Probe(Callback):
    """Each rank's seed and first dropout mask of its first step (after RankSeeds, which comes first in the list)."""
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 0 and batch_idx == 0:
            state = torch.get_rng_state()
            mask = (torch.rand(256) < 0.5).tolist()
            torch.set_rng_state(state)
            path = os.path.join(os.environ["PROBE_DIR"], f"rank{trainer.global_rank}.json")
            with open(path, "w") as f:
                json.dump({"seed": torch.initial_seed(), "mask": mask}, f)
'''


@pytest.mark.slow
@pytest.mark.parametrize("rank_seeds", [True, False])
def test_two_ddp_processes_draw_their_own_masks_only_with_rank_seeds(root, tmp_path, rank_seeds):
    """A 2-process DDP fit through `repro fit` (gloo on the CPU, the tiny LaMemo config): with the callback the
    ranks start training from seeds 1111 and 1112 and draw different masks; without it, the same seed and masks."""
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "probe.py").write_text(PROBE)
    callbacks = ["--trainer.callbacks+=repro.callbacks.RankSeeds"] if rank_seeds else []
    args = ["fit", "-c", "configs/lamemo/tiny/char_lamemo.yaml", "--run.tracking", "none", "--seed_everything",
            str(SEED), "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp",
            "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0", *callbacks,
            "--trainer.callbacks+=probe.Probe"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tmp_path),
           "PROBE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "repro", *args], cwd=root, capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    if rank_seeds:
        assert [r["seed"] for r in ranks] == [SEED, SEED + 1] and ranks[0]["mask"] != ranks[1]["mask"]
    else:
        assert [r["seed"] for r in ranks] == [SEED, SEED] and ranks[0]["mask"] == ranks[1]["mask"]
