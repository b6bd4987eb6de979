"""The Lightning CLI of `repro` (`repro.cli.entry` routes these commands here), and configs built into objects.

    repro fit|validate|test -c CONFIG [-c OVERRIDE ...] [--trainer.devices N --trainer.strategy ddp ...]
    repro steps "fit -c CONFIG ..." "test -c CONFIG -c EVAL ... --ckpt_path ..."   (several runs, one process)
    repro fit -c CONFIG ... --run.dry_run true   (build the config's objects, say what would run, run nothing)

`build` (a config's module and data module, untrained) and `load_module` (with a checkpoint's weights, for
evaluation outside a Trainer) serve the other commands (`repro.cli.commands`, `repro.cli.bench`, …), which hand
the objects to the library (`repro.ops.bench`, `repro.context`, `repro.generate`); nothing below `repro.cli` imports
this module.

The Lightning CLI (jsonargparse): a config names its LightningModule and LightningDataModule by
class path, unknown keys are errors, and every Trainer flag works. The conventions that tie the parts together:
a data module exposes `vocab_size` and a module accepts `n_token`, which the CLI links; a config's `run:` section
names its paper, experiment and profile, and where to record its results.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

from repro.callbacks import (
    BestCheckpoint,
    CurveRecorder,
    LastCheckpoint,
    MmapCheckpointIO,
    ProgressLine,
    Provenance,
    best_path,
    last_path,
    parse_select,
    save_checkpoint,
    step_progress_bar,
)
from repro.tracking import hardware, tracking_uri

LIGHTNING_SUBCOMMANDS = ("fit", "validate", "test", "predict")
SEED = 1111  # the reference's default seed


def quiet() -> None:
    """Silence what a user cannot act on: Lightning's start-up block (seed, GPU/TPU availability, advertising
    tips), MLflow's database set-up notes, and warnings about library internals (deprecations inside Lightning
    and torch, a model summary's precision). The run's own lines — progress, one summary per run, errors — stay.
    REPRO_VERBOSE=1 keeps everything."""
    import logging
    import warnings

    if os.environ.get("REPRO_VERBOSE"):
        return
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # read when mlflow is imported (it sets its own level)
    for name in ("lightning.pytorch", "lightning.fabric", "lightning", "mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("lightning.pytorch.loggers.mlflow").setLevel(logging.ERROR)  # "Experiment … Creating it."
    for category in (DeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category)
    for message in (r".*isinstance\(treespec, LeafSpec\).*", r".*is not supported by the model summary.*",
                    r".*args parameter is intended to run from within Python.*", r".*weights_only.*",
                    r".*does not have many workers.*", r".*Checkpoint directory .* exists and is not empty.*",
                    r".*Found .* module\(s\) in eval mode.*", r".*The number of training batches.*",
                    r".*callbacks used to create the checkpoint need to be provided.*"):
        warnings.filterwarnings("ignore", message=message)


quiet()


def plot_curves(csv_path: str) -> Path | None:
    """The loss curves of a fit as a PNG beside its CSV."""
    import csv

    rows = list(csv.DictReader(open(csv_path)))
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for split in ("train", "valid"):
        pts = [(int(r["step"]), float(r["loss"])) for r in rows if r["split"] == split]
        if pts:
            ax.plot(*zip(*pts), "o-" if split == "valid" else "-", label=split, ms=4)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(csv_path).with_suffix(".png")
    from repro.io import atomic_path

    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return out


class _OwnProcess(Exception):
    """A step of `repro steps` that needs its own process (several DDP ranks)."""


class ReproCLI(LightningCLI):
    _in_steps = False  # set by `run_steps`
    # `run_steps(quiet=True)`: the runs' summary lines are collected here instead of printed, and progress lines
    # come at most every two minutes (a pipeline's log shows one line per experiment, and progress only for long fits)
    summaries: list[str] | None = None

    def __init__(self, args=None, run: bool = True, **kwargs):
        self._t0 = time.time()
        self._ckpt_info: dict[str, Any] | None = None
        self._select: BestCheckpoint | None = None
        self._default_ckpt: tuple[str, Path] | None = None  # (the flag that asked for it, the path)
        super().__init__(
            LightningModule,
            LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            # LightningCLI's config-saving callback fails with a sqlite tracking URI: the resolved config is logged
            # to MLflow as an artifact instead (see `_start_tracking`).
            save_config_callback=None,
            # Segments must reach each rank in order: the automatic distributed sampler would scramble them.
            # No model summary table (`repro describe` gives the parameters): a box of ~20 lines per run.
            trainer_defaults={"use_distributed_sampler": False, "logger": False, "enable_model_summary": False},
            seed_everything_default=SEED,
            # The config, not the checkpoint's hyper-parameters, decides the run: an evaluation config must be
            # able to change the evaluation lengths of a trained model. The weights come from --ckpt_path.
            load_from_checkpoint_support=False,
            # errors raise (and `main` prints them in one line) instead of printing the whole usage first
            parser_kwargs={"exit_on_error": False, "prog": "repro",
                           **{sub: {"exit_on_error": False} for sub in LIGHTNING_SUBCOMMANDS}},
            args=args,
            run=run,
            **kwargs,
        )

    def _parse_ckpt_path(self) -> None:
        """LightningCLI would overwrite the config's model with the checkpoint's hyper-parameters; here the config
        decides (an evaluation config changes evaluation lengths) and the checkpoint supplies the weights. A
        checkpoint of another architecture or vocabulary fails to load with a message saying so."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--run.paper", type=str, default="", help="paper folder name (papers/<paper>)")
        parser.add_argument("--run.experiment", type=str, default="", help="experiment name within the paper")
        parser.add_argument("--run.profile", type=str, default="", help="tiny | paper")
        parser.add_argument("--run.rehearsal", type=bool, default=False,
                            help="a rehearsal of the paper profile (configs/rehearsal/): recorded as such, and its "
                                 "table cells are labelled 'rehearsal'")
        parser.add_argument("--run.record", type=str | None, default=None,
                            help="write this run's metrics and provenance to this JSON file")
        parser.add_argument("--run.checkpoint", type=str | None, default=None,
                            help="fit: save the final checkpoint here (atomically; with --run.select, the selected one); "
                                 "with --run.select or --run.resume and no PATH: "
                                 "checkpoints/<paper>/<profile>/<experiment>.ckpt (profile 'rehearsal' in a rehearsal)")
        parser.add_argument("--run.select", type=str | None, default=None,
                            help="fit: model selection as the authors' scripts, METRIC:min|max (e.g. val/loss:min): "
                                 "the checkpoint of the best validation becomes --run.checkpoint, the final state "
                                 "stays in A.last.ckpt (other subcommands ignore it)")
        parser.add_argument("--run.curves", type=str | None, default=None,
                            help="fit: write the training and validation curves to this CSV (a DVC plot)")
        parser.add_argument("--run.tracking", type=Literal["mlflow", "none"], default="mlflow",
                            help="mlflow: an MLflow run in mlflow.db at the repository root; none: no run")
        parser.add_argument("--run.last_every_steps", type=int, default=100,
                            help="fit with --run.checkpoint A.ckpt: write A.last.ckpt every N optimiser steps "
                                 "(0: off), and on Ctrl-C/SIGTERM")
        parser.add_argument("--run.last_every_minutes", type=float, default=10.0,
                            help="fit: also write A.last.ckpt every M minutes (0: off)")
        parser.add_argument("--run.resume", type=bool, default=False,
                            help="fit: continue from A.last.ckpt when it exists (the command of an interrupted fit, "
                                 "plus this flag)")
        parser.add_argument("--run.dry_run", type=bool, default=False,
                            help="check this command line without running it: parse it, build the model (on the meta "
                                 "device: no memory, no initialisation), the data module and the Trainer, print one "
                                 "line saying what would run, and stop (no data, no checkpoint, no MLflow run)")
        parser.add_argument("--run.compile", type=bool | Literal["cudagraphs"], default=False,
                            help="compile the model's layers (SegmentLM.compile_model): true: torch.compile's default "
                                 "mode; cudagraphs: its reduce-overhead mode, training steps replayed as CUDA graphs "
                                 "(on a GPU; evaluation runs eager). Same numbers to rounding (tests/test_compile.py)")
        parser.add_argument("--run.attention", type=Literal["auto", "eager", "sdpa"], default="auto",
                            help="attention kernel (repro.nn.attention): auto = sdpa (fused) on a GPU, eager on a CPU")
        parser.add_argument("--run.untrained", type=bool, default=False,
                            help="validate|test: allow a run without --ckpt_path (scores freshly initialised weights)")
        parser.link_arguments("data.vocab_size", "model.init_args.n_token", apply_on="instantiate")

    def _prepare_subcommand_parser(self, klass, subcommand: str, **kwargs):
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        # the Trainer method's own arguments exist only now (after `add_arguments_to_parser`)
        defaults = {"weights_only": True,  # --ckpt_path loads tensors and plain containers only
                    "verbose": False}  # no box-drawn metrics table: `_record` prints one summary line
        parser.set_defaults({k: v for k, v in defaults.items() if k in self._subcommand_method_arguments[subcommand]})
        return parser

    def _run_cfg(self) -> dict[str, Any]:
        cfg = self.config.get(str(self.subcommand), self.config)
        return dict(cfg.get("run", {}) or {})

    def _name(self) -> str:
        run = self._run_cfg()
        return "/".join(x for x in (run.get("profile"), run.get("experiment")) if x) or "run"

    def _resume_command(self, last: Path) -> str:
        import shlex

        args = [a for a in sys.argv[1:]] if sys.argv[1:] else []
        if "--run.resume" not in " ".join(args):
            args += ["--run.resume", "true"]
        return "repro " + shlex.join(args) if args else f"repro fit … --ckpt_path {last}"

    def _dry_run(self) -> bool:
        return bool(self.subcommand is not None and self._run_cfg().get("dry_run"))

    def instantiate_classes(self) -> None:
        # a dry run builds the model as `build(meta=True)` does: a paper model of 0.8B parameters costs neither its
        # 3 GB nor the seconds of its initialisation, and every shape and setting check still runs
        with torch.device("meta") if self._dry_run() else nullcontext():
            super().instantiate_classes()

    def _run_subcommand(self, subcommand: str) -> None:
        if not self._dry_run():
            return super()._run_subcommand(subcommand)
        self._check_untrained(subcommand)
        line = self._dry_run_line(subcommand)
        if ReproCLI.summaries is not None:
            ReproCLI.summaries.append(line)
        else:
            print(line, flush=True)

    def _dry_run_line(self, subcommand: str) -> str:
        """`dry run: fit paper/enwik8_12l  TransformerXLLM 41.1M parameters  LMDataModule enwik8  Trainer: cpu ×4,
        ddp, bf16-mixed, max_steps 400000  checkpoint …  (nothing run)`."""
        run, t = self._run_cfg(), self.trainer
        params = sum(p.numel() for p in self.model.parameters())
        data = type(self.datamodule).__name__ + (f" {self.datamodule.corpus_name}"
                                                 if getattr(self.datamodule, "corpus_name", None) else "")
        devices = f"{type(t.accelerator).__name__.removesuffix('Accelerator').lower()} ×{t.num_devices}"
        strategy = type(t.strategy).__name__.removesuffix("Strategy")
        trainer = [devices, "single device" if strategy == "SingleDevice" else strategy.lower(), str(t.precision)]
        if subcommand == "fit":
            trainer.append(f"max_steps {t.max_steps}" if t.max_steps > 0 else f"max_epochs {t.max_epochs}")
        parts = [f"dry run: {subcommand} {self._name()}", f"{type(self.model).__name__} {params / 1e6:.1f}M parameters",
                 data, "Trainer: " + ", ".join(trainer)]
        if subcommand == "fit" and run.get("checkpoint"):
            parts.append(f"checkpoint {_shown(Path(run['checkpoint']))}")
        ckpt = self.config_init[subcommand].get("ckpt_path")
        if ckpt:
            parts.append(f"ckpt_path {ckpt}")
        return "  ".join(parts) + "  (nothing run)"

    def instantiate_trainer(self, **kwargs):
        cfg = self.config.get(str(self.subcommand), self.config)
        if self.subcommand == "fit":
            self._default_checkpoint(cfg)
        run = self._run_cfg()
        # Our callbacks join the configured ones: LightningCLI lets a `callbacks=` keyword replace
        # `--trainer.callbacks`, which dropped a user's ModelCheckpoint or EarlyStopping whenever --run.curves was on.
        configured = self._get(self.config_init, "trainer", default={}).get("callbacks") or []
        ours = [*(configured if isinstance(configured, list) else [configured])]
        model_class = f"{type(self.model).__module__}.{type(self.model).__qualname__}"
        self._provenance = Provenance({"module_class": model_class, "paper": run.get("paper"),
                                       "experiment": run.get("experiment"), "profile": run.get("profile"),
                                       "config": self._dump(cfg), "seed": cfg.get("seed_everything"),
                                       "mlflow_run": None})
        ours.append(self._provenance)
        bar = self._get(self.config_init, "trainer", default={}).get("enable_progress_bar")
        if bar is None and not sys.stderr.isatty():  # a pipe or a job's log file: lines, not bars redrawn in place
            kwargs["enable_progress_bar"] = bar = False
        if self.subcommand == "fit":
            if bar is False:
                ours.append(ProgressLine(f"fit {self._name()}",
                                         min_seconds=120.0 if self.summaries is not None else 0.0))
            else:
                ours.append(step_progress_bar(self._name()))
            if run.get("curves"):
                ours.append(CurveRecorder(run["curves"]))
            if run.get("select"):
                metric, mode = parse_select(run["select"])
                self._select = BestCheckpoint(best_path(run["checkpoint"]), metric, mode)
                ours.append(self._select)
            if run.get("checkpoint"):
                last = last_path(run["checkpoint"])
                ours.append(LastCheckpoint(last, every_steps=int(run.get("last_every_steps") or 0),
                                           every_minutes=float(run.get("last_every_minutes") or 0),
                                           resume_hint=self._resume_command(last)))
        kwargs["callbacks"] = ours
        strategy = self._get(self.config_init, "trainer", default={}).get("strategy")
        if strategy == "ddp" and getattr(self.model, "ddp_find_unused_parameters", False):
            # a model some of whose parameters a step may leave unused (LaMemo's memory refresh, on the first
            # segment, when the memory is still empty): DDP must look for them, or its reduction waits forever
            kwargs["strategy"] = "ddp_find_unused_parameters_true"
        if not cfg.get("trainer", {}).get("plugins"):
            kwargs["plugins"] = [MmapCheckpointIO()]  # see repro.callbacks: checkpoints are mapped, not read
        if not cfg.get("trainer", {}).get("default_root_dir"):
            # A user's ModelCheckpoint without a dirpath writes under the logger's folder, which for MLflow is
            # `<default_root_dir>/<experiment id>/<run id>/checkpoints`: beside the run's checkpoint, not in the
            # working directory.
            from repro.tracking import repo_root

            kwargs["default_root_dir"] = str(Path(run["checkpoint"]).parent if run.get("checkpoint")
                                             else repo_root() / "checkpoints")
        trainer = super().instantiate_trainer(**kwargs)
        if self._in_steps and trainer.world_size > 1 and not self._dry_run():
            raise _OwnProcess  # see `run_steps`
        return trainer

    def _default_checkpoint(self, cfg) -> None:
        """A fit that needs a checkpoint file (`--run.select` keeps the best validation's there, `--run.resume` reads
        the last one beside it) and was given none gets `default_checkpoint`'s, written into the config, so that the
        callbacks, the resume hint and the provenance stored in checkpoints all see one path. Every DDP rank re-runs
        this command line in the same folder and so derives the same path; only rank 0 says it (`_before`)."""
        run = dict(cfg.get("run", {}) or {})
        if run.get("checkpoint") or not (run.get("select") or run.get("resume")):
            return
        flag = "--run.select" if run.get("select") else "--run.resume"
        path = default_checkpoint(run)
        if path is None:
            raise ValueError(f"{flag} needs a checkpoint file and this run has no paper and experiment to name one "
                             "after (the config's run: section): give --run.checkpoint PATH")
        cfg["run.checkpoint"] = str(path)
        self._default_ckpt = (flag, path)

    def _dump(self, cfg) -> str:
        parser = self.parser if self.subcommand is None else self._subcommand_parsers[self.subcommand]
        return parser.dump(cfg, skip_none=False)

    def _mlflow(self):
        from lightning.pytorch.loggers import MLFlowLogger

        for lg in self.trainer.loggers:
            if isinstance(lg, MLFlowLogger):
                return lg
        return None

    def _attach_mlflow(self) -> None:
        """The MLflow logger joins the Trainer only now, after the checks of `_before`: constructing it creates the
        database, and a command refused for a bad input leaves no file and no run behind."""
        run = self._run_cfg()
        cfg = self.config.get(str(self.subcommand), self.config)
        if run.get("tracking", "mlflow") != "mlflow" or cfg.get("trainer", {}).get("logger"):
            return
        from lightning.pytorch.loggers import MLFlowLogger

        from repro.tracking import artifact_location, run_tags

        tags = run_tags(subcommand=str(self.subcommand), run=run, seed=cfg.get("seed_everything"),
                        ckpt_path=self.config_init[str(self.subcommand)].get("ckpt_path"))
        self.trainer.loggers = [*self.trainer.loggers,
                                MLFlowLogger(experiment_name=run.get("paper") or "repro",
                                             run_name=f"{self.subcommand}:{self._name()}", tracking_uri=tracking_uri(),
                                             artifact_location=artifact_location(), tags=tags)]

    def _start_tracking(self) -> None:
        self._attach_mlflow()
        lg = self._mlflow()
        if lg is None or self.trainer.global_rank != 0:
            return
        from repro.tracking import mark_dead_runs

        mark_dead_runs(lg.experiment)  # runs left RUNNING by a killed process end as KILLED
        cfg = self.config.get(str(self.subcommand), self.config)
        lg.experiment.log_text(lg.run_id, self._dump(cfg), "config.yaml")
        dm = self.datamodule
        internals = set(vars(LightningDataModule()))  # Lightning's own attributes (prepare_data_per_node, …)
        lg.log_hyperparams({"data": {k: v for k, v in vars(dm).items() if isinstance(v, (int, float, str, bool))
                                     and not k.startswith("_") and k not in internals}})
        lg.experiment.set_tag(lg.run_id, "hardware", hardware())
        self._provenance.info["mlflow_run"] = lg.run_id
        source = self._ckpt_info.get("mlflow_run") if self._ckpt_info else None
        if source:  # a test of a fit, or a resumed fit: cite the run that wrote the checkpoint
            lg.experiment.set_tag(lg.run_id, "resumed_from_run" if self.subcommand == "fit" else "fit_run", source)

    def _before(self) -> None:
        """Checks that need no run: the checkpoint (exists, loads, fits this model), or its absence for a test;
        then the MLflow run starts."""
        from repro.io import check_checkpoint

        run = self._run_cfg()
        sub = str(self.subcommand)
        cfg = self.config_init[sub]
        if self._default_ckpt is not None and self.trainer.global_rank == 0:
            flag, path = self._default_ckpt
            print(f"repro: checkpoint {_shown(path)} ({flag} without --run.checkpoint: the default for paper "
                  f"{run.get('paper')}, profile {default_profile(run)}, experiment {run.get('experiment')})", flush=True)
        if sub == "fit" and run.get("resume") and not cfg.get("ckpt_path"):
            if not run.get("checkpoint"):
                raise ValueError("--run.resume continues from the last checkpoint beside --run.checkpoint: "
                                 "give --run.checkpoint PATH")
            last = last_path(run["checkpoint"])
            if last.exists():
                cfg["ckpt_path"] = str(last)
                print(f"repro: resuming from {last}", flush=True)
        ckpt = cfg.get("ckpt_path")
        self._check_untrained(sub)
        from repro.nn.attention import set_attention_kernel

        set_attention_kernel(run.get("attention") or "auto")
        if run.get("compile"):
            self.model.compile_model(mode="reduce-overhead" if run["compile"] == "cudagraphs" else None)
        self._ckpt_info = check_checkpoint(ckpt, self.model) if ckpt else None
        if self.trainer.local_rank == 0:
            # data, downloads and tokenizers now, so that a missing one stops the command before its MLflow run
            # exists (Lightning calls it again: a cache hit)
            self.datamodule.prepare_data()
        self._start_tracking()

    def _check_untrained(self, sub: str) -> None:
        if sub in ("validate", "test") and not self.config_init[sub].get("ckpt_path") \
                and not self._run_cfg().get("untrained"):
            raise ValueError(f"repro {sub} without --ckpt_path would score untrained weights: give --ckpt_path "
                             "CHECKPOINT (or --run.untrained true to score them on purpose)")

    def before_fit(self):
        self._before()

    def before_validate(self):
        self._before()

    def before_test(self):
        self._before()

    def after_fit(self):
        run = self._run_cfg()
        if run.get("checkpoint"):
            last = last_path(run["checkpoint"])
            if self._select is None:
                save_checkpoint(self.trainer, run["checkpoint"])
                if self.trainer.global_rank == 0 and last.exists():  # the final checkpoint supersedes it
                    last.unlink()
            else:
                self._finish_selection(Path(run["checkpoint"]), last)
        self._record("fit")
        lg = self._mlflow()
        if run.get("curves") and self.trainer.global_rank == 0:
            png = plot_curves(run["curves"])
            if png is not None and lg is not None:
                lg.experiment.log_artifact(lg.run_id, str(png))

    def _finish_selection(self, ckpt: Path, last: Path) -> None:
        """`--run.select`: the final state goes to `last`, the best validation's checkpoint becomes `ckpt` (a resumed
        fit that had already finished keeps the `ckpt` it selected then). Where the selected step is the final one
        (the usual case while the loss still falls, and a rehearsal's one validation) or no validation ran, `ckpt`
        and `last` hold the same weights: `ckpt` becomes a hard link of `last` (`repro.io.link_or_copy`) instead of
        a second copy, 3.4 GB at 285M parameters. The best validation's own file differs from `last` only in
        Lightning's loop counters (it was saved inside the validation); no optimiser step came after it."""
        from repro.io import link_or_copy

        sel, rank0 = self._select, self.trainer.global_rank == 0
        save_checkpoint(self.trainer, last)
        action = None
        if rank0:
            action = ("same" if sel.step is not None and sel.step == self.trainer.global_step
                      and sel.path.exists() else
                      "best" if sel.step is not None and sel.path.exists() else
                      "kept" if sel.step is not None and ckpt.exists() else "final")
        if self.trainer.world_size > 1:
            action = self.trainer.strategy.broadcast(action)
        if action == "best" and rank0:
            os.replace(sel.path, ckpt)
        elif action == "same" and rank0:
            link_or_copy(last, ckpt)
            sel.path.unlink()
        elif action == "final":  # no validation ran (or its checkpoint is gone): the final state is all there is
            if rank0:
                link_or_copy(last, ckpt)
                sel.path.unlink(missing_ok=True)  # a file left by an earlier, interrupted run is not this run's
                why = "no validation ran" if sel.step is None else f"the checkpoint of step {sel.step} is gone"
                print(f"repro: --run.select {sel.metric}:{sel.mode}: {why}, so {ckpt} holds the final weights "
                      f"(step {self.trainer.global_step})", file=sys.stderr, flush=True)
        if self.trainer.world_size > 1:
            self.trainer.strategy.barrier("repro.select")

    def after_validate(self):
        self._record("validate")

    def after_test(self):
        self._record("test")

    def _peaks(self) -> list[float]:
        """Every rank's peak RSS in MiB (`repro.ops.rss`), gathered: the ranks of a DDP run on one machine share its
        memory, and rank 0's own figure would hide the others'. Collective: called on every rank."""
        from repro.ops.rss import peak_rss_mb

        if self.trainer.world_size <= 1:
            return [peak_rss_mb()]
        mine = torch.tensor([peak_rss_mb()], dtype=torch.float64, device=self.trainer.strategy.root_device)
        return [float(x) for x in self.trainer.strategy.all_gather(mine).flatten()]

    def _record(self, stage: str) -> None:
        peaks = self._peaks()
        if self.trainer.global_rank != 0:
            return
        run = self._run_cfg()
        metrics = {k: float(v) for k, v in self.trainer.callback_metrics.items()}
        lg = self._mlflow()
        record = {
            "paper": run.get("paper"),
            "experiment": run.get("experiment"),
            "profile": run.get("profile"),
            "rehearsal": bool(run.get("rehearsal")),
            "stage": stage,
            "metrics": metrics,
            "provenance": {
                "steps": max(int(self.trainer.global_step), int(getattr(self.model, "train_batches", torch.tensor(0)).item())),
                "tokens_seen": int(getattr(self.model, "tokens_seen", torch.tensor(0)).item()),
                "hardware": hardware(),
                "precision": str(self.trainer.precision),
                "devices": self.trainer.world_size,
                "mlflow_run": lg.run_id if lg is not None else None,
                "mlflow_experiment": lg.experiment_id if lg is not None else None,
                "corpus": getattr(self.datamodule, "corpus_name", None),
                "corpus_meta": getattr(getattr(self.datamodule, "corpus", None), "meta", None),
                "parameters": sum(p.numel() for p in self.model.parameters()),
                "wall_seconds": round(time.time() - self._t0, 1),
                # the process's peak resident memory so far, MiB (under `repro runs`, earlier runs of the process
                # included), and each rank's under DDP (`repro.ops.rss`)
                "peak_rss_mb": round(peaks[0]),
                **({"peak_rss_mb_ranks": [round(x) for x in peaks]} if len(peaks) > 1 else {}),
                "torch": torch.__version__,
            },
        }
        if stage == "fit" and self._select is not None:
            record["provenance"]["selected"] = {"metric": self._select.metric, "mode": self._select.mode,
                                                "value": self._select.best, "step": self._select.step}
        if hasattr(self.model, "describe"):
            record["model"] = self.model.describe()
        if run.get("record"):
            from repro.io import atomic_write_json

            atomic_write_json(run["record"], record)
        line = self._summary(stage, metrics, record["provenance"])
        if ReproCLI.summaries is not None:  # `repro runs` prints one line per experiment
            ReproCLI.summaries.append(line)
        else:
            print(line, flush=True)
        if lg is not None:
            lg.experiment.log_dict(lg.run_id, record, f"record-{stage}.json")


    def _summary(self, stage: str, metrics: dict[str, float], prov: dict[str, Any]) -> str:
        """One line per finished run: `test tiny/char_txl  loss 1.234  ppl 3.43  bpc 1.780  (40,960 tokens, 12.3 s)`."""
        prefix = {"fit": "val/", "validate": "val/", "test": "test/"}[stage]
        shown = {k[len(prefix):]: v for k, v in metrics.items() if k.startswith(prefix) and k != f"{prefix}tokens"}
        keep = getattr(self.model, "summary_metrics", None)  # a module's own choice, e.g. a classifier's (acc, loss)
        if keep is not None:
            shown = {k: v for k, v in shown.items() if k in keep}
        if stage == "fit" and "train/loss" in metrics:
            shown = {"train loss": metrics["train/loss"], **{f"val {k}": v for k, v in shown.items()}}
        parts = [f"{stage} {self._name()}", *(f"{k} {v:.4g}" for k, v in list(shown.items())[:6])]
        tokens = metrics.get(f"{prefix}tokens")
        sel = prov.get("selected")
        extra = ([f"{int(tokens):,} tokens"] if tokens and stage != "fit" else []) + \
            ([f"{prov['steps']} steps"] if stage == "fit" else []) + \
            ([f"selected step {sel['step']}, {sel['metric']} {sel['value']:.4g}"] if sel and sel["step"] is not None
             else []) + [f"{prov['wall_seconds']} s"]
        return "  ".join(parts) + f"  ({', '.join(extra)})"


