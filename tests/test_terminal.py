"""The terminal shows progress, not noise: a fit prints one progress line every `log_every_n_steps` (step/max_steps,
loss, tokens/s, ETA) — or a bar over steps when the bar is on — and one summary line per run; none of Lightning's
banner, tips, tables or library warnings. `repro --help` starts without Lightning and lists every command."""

import os
import re
import subprocess
import sys

import pytest

from repro.cli.entry import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs/transformer_xl/tiny/enwik8_12l.yaml")
SMALL = ["--model.init_args.model.n_layer", "1", "--model.init_args.model.d_model", "32",
         "--model.init_args.model.d_inner", "64", "--data.init_args.batch_size", "2", "--data.init_args.tgt_len", "16",
         "--trainer.max_steps", "4", "--trainer.log_every_n_steps", "2", "--trainer.limit_val_batches", "1",
         "--trainer.val_check_interval", "4", "--run.tracking", "none"]
NOISE = ("Tip", "litlogger", "GPU available", "TPU available", "Seed set", "┏", "│", "weights_only", "Warning",
         "deprecated", "Traceback", "INFO")


def _help(argv):
    """Runs `repro ARGV` in a fresh interpreter; returns (exit code, output, whether Lightning was imported)."""
    code = ("import sys\nfrom repro.cli.entry import main\ncode = 0\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit as e:\n    code = e.code or 0\n"
            "print('LIGHTNING' if 'lightning' in sys.modules else '')\n"
            "sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr, "LIGHTNING" in done.stdout


def test_help_lists_every_command_without_importing_lightning():
    code, out, lightning = _help(["--help"])
    assert code == 0 and not lightning
    for command in ("fit", "validate", "test", "steps", "runs", "describe", "bench", "prepare", "tables", "recl",
                    "generate", "bench-attention", "bench-context"):
        assert re.search(rf"^\s+{re.escape(command)}\b", out, re.M), command
    assert out.startswith("usage: repro ")


@pytest.mark.slow
def test_subcommand_help():
    code, out, _ = _help(["steps", "--help"])
    assert code == 0 and out.startswith("usage: repro steps")
    code, out, lightning = _help(["tables", "--help"])
    assert code == 0 and not lightning
    assert "transformer_xl" in out and "infinity_former" in out and "lamemo" in out and "mgk" in out


@pytest.mark.slow
def test_python_dash_m_says_repro():
    done = subprocess.run([sys.executable, "-m", "repro", "fit", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: repro ") and "__main__" not in done.stdout


def test_fit_prints_progress_and_one_summary_then_test_one_line(tmp_path, capfd):
    ckpt = tmp_path / "a.ckpt"
    main(["fit", "-c", TINY, *SMALL, "--run.checkpoint", str(ckpt)])
    out, err = capfd.readouterr()
    lines = [l for l in (out + err).splitlines() if l.strip()]
    assert len(lines) == 3, lines
    for line, step in zip(lines, (2, 4)):
        assert re.fullmatch(rf"fit tiny/enwik8_12l  step {step}/4  loss \d+\.\d{{3}}  \d+\.\dk tok/s  ETA \d+m\d\ds",
                            line), line
    assert re.fullmatch(r"fit tiny/enwik8_12l  train loss \S+  val loss \S+  val ppl \S+  val bpc \S+  "
                        r"\(4 steps, \S+ s\)", lines[2]), lines[2]
    main(["test", "-c", TINY, *SMALL, "--ckpt_path", str(ckpt), "--trainer.limit_test_batches", "1"])
    out, err = capfd.readouterr()
    lines = [l for l in (out + err).splitlines() if l.strip()]
    assert len(lines) == 1 and re.fullmatch(r"test tiny/enwik8_12l  loss \S+  ppl \S+  bpc \S+  \(\S+ tokens, \S+ s\)",
                                            lines[0]), lines
    assert not any(word in out + err for word in NOISE)


def test_without_a_terminal_a_config_that_leaves_the_bar_unset_prints_lines(tmp_path, capfd):
    """A paper config leaves `enable_progress_bar` unset (Lightning's bars on). Into a pipe or a job's log file
    (stderr is no terminal here, under pytest) a fit prints progress lines and a test one line: no bar redrawn
    with carriage returns, no Rich table (found running a paper config into a log)."""
    ckpt = tmp_path / "a.ckpt"
    main(["fit", "-c", TINY, *SMALL, "--trainer.enable_progress_bar", "null", "--run.checkpoint", str(ckpt)])
    out, err = capfd.readouterr()
    lines = [l for l in (out + err).splitlines() if l.strip()]
    assert "\r" not in out + err and len(lines) == 3 and lines[0].startswith("fit tiny/enwik8_12l  step 2/4"), lines
    main(["test", "-c", TINY, *SMALL, "--trainer.enable_progress_bar", "null", "--ckpt_path", str(ckpt),
          "--trainer.limit_test_batches", "1"])
    out, err = capfd.readouterr()
    lines = [l for l in (out + err).splitlines() if l.strip()]
    assert "\r" not in out + err and len(lines) == 1 and lines[0].startswith("test tiny/enwik8_12l  loss"), lines


def test_eta_reads_in_hours_from_one_hour_on():
    from repro.callbacks import eta_text

    assert [eta_text(x) for x in (0, 65.9, 3599, 3600, 162566)] == ["0m00s", "1m05s", "59m59s", "1h00m", "45h09m"]


def test_the_progress_bar_counts_steps(capfd):
    main(["fit", "-c", TINY, *SMALL, "--trainer.enable_progress_bar", "true"])
    text = "".join(capfd.readouterr())
    final = [part for part in text.replace("\r", "\n").splitlines() if part.startswith("fit tiny/enwik8_12l: 100%")]
    assert final and "4/4" in final[-1] and "loss=" in final[-1] and "tok/s=" in final[-1], text[-2000:]
    assert "Epoch 0/-2" not in text


def test_a_capped_run_counts_to_where_it_stops(capfd):
    """A rehearsal keeps the paper's `max_steps` (its learning-rate schedule) and stops after one epoch of 2 batches
    (configs/rehearsal/trainer.yaml): the line and the bar count to 2, not to the paper's 10,119 (not
    `step 5/10119 … ETA 70h31m` in a run that stopped minutes later)."""
    capped = ["-c", os.path.join(ROOT, "configs/rehearsal/trainer.yaml"), *SMALL[:10], "--trainer.max_steps", "10119",
              "--run.tracking", "none"]
    main(["fit", "-c", TINY, *capped])
    lines = [l for l in "".join(capfd.readouterr()).splitlines() if l.startswith("fit tiny/enwik8_12l  step")]
    assert [l.split("  ")[1] for l in lines] == ["step 1/2", "step 2/2"], lines
    assert re.search(r"ETA 0m0\ds$", lines[0]), lines[0]
    main(["fit", "-c", TINY, *capped, "--trainer.enable_progress_bar", "true"])
    text = "".join(capfd.readouterr())
    final = [part for part in text.replace("\r", "\n").splitlines() if part.startswith("fit tiny/enwik8_12l: 100%")]
    assert final and "2/2" in final[-1], text[-2000:]


def test_the_stop_is_the_first_of_max_steps_and_the_epochs():
    from types import SimpleNamespace

    from repro.callbacks import stop_step

    assert stop_step(SimpleNamespace(estimated_stepping_batches=2, max_steps=10119)) == 2
    assert stop_step(SimpleNamespace(estimated_stepping_batches=float("inf"), max_steps=-1)) is None

    class Varying:  # Lightning refuses the estimate when accumulation changes by epoch: the configured horizon
        max_steps = 400

        @property
        def estimated_stepping_batches(self):
            raise RuntimeError("different accumulate_grad_batches at different epochs")

    assert stop_step(Varying()) == 400


def test_ddp_runs_do_not_recommend_sync_dist_and_other_warnings_stay(monkeypatch):
    """Under DDP Lightning recommends `sync_dist=True` for every epoch-level metric logged without it (three lines a
    fit); the metrics are already summed over the ranks, so `quiet()` drops that message, and only that one."""
    import warnings

    from lightning.fabric.utilities.warnings import PossibleUserWarning

    from repro.cli.lightning_cli import quiet

    monkeypatch.delenv("REPRO_VERBOSE", raising=False)
    recommendation = ("It is recommended to use `self.log({!r}, ..., sync_dist=True)` when logging on epoch level in "
                      "distributed setting to accumulate the metric across devices.")  # Lightning's words
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        quiet()
        for name in ("val/loss", "test/acc"):
            warnings.warn(recommendation.format(name), PossibleUserWarning, stacklevel=1)
        warnings.warn("It is recommended to use a larger batch size", PossibleUserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["It is recommended to use a larger batch size"]
