"""Every user error is one line that names the problem and the fix, exits non-zero, and leaves nothing behind:
no MLflow database or run, no file in the working directory. Through the `repro` entry point, in this process
(tracking on, pointed at a database that must not appear)."""

import functools
import os
import time

import pytest
import torch

from repro.cli.entry import main
from repro.data.lm import LMDataModule

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs/transformer_xl/tiny/enwik8_12l.yaml")
LAMEMO = os.path.join(ROOT, "configs/lamemo/tiny/char_lamemo.yaml")
ARENA_LTM = os.path.join(ROOT, "configs/arena/tiny/infinity.yaml")


@pytest.fixture
def clean(tmp_path, monkeypatch):
    """Runs in an empty folder with tracking into it; after the command, asserts that nothing was created."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    yield work
    assert sorted(os.listdir(work)) == [], "a refused command created files"


def _one_line_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code not in (0, None)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and "Traceback" not in lines[0]
    return lines[0]


def _checkpoint(config, path, **extra):
    from repro.cli.cli import build

    model = build([config]).model
    torch.save({"state_dict": model.state_dict(), "repro": {"module_class": f"{type(model).__module__}."
                f"{type(model).__qualname__}", "n_token": model.n_token}, **extra}, path)


@pytest.fixture(scope="module")
def good_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "txl.ckpt"
    _checkpoint(TINY, path)
    return path


def test_missing_checkpoint(clean, capsys):
    line = _one_line_error(capsys, ["test", "-c", TINY, "--ckpt_path", "nowhere.ckpt"])
    assert "nowhere.ckpt: no such file" in line and "--run.checkpoint" in line


@pytest.mark.parametrize("damage", ["truncated", "random"])
def test_unreadable_checkpoint(clean, capsys, good_ckpt, tmp_path, damage):
    bad = tmp_path / f"{damage}.ckpt"
    data = good_ckpt.read_bytes()
    bad.write_bytes(data[: len(data) // 2] if damage == "truncated" else os.urandom(4096))
    line = _one_line_error(capsys, ["test", "-c", TINY, "--ckpt_path", str(bad)])
    assert "is not a readable checkpoint" in line and "weights_only=False" not in line


def test_checkpoint_of_another_model_is_named(clean, capsys, tmp_path):
    other = tmp_path / "lamemo.ckpt"
    _checkpoint(LAMEMO, other, repro_run={"module_class": "papers.lamemo.module.LaMemoLM", "paper": "lamemo",
                                          "experiment": "char_lamemo"})
    line = _one_line_error(capsys, ["test", "-c", TINY, "--ckpt_path", str(other)])
    assert "holds a papers.lamemo.module.LaMemoLM (paper lamemo, experiment char_lamemo)" in line
    assert "this config builds a papers.transformer_xl.module.TransformerXLLM" in line


def test_checkpoint_of_other_shapes(clean, capsys, good_ckpt):
    line = _one_line_error(capsys, ["test", "-c", TINY, "--ckpt_path", str(good_ckpt),
                                    "--model.init_args.model.n_layer", "2"])
    assert "does not fit this config's TransformerXLLM" in line and "unknown weights" in line


@pytest.mark.parametrize("override,message", [
    (["--model.init_args.model.n_layers", "3"], "unknown option --model.init_args.model.n_layers for TransformerXLLM "
                                                "(did you mean --model.init_args.model.n_layer?)"),
    (["--model.init_args.memory.mem_len", "-5"], "mem_len must be ≥ 0, got -5"),
    (["--data.init_args.corpus", "nope"], "unknown corpus 'nope'; the registry has: embedded-char"),
    (["--run.tracking", "mlfow"], "--run.tracking is one of 'mlflow', 'none', got 'mlfow'"),
    (["--trainer.max_stepz", "3"], "unknown option --trainer.max_stepz (did you mean --trainer.max_steps?)"),
    (["--run.select", "val/loss", "--run.checkpoint", "a.ckpt"],
     "--run.select takes METRIC:min or METRIC:max (e.g. val/loss:min, val/acc:max), got 'val/loss'"),
    # without --run.checkpoint a fit selects into checkpoints/<paper>/<profile>/<experiment>.ckpt
    # (tests/test_default_checkpoint.py), unless the run has no name to make that path from
    (["--run.select", "val/loss:min", "--run.experiment", ""],
     "--run.select needs a checkpoint file and this run has no paper and experiment to name one after"),
    (["--run.selct", "val/loss:min"], "unknown option --run.selct (did you mean --run.select?)"),
])
def test_bad_settings(clean, capsys, override, message):
    line = _one_line_error(capsys, ["fit", "-c", TINY, *override])
    assert message in line and "Namespace(" not in line and len(line) < 300


def test_a_settings_class_check_inside_a_union_is_named(clean, capsys):
    """`ltm` is `LTMConfig | None`: jsonargparse reports only that 0 basis functions fit neither type; the line
    gives LTMConfig's own reason, found among the error's causes."""
    sorting = os.path.join(ROOT, "configs/infinity_former/tiny/sort_512_infty.yaml")
    line = _one_line_error(capsys, ["fit", "-c", sorting, "--model.init_args.ltm.n_basis", "0"])
    assert "ltm.n_basis must be positive" in line and "Union" not in line, line


@pytest.mark.parametrize("old,new,message", [
    ("n_layer: ", "n_layers: ", "unknown option --model.init_args.model.n_layers for TransformerXLLM (did you mean "
                                "--model.init_args.model.n_layer?)"),
    ("    memory: ", "    memry: ", "unknown option --model.init_args.memry.mem_len for TransformerXLLM (did you mean "
                                    "--model.init_args.memory?)"),
    ("batch_size:", "batchsize:", "unknown option --data.init_args.batchsize for LMDataModule (did you mean "
                                  "--data.init_args.batch_size?)"),
    ("  max_steps:", "  max_stepz:", "unknown option --trainer.max_stepz (did you mean --trainer.max_steps?)"),
    ("  paper:", "  papr:", "unknown option --run.papr (did you mean --run.paper?)"),
])
@pytest.mark.parametrize("command", ["fit", "prepare"])
def test_a_misspelt_key_in_a_config_file_is_named(clean, capsys, tmp_path, old, new, message, command):
    """A config file's unknown key reads as the command line's does (jsonargparse words it differently for files:
    'Problem with given class_path', whose reason was cut off)."""
    text = open(os.path.join(ROOT, "configs/transformer_xl/tiny/wt103_base.yaml")).read()
    assert old in text
    bad = tmp_path / "typo.yaml"
    bad.write_text(text.replace(old, new, 1))
    argv = ["fit", "-c", str(bad)] if command == "fit" else ["prepare", str(bad)]
    line = _one_line_error(capsys, argv)
    assert message in line, line


def test_yaml_syntax_error_names_the_file(clean, capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("run:\n  paper: [x\nmodel: {\n")
    line = _one_line_error(capsys, ["fit", "-c", str(bad)])
    assert f"config file {bad} is not valid YAML, line 3" in line


@pytest.mark.parametrize("command", [["fit", "-c"], ["describe"], ["steps", "fit -c"], ["prepare"]])
def test_missing_config_file(clean, capsys, command):
    *head, last = command
    argv = [*head, f"{last} nope.yaml"] if command[0] == "steps" else [*command, "nope.yaml"]
    line = _one_line_error(capsys, argv)
    assert "config file nope.yaml does not exist" in line


def test_test_without_a_checkpoint_is_refused(clean, capsys):
    line = _one_line_error(capsys, ["test", "-c", TINY])
    assert "without --ckpt_path would score untrained weights" in line and "--run.untrained true" in line


def test_a_subdirectory_writes_where_the_root_does(monkeypatch, tmp_path):
    from repro import tracking
    from repro.cli import entry

    monkeypatch.chdir(os.path.join(ROOT, "papers"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.delenv("REPRO_DATA")
    tracking.repo_root.cache_clear()
    try:
        entry._at_repository_root("describe")
        assert os.environ["REPRO_DATA"] == os.path.join(ROOT, "data")
        assert tracking.tracking_uri() == f"sqlite:///{os.path.join(ROOT, 'mlflow.db')}"
        assert tracking.artifact_location() == f"file://{os.path.join(ROOT, 'mlruns')}"
    finally:
        tracking.repo_root.cache_clear()


def test_offline_pretrained_tokenizer_says_what_is_needed_at_once(monkeypatch, tmp_path):
    from repro.text.tokenizer import load_tokenizer

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    t0 = time.time()
    with pytest.raises(ValueError) as err:
        load_tokenizer({"kind": "pretrained", "name": "gpt2"})
    assert time.time() - t0 < 5  # no retries against an unreachable hub
    text = str(err.value)
    assert "'gpt2' (tokenizer.json)" in text and "HF_HOME" in text and "HF_ENDPOINT" in text


def test_an_unreachable_hub_is_detected_and_set_offline(monkeypatch):
    from repro.data import hf_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    t0 = time.time()
    assert hf_hub.hub_offline(timeout=1.0)
    assert os.environ["HF_HUB_OFFLINE"] == "1" and time.time() - t0 < 3


def test_an_evaluation_that_scores_nothing_says_what_to_change(tmp_path, monkeypatch, capsys):
    """Sorting scores only the answer at each sequence's end (8 segments of 64 here): a validation limited to one
    batch scores no token. One line naming the setting, and no library warning before it."""
    import warnings

    monkeypatch.chdir(tmp_path)
    config = os.path.join(ROOT, "configs/infinity_former/tiny/sort_512_infty.yaml")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _one_line_error(capsys, ["fit", "-c", config, "--trainer.max_steps", "1", "--trainer.limit_val_batches",
                                        "1", "--trainer.val_check_interval", "1", "--run.tracking", "none"])
    assert "scored no token" in line and "--trainer.limit_val_batches" in line
    assert not [w for w in caught if "update" in str(w.message)], [str(w.message) for w in caught]


def test_a_batch_chunk_that_does_not_divide_the_batch_is_refused(clean, capsys):
    line = _one_line_error(capsys, ["fit", "-c", TINY, "--model.init_args.model.n_layer", "2",
                                    "--model.init_args.model.d_model", "32", "--model.init_args.model.n_head", "2",
                                    "--model.init_args.model.d_head", "16", "--model.init_args.model.d_inner", "64",
                                    "--data.init_args.batch_size", "4", "--trainer.max_steps", "1",
                                    "--run.batch_chunk", "3"])
    assert line.startswith("error: --run.batch_chunk 3 does not divide the batch of 4 streams")


def test_layer_checkpointing_of_a_model_with_memory_mechanisms_is_refused(clean, capsys):
    line = _one_line_error(capsys, ["fit", "-c", LAMEMO, "--trainer.max_steps", "1", "--run.checkpoint_layers",
                                    "true"])
    assert line.startswith("error: --run.checkpoint_layers: LaMemo does not checkpoint its layers")


@pytest.mark.parametrize("old,new,message", [
    ("- name: ltm", "- name: ltmm", "model.init_args.mechanisms[0].name: unknown memory mechanism 'ltmm': known are"),
    ("      n_basis: 32", "      n_basiss: 32", "model.init_args.mechanisms[0].n_basiss: ltm has no option 'n_basiss'"),
    ("      n_basis: 32", "      n_basis: many", "model.init_args.mechanisms[0].n_basis: ltm takes int, got 'many'"),
    ("      n_basis: 32", "      n_basis: 0", "model.init_args.mechanisms[0]: ltm.n_basis must be positive"),
])
def test_a_wrong_memory_mechanism_is_named_by_its_config_key(clean, capsys, tmp_path, monkeypatch, old, new, message):
    """The mechanisms' settings are checked with the config, before the data module or the model is built."""
    text = open(ARENA_LTM).read()
    assert old in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace(old, new, 1))
    built, init = [], LMDataModule.__init__

    @functools.wraps(init)
    def counted(self, *args, **kwargs):
        built.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(LMDataModule, "__init__", counted)
    line = _one_line_error(capsys, ["fit", "-c", str(bad)])
    assert message in line, line
    assert not built