def default_profile(run: dict[str, Any]) -> str:
    """The profile folder of a run's default checkpoint: a rehearsal of the paper profile (`run.rehearsal`) has its
    own, so that rehearsing a config never replaces (nor resumes from) the checkpoint of its real run."""
    profile = run.get("profile") or ""
    return "rehearsal" if run.get("rehearsal") else profile


def default_checkpoint(run: dict[str, Any], root: Path | None = None) -> Path | None:
    """`checkpoints/<paper>/<profile>/<experiment>.ckpt` under the repository root, the checkpoint of a fit that
    needs one and was given no `--run.checkpoint` (or None when the run section names no paper or experiment). The
    pipeline's runs sit one level down, in their DVC stage's group (`repro.cli.runs.group_dirs`:
    `checkpoints/<paper>/<profile>/<group>/<experiment>.ckpt`), so a fit by hand never replaces a stage's output.
    The experiment names the file as `repro runs` names it; runs of one config that differ in seed or variant
    share it unless they name their own experiment (`--run.experiment`), as `repro runs` does."""
    from repro.tracking import repo_root

    if not run.get("paper") or not run.get("experiment"):
        return None
    parts = [run["paper"], default_profile(run)]
    return (root or repo_root()) / "checkpoints" / Path(*filter(None, parts)) / f"{run['experiment']}.ckpt"


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it lies below it (the line a user copies), else absolute."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def build(config_paths: list[str], overrides: list[str] | None = None, *, meta: bool = False):
    """Model and data module of a config without training (for describe, bench, tests)."""
    args = []
    for c in config_paths:
        args += ["-c", c]
    args += ["--run.tracking", "none", "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
             "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    args += overrides or []
    argv, sys.argv = sys.argv, sys.argv[:1]  # the args are given here, not on this process's command line
    try:
        with torch.device("meta") if meta else nullcontext():
            return ReproCLI(args=args, run=False)
    finally:
        sys.argv = argv


def load_module(configs: Sequence[str], ckpt: str | None):
    """The module (weights from `ckpt`, eval mode, fp32) and data module of a config, outside any Trainer."""
    cli = build(list(configs))
    module, dm = cli.model, cli.datamodule
    if ckpt is not None:
        if not Path(ckpt).exists():
            raise ValueError(f"checkpoint {ckpt} does not exist: train it first (`repro fit -c {configs[0]} "
                             f"--run.checkpoint {ckpt}`)")
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        saved = state.get("repro", {})
        if saved.get("n_token") not in (None, module.n_token):
            raise ValueError(f"{ckpt} was trained on {saved['n_token']} symbols, the config's data has "
                             f"{module.n_token}: give the config the checkpoint was trained with")
        dm.setup("test")
        corpus = getattr(dm, "corpus", None)
        if saved.get("vocab_digest") and corpus is not None and saved["vocab_digest"] != corpus.vocab.digest:
            raise ValueError(f"{ckpt} was trained on another vocabulary than corpus {dm.corpus_name}'s")
        module.load_state_dict(state["state_dict"])
    return module.float().eval(), dm


def run_steps(steps: list[str], *, quiet: bool = False) -> list[str]:
    """Several Lightning CLI runs, one after the other, in this one process: `repro steps "fit -c A.yaml …"
    "test -c A.yaml -c A.eval.yaml --ckpt_path …"`. Each step is exactly the command `repro <step>` (its own
    seed, Trainer, MLflow run and record); only the start-up (imports, ~10 s on 2 cores) is paid once, which is
    most of a tiny run's time. A step on several processes (DDP) runs as its own process. A failing step stops
    the rest. `quiet`: the steps' summary lines are returned instead of printed (with the command lines)."""
    import shlex

    usage = ('usage: repro steps "fit -c CONFIG …" "test -c CONFIG … --ckpt_path …" …\n'
             "each quoted step is one `repro fit|validate|test` command, run in order in one process")
    if any(s.strip() in ("-h", "--help") for s in steps):
        print(usage)
        return []
    if not steps:
        raise ValueError("repro steps needs at least one quoted step, e.g. "
                         '"fit -c CONFIG --run.checkpoint A.ckpt" "test -c CONFIG --ckpt_path A.ckpt"')
    parsed = [shlex.split(s) for s in steps]
    for args in parsed:  # check every step before running the first, so a typo fails in seconds
        if not args or args[0] not in LIGHTNING_SUBCOMMANDS:
            raise ValueError(f"each step of `repro steps` starts with one of {', '.join(LIGHTNING_SUBCOMMANDS)}, "
                             f"got {' '.join(args)!r}")
    from repro.io import check_config_files

    for args in parsed:
        check_config_files(args)
    argv = sys.argv
    if quiet:
        ReproCLI.summaries = []
    try:
        for args in parsed:
            if not quiet:
                print(f"repro steps: {' '.join(args)}", flush=True)
            sys.argv = argv[:1]  # the step is given to the CLI as args (DDP steps run as their own process)
            # Lightning launches DDP ranks by re-running this process's command line, which here would be the
            # whole chain: a multi-process step runs as its own `repro <step>` process instead.
            ReproCLI._in_steps = True
            try:
                ReproCLI(args=args)
            except _OwnProcess:
                import subprocess

                done = subprocess.run([sys.executable, "-m", "repro", *args])
                if done.returncode:
                    raise SystemExit(done.returncode) from None
        return list(ReproCLI.summaries or [])
    finally:
        sys.argv = argv
        ReproCLI._in_steps = False
        ReproCLI.summaries = None


def _did_you_mean(class_path: str, key: str) -> str:
    """The known key nearest to an unknown `key` (`model.n_layers` → `model.n_layer`) of the class `class_path`
    (the constructor's parameters, then a dataclass parameter's fields), or ''."""
    import dataclasses
    import difflib
    import importlib
    import inspect
    import typing

    try:
        module, name = class_path.rsplit(".", 1)
        obj: Any = getattr(importlib.import_module(module), name)
        parts = key.split(".")
        for i, part in enumerate(parts):
            if dataclasses.is_dataclass(obj):
                known = {f.name: f.type for f in dataclasses.fields(obj)}
                hints = typing.get_type_hints(obj)
            else:
                known = dict(inspect.signature(obj).parameters)
                hints = typing.get_type_hints(obj.__init__)
            if part not in known:
                close = difflib.get_close_matches(part, list(known), n=1)
                return ".".join([*parts[:i], close[0]]) if close else ""
            nxt = hints.get(part)
            options = [t for t in typing.get_args(nxt) if dataclasses.is_dataclass(t)] or [nxt]
            obj = options[0]
    except Exception:  # a suggestion is a courtesy: never let it hide the error itself
        return ""
    return ""


def one_line(message: str) -> str:
    """A jsonargparse error in one line: the inner message of a nested (Union) error, without the namespace dump;
    an unknown key with a suggestion."""
    import re

    text = str(message)
    unknown = re.search(r"class_path '([\w.]+)':\s*unrecognized arguments: --([\w.]+)", text)
    # a misspelt key in a config file: "Group 'model' does not accept option 'n_layers'" or "Option 'memry.mem_len'
    # is not accepted" under the class's "Problem with given class_path"
    in_file = re.search(r"class_path '([\w.]+)':\s*(?:Group '([\w.]+)' does not accept option '(\w+)'|"
                        r"Option '([\w.]+)' is not accepted)", text)
    if unknown or in_file:
        cls, key = unknown.groups() if unknown else (
            in_file.group(1), in_file.group(4) or f"{in_file.group(2)}.{in_file.group(3)}")
        outer = re.search(r'Parser key "([\w.]+)"', text)
        full = f"{outer.group(1)}.init_args.{key}" if outer else key
        near = _did_you_mean(cls, key)
        hint = f" (did you mean --{full[: len(full) - len(key)]}{near}?)" if near else ""
        return f"unknown option --{full} for {cls.rsplit('.', 1)[-1]}{hint}"
    # the trainer's or run's misspelt key: on the command line, in a config file, or in one a command builds
    unknown = (re.search(r"(?:unrecognized arguments: --|does not accept option '|Option ')(trainer|run)\.([\w.]+)", text)
               or re.search(r"Group '(trainer|run)' does not accept option '([\w.]+)'", text))
    if unknown:
        import difflib

        group, key = unknown.groups()
        if group == "trainer":
            import inspect

            from lightning.pytorch import Trainer

            known = list(inspect.signature(Trainer).parameters)
        else:
            known = ["paper", "experiment", "profile", "record", "checkpoint", "select", "curves", "tracking",
                     "last_every_steps", "last_every_minutes", "resume", "untrained", "dry_run"]
        near = difflib.get_close_matches(key, known, n=1)
        return f"unknown option --{group}.{key}" + (f" (did you mean --{group}.{near[0]}?)" if near else "")
    literal = re.search(r'Parser key "([\w.]+)":\s*Expected a typing.Literal\[(.*?)\]\. Got value: (.*)', text)
    if literal:
        return f"--{literal.group(1)} is one of {literal.group(2)}, got {literal.group(3).strip()!r}"
    if "Does not validate against any of the Union subtypes" in text:
        inner = [m.strip()[2:] for m in text.splitlines() if m.strip().startswith("- ")
                 and "Expected a <class 'NoneType'>" not in m]
        key = re.search(r'Parser key "([\w.]+)"', text)
        if inner:
            reason = re.search(r"Problem with given class_path '[\w.]+':\s*\n\s*(.+)", text)  # its first line
            return (f"{key.group(1)}: " if key else "") + inner[0] + (f" {reason.group(1).strip()}" if reason else "")
    lines = [l.strip() for l in text.splitlines()
             if l.strip() and not l.strip().startswith(("Given value", "Subtypes"))]
    out = " ".join(lines)
    out = re.sub(r'^Parser key "([\w.]+)":\s*', r"--\1: ", out)
    return out[:400]


def main(argv: list[str] | None = None) -> None:
    """Errors the user can act on (no data, bad checksum, impossible settings, a bad option or config file) end
    with one line that names the problem and the fix; REPRO_DEBUG=1 shows the traceback."""
    from argparse import ArgumentError

    from repro.ops.download import ArchiveError, ChecksumError, DownloadError

    try:
        _main(argv)
    except (DownloadError, ChecksumError, ArchiveError, ValueError, ArgumentError) as err:
        if os.environ.get("REPRO_DEBUG"):
            raise
        print(f"error: {error_line(err)}  (REPRO_DEBUG=1 shows the traceback)", file=sys.stderr)
        raise SystemExit(2) from None


def error_line(err: BaseException) -> str:
    """The error in one line (`one_line`). Where jsonargparse says only that a value fits none of a Union's types,
    the reason one of them gave (a settings class's own check, e.g. `ltm.n_basis must be positive`), found down
    the chain of causes."""
    union = "Does not validate against any of the Union subtypes"
    line = one_line(str(err))
    cause, seen = err, set()
    while union in line and cause.__cause__ is not None and id(cause) not in seen:
        seen.add(id(cause))
        cause = cause.__cause__
        if union not in str(cause):
            return one_line(str(cause))
    return line


def _main(argv: list[str] | None) -> None:
    from_shell = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in LIGHTNING_SUBCOMMANDS:
        from repro.io import check_config_files

        check_config_files(argv)
        if from_shell:
            sys.argv = [sys.argv[0], *argv]  # `python -m repro fit …` and `repro fit …` alike
        ReproCLI(args=None if from_shell else argv)
        return
    if argv and argv[0] == "steps":
        run_steps(argv[1:])
        return
    # the other commands are routed by `repro.cli.entry`, which is above this module (no import circle)
    raise ValueError(f"repro.cli.cli runs {', '.join(LIGHTNING_SUBCOMMANDS)} and steps, got {' '.join(argv[:1])!r}: "
                     "run it through `repro` (repro.cli.entry.main)")


if __name__ == "__main__":
    main()
