"""Training through Lightning: resume with memory, DDP equivalence, the CLI entry point and its errors."""

import json
import os
import subprocess
import sys

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from papers.transformer_xl.model import TransformerXLConfig
from papers.transformer_xl.module import TransformerXLLM
from repro.cli.entry import main
from repro.data.lm import LMDataModule

TINY = "configs/transformer_xl/tiny/enwik8_12l.yaml"


class LossRecorder(Callback):
    def __init__(self):
        self.losses = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses[trainer.global_step] = float(outputs["loss"])


class Killed(Exception):
    pass


class CrashAt(Callback):
    """Dies in the middle of a step, as a killed job would: no teardown, no final checkpoint."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step >= self.step:
            raise Killed


def _run(tmp_path, *, crash_at=None, ckpt_path=None, roll=False):
    L.seed_everything(7)
    dm = LMDataModule("embedded-char", batch_size=4, tgt_len=16, roll=roll)
    cfg = TransformerXLConfig(n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, dropout=0.2, dropatt=0.1)
    module = TransformerXLLM(cfg, memory={"mem_len": 16}, optim={"lr": 3e-3, "warmup_steps": 2}, n_token=dm.vocab_size)
    rec = LossRecorder()
    callbacks = [rec, ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=5, save_top_k=-1)]
    if crash_at:
        callbacks.append(CrashAt(crash_at))
    trainer = L.Trainer(max_steps=10, logger=False, callbacks=callbacks, enable_progress_bar=False,
                        limit_val_batches=0, use_distributed_sampler=False, gradient_clip_val=0.25,
                        enable_model_summary=False, accelerator="cpu")
    try:
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    except Killed:
        assert crash_at
    return rec.losses, module


@pytest.mark.slow
def test_killed_run_resumes_with_its_memory_and_the_same_trajectory(tmp_path):
    straight, _ = _run(tmp_path / "a")
    stopped, module = _run(tmp_path / "b", crash_at=7)  # checkpoint at step 5, killed during step 8
    assert max(stopped) == 7 and module._mems["train"][0].shape[1] == 16
    ckpt = tmp_path / "b" / "epoch=0-step=5.ckpt"
    state = torch.load(ckpt, weights_only=True)  # checkpoints are plain tensors and values
    assert state["repro"]["train_memory"][0].shape == (4, 16, 32)
    resumed, _ = _run(tmp_path / "c", ckpt_path=ckpt)
    assert sorted(resumed) == list(range(6, 11))
    for step in range(6, 11):
        assert resumed[step] == pytest.approx(straight[step], rel=1e-6), step


@pytest.mark.slow
def test_resume_without_the_memory_would_differ(tmp_path):
    """The trajectory test above has power: dropping the restored memory changes the next loss."""
    straight, _ = _run(tmp_path / "a")
    _run(tmp_path / "b", crash_at=7)
    ckpt = tmp_path / "b" / "epoch=0-step=5.ckpt"
    state = torch.load(ckpt, weights_only=True)
    state["repro"]["train_memory"] = None
    torch.save(state, tmp_path / "nomem.ckpt")
    resumed, _ = _run(tmp_path / "c", ckpt_path=tmp_path / "nomem.ckpt")
    assert resumed[6] != pytest.approx(straight[6], rel=1e-6)


@pytest.mark.slow
def test_a_rolled_run_resumes_on_the_same_rotated_streams(tmp_path):
    """LaMemo's `--roll` (`data.roll`): the streams' rotation comes back with the checkpoint, so the resumed run
    continues the straight one; the rotation itself changes the trajectory (the test has power)."""
    straight, _ = _run(tmp_path / "a", roll=True)
    plain, _ = _run(tmp_path / "p")
    assert straight[1] != pytest.approx(plain[1], rel=1e-6)
    _run(tmp_path / "b", crash_at=7, roll=True)
    resumed, _ = _run(tmp_path / "c", ckpt_path=tmp_path / "b" / "epoch=0-step=5.ckpt", roll=True)
    assert sorted(resumed) == list(range(6, 11))
    for step in range(6, 11):
        assert resumed[step] == pytest.approx(straight[step], rel=1e-6), step


def _cli(args, cwd):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "repro", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_two_ddp_processes_give_the_evaluation_nll_of_one(root, tmp_path):
    common = ["validate", "-c", TINY, "--run.tracking", "none", "--run.untrained", "true",
              "--trainer.precision", "32-true", "--trainer.limit_val_batches", "12", "--trainer.accelerator", "cpu"]
    one = _cli([*common, "--run.record", str(tmp_path / "one.json")], root)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _cli([*common, "--trainer.devices", "2", "--trainer.strategy", "ddp",
                "--run.record", str(tmp_path / "two.json")], root)
    assert two.returncode == 0, two.stderr[-3000:]
    a = json.loads((tmp_path / "one.json").read_text())["metrics"]
    b = json.loads((tmp_path / "two.json").read_text())["metrics"]
    assert a["val/tokens"] == b["val/tokens"] == 10 * 12 * 64
    assert b["val/loss"] == pytest.approx(a["val/loss"], rel=1e-5)


@pytest.mark.slow
def test_fit_then_test_through_the_entry_point_and_vocabulary_check(root, tmp_path):
    ckpt = tmp_path / "tiny.ckpt"
    fit = _cli(["fit", "-c", TINY, "--trainer.max_steps", "3", "--trainer.limit_val_batches", "2",
                "--run.tracking", "none", "--run.checkpoint", str(ckpt), "--run.record", str(tmp_path / "fit.json")],
               root)
    assert fit.returncode == 0, fit.stderr[-3000:]
    record = json.loads((tmp_path / "fit.json").read_text())
    assert record["provenance"]["steps"] == 3 and record["provenance"]["tokens_seen"] == 3 * 16 * 64
    test = _cli(["test", "-c", TINY, "-c", TINY.replace(".yaml", ".eval.yaml"), "--ckpt_path", str(ckpt),
                 "--trainer.limit_test_batches", "3", "--run.tracking", "none",
                 "--run.record", str(tmp_path / "test.json")], root)
    assert test.returncode == 0, test.stderr[-3000:]
    assert json.loads((tmp_path / "test.json").read_text())["metrics"]["test/bpc"] > 0
    wrong = _cli(["test", "-c", TINY, "--ckpt_path", str(ckpt), "--data.init_args.corpus", "embedded-text8",
                  "--trainer.limit_test_batches", "1", "--run.tracking", "none"], root)
    assert wrong.returncode != 0
    assert "evaluate it on the corpus it was trained on" in wrong.stderr


def test_unknown_config_key_is_an_error(root, capsys):
    with pytest.raises(SystemExit):
        main(["fit", "-c", str(root / TINY), "--model.init_args.model.n_layers", "3", "--run.tracking", "none"])
    assert "n_layers" in capsys.readouterr().err


@pytest.mark.parametrize("override,message", [
    (["--model.init_args.memory", "{mem_len: -4}"], "mem_len must be ≥ 0"),
    (["--model.init_args.eval_protocol", "{kind: sliding, window: 8}"], "evaluates without memory"),
    (["--model.init_args.model.dropout", "1.5"], "dropout"),
])
def test_impossible_settings_are_refused(root, override, message, capsys):
    with pytest.raises((SystemExit, ValueError)) as err:
        main(["fit", "-c", str(root / TINY), *override, "--run.tracking", "none"])
    text = str(err.value) + capsys.readouterr().err
    assert message in text


class _NoMemory(torch.nn.Module):
    supports_memory = False

    def forward(self, tokens, mems, *, mem_len, clamp_len=-1, same_length=False):
        return torch.zeros(*tokens.shape, 4), []

    def nll(self, hidden, target):
        return hidden.sum(-1)


def test_memory_lengths_for_a_model_without_memory_are_refused():
    from repro.lm import SegmentLM

    class NoMemoryLM(SegmentLM):
        def build_model(self):
            return _NoMemory()

    kwargs = dict(n_token=10, eval_memory=None, optim={}, eval_protocol={})
    NoMemoryLM(memory={"mem_len": 0}, **kwargs)
    with pytest.raises(ValueError, match="keeps no memory.*set it to 0"):
        NoMemoryLM(memory={"mem_len": 16}, **kwargs)


def test_missing_paper_corpus_offline_says_where_to_put_it(root, tmp_path, monkeypatch, capsys):
    from repro.data import sources

    monkeypatch.setenv("REPRO_DATA", str(tmp_path))
    monkeypatch.setattr(sources, "TEXT8_URLS", ("http://127.0.0.1:9/text8.zip",))  # nothing listens there
    with pytest.raises(SystemExit) as err:
        main(["prepare", str(root / "configs/transformer_xl/paper/text8_24l.yaml")])
    assert err.value.code == 2
    text = capsys.readouterr().err
    assert "http://127.0.0.1:9/text8.zip" in text and str(tmp_path / "raw" / "text8" / "text8.zip") in text
    assert "Traceback" not in text and not list(tmp_path.rglob("*.pt"))  # nothing half-built


@pytest.mark.slow
def test_steps_run_fit_then_test_in_one_process_as_separate_commands_would(root, tmp_path, monkeypatch):
    monkeypatch.chdir(root)
    ckpt, eval_cfg = tmp_path / "s.ckpt", TINY.replace(".yaml", ".eval.yaml")
    common = "--run.tracking none --trainer.accelerator cpu"
    main(["steps",
          f"fit -c {TINY} --trainer.max_steps 3 --trainer.limit_val_batches 2 {common} --run.checkpoint {ckpt} "
          f"--run.record {tmp_path / 'fit.json'}",
          f"test -c {TINY} -c {eval_cfg} --ckpt_path {ckpt} --trainer.limit_test_batches 2 {common} "
          f"--run.record {tmp_path / 'steps.json'}"])
    assert json.loads((tmp_path / "fit.json").read_text())["provenance"]["steps"] == 3
    main(["test", "-c", TINY, "-c", eval_cfg, "--ckpt_path", str(ckpt), "--trainer.limit_test_batches", "2",
          *common.split(), "--run.record", str(tmp_path / "alone.json")])
    steps = json.loads((tmp_path / "steps.json").read_text())["metrics"]
    alone = json.loads((tmp_path / "alone.json").read_text())["metrics"]
    assert steps == alone and steps["test/tokens"] == 2 * 10 * 32


def test_steps_check_every_step_before_running_any(capsys):
    with pytest.raises(SystemExit):
        main(["steps", "fit -c nowhere.yaml", "tables transformer_xl"])
    assert "each step of `repro steps` starts with one of" in capsys.readouterr().err


def test_run_callbacks_join_the_configured_ones(root, tmp_path, monkeypatch):
    """`--run.curves` (which `repro runs` always passes) once replaced `--trainer.callbacks`: a user's
    EarlyStopping or ModelCheckpoint silently disappeared. Ours are added to the configured ones."""
    from repro.cli.lightning_cli import ReproCLI

    seen = {}
    monkeypatch.setattr(ReproCLI, "_run_subcommand",
                        lambda self, sub: seen.update(names=[type(c).__name__ for c in self.trainer.callbacks],
                                                      root=self.trainer.default_root_dir))
    ReproCLI(args=["fit", "-c", str(root / TINY), "--run.tracking", "none", "--run.curves", str(tmp_path / "c.csv"),
                   "--run.checkpoint", str(tmp_path / "ck" / "a.ckpt"),
                   "--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "val/loss"])
    for name in ("EarlyStopping", "CurveRecorder", "LastCheckpoint", "Provenance", "ProgressLine"):
        assert name in seen["names"], (name, seen["names"])
    # a user's ModelCheckpoint without a dirpath writes beside the run's checkpoint, not in the working directory
    assert seen["root"] == str(tmp_path / "ck")


def test_prepare_of_a_profile_folder_skips_the_claims_file(root, tmp_path, monkeypatch):
    """`repro prepare configs/<paper>/small` (the data stage of the small profile) reads the experiment configs of
    the folder, not its pre-registered claims.yaml (which is no Lightning config)."""
    import json

    monkeypatch.setenv("REPRO_DATA", str(tmp_path / "data"))
    folder = tmp_path / "cfgs"
    folder.mkdir()
    (folder / "claims.yaml").write_text((root / "configs/lamemo/small/claims.yaml").read_text())
    manifest = tmp_path / "data.json"
    main(["prepare", str(folder), "--manifest", str(manifest)])
    assert json.loads(manifest.read_text()) == {} or "claims" not in manifest.read_text()


def test_prepare_manifest_is_the_same_for_a_rebuilt_cache(root, tmp_path, monkeypatch):
    """The data stage's manifest (a dependency of every run stage) says what was built, not how long it took: a
    cache rebuilt with the same contents leaves it byte for byte, so DVC retrains nothing."""
    import shutil

    monkeypatch.setenv("REPRO_DATA", str(tmp_path / "data"))
    folder = tmp_path / "cfgs"
    folder.mkdir()
    (folder / "a.yaml").write_text((root / TINY).read_text())
    texts = []
    for _ in range(2):
        main(["prepare", str(folder), "--manifest", str(tmp_path / "data.json")])
        texts.append((tmp_path / "data.json").read_text())
        shutil.rmtree(tmp_path / "data" / "cache")
    assert texts[0] == texts[1] and "sha256" in texts[0] and "build_seconds" not in texts[0]


@pytest.mark.parametrize("config", ["configs/transformer_xl/paper/lm1b_large.yaml",
                                    "configs/mgk/paper/lra_listops.yaml",
                                    "configs/infinity_former/paper/sort_4000_infty.yaml",
                                    "configs/infinity_former/paper/sort_4000_infty.yaml,"
                                    "configs/rehearsal/SortingDataModule.yaml",  # with the rehearsal's data sizes
                                    "configs/infinity_former/paper/gpt2_wt103_inftyformer.yaml",
                                    "configs/infinity_former/paper/gpt2_dog_inftyformer.yaml"])
def test_prepare_builds_the_data_module_of_the_fit_without_its_model(root, tmp_path, monkeypatch, config):
    """`repro prepare` instantiates a config's data module alone (the eleven Transformer-XL paper models took 64 s
    to build there, 0.8B parameters for lm1b_large): the same class and the same settings as the data module of
    `repro fit`'s parse (built here with its model on the meta device), and no model built."""
    import dataclasses

    import lightning.pytorch as pl

    from repro.cli.cli import build
    from repro.cli.commands import data_module

    monkeypatch.setenv("REPRO_DATA", str(tmp_path / "data"))
    built = []
    monkeypatch.setattr(pl.LightningModule, "__init__", lambda self, *a, **k: built.append(self) or None)
    configs = [str(root / c) for c in config.split(",")]
    dm = data_module(configs)
    assert built == []
    monkeypatch.undo()
    monkeypatch.setenv("REPRO_DATA", str(tmp_path / "data"))
    ref = build(configs, meta=True).datamodule

    def plain(m):  # the settings: plain values and dataclasses (the sorting task's SortingSpec holds its sizes)
        return {k: v for k, v in vars(m).items() if dataclasses.is_dataclass(v) and not isinstance(v, type)
                or isinstance(v, (int, float, str, bool, type(None), tuple, list, dict))}

    assert type(dm) is type(ref) and plain(dm) == plain(ref) and len(plain(dm)) >= 5
    if len(configs) > 1:  # the override reached the data module
        assert dm.spec.n_train == 4 and dm.spec.length == 4000
