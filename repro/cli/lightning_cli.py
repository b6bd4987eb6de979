"""`ReproCLI`, the Lightning CLI of `repro fit|validate|test` (`repro.cli.cli` runs it, one command or several
`steps`; `build` and `load_module` there make objects of a config with it).

The Lightning CLI (jsonargparse): a config names its LightningModule and LightningDataModule by
class path, unknown keys are errors, and every Trainer flag works. The conventions that tie the parts together:
a data module exposes `vocab_size` and a module accepts `n_token`, which the CLI links; a config's `run:` section
names its paper, experiment and profile, and where to record its results (the `--run.*` options below).

Differs from a plain LightningCLI: the config, not a checkpoint's hyper-parameters, decides the run (`--ckpt_path`
supplies weights only); our callbacks join the configured ones; no config-saving callback (the resolved config goes
to MLflow); checks that need no run (the checkpoint, data, an untrained evaluation) come before the MLflow run
exists; a dry run builds everything on the meta device and runs nothing. The checkpoints' paths and the `--run.select`
ending are `repro.cli.checkpoints`'; the record and summary line `repro.cli.records`'.
"""

from __future__ import annotations

import atexit
import logging
import os
import shlex
import sys
import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import MLFlowLogger

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
from repro.cli.checkpoints import (
    default_checkpoint,
    default_profile,
    finish_selection,
    shown_path,
)
from repro.cli.collisions import CheckpointLock, check_resume
from repro.cli.records import peak_rss_ranks, plot_curves, run_record, summary_line
from repro.io import atomic_write_json, check_checkpoint
from repro.lm import SegmentLM
from repro.memory import check_mechanisms
from repro.nn.attention import set_attention_kernel
from repro.ops.allocator import keep_freed_memory
from repro.tracking import artifact_location, hardware, mark_dead_runs, repo_root, run_tags, tracking_uri

LIGHTNING_SUBCOMMANDS = ("fit", "validate", "test", "predict")
SEED = 1111  # the reference's default seed


def quiet() -> None:
    """Silence what a user cannot act on: Lightning's start-up block (seed, GPU/TPU availability, advertising
    tips), MLflow's database set-up notes, and warnings about library internals (deprecations inside Lightning
    and torch, a model summary's precision). The run's own lines — progress, one summary per run, errors — stay.
    REPRO_VERBOSE=1 keeps everything."""
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
    # DDP: the modules log their validation and test metrics with `sync_dist=False`, computed from torchmetrics
    # states already summed over the ranks (`repro.metrics.lm.scored`); Lightning recommends sync_dist per metric
    warnings.filterwarnings("ignore", message=r"It is recommended to use `self\.log\(.+, \.\.\., sync_dist=True\)` "
                            r"when logging on epoch level in distributed setting")


quiet()


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
        self._lock: CheckpointLock | None = None  # held while a fit writes its checkpoint (`repro.cli.collisions`)
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
                            help="fit: save the final checkpoint here (atomically; with --run.select, the selected "
                                 "one); with --run.select or --run.resume and no PATH: "
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
        parser.add_argument("--run.batch_chunk", type=int, default=1,
                            help="fit: split each training batch into N chunks of streams, each with its own memory, "
                                 "gradients accumulated within the step (the authors' --batch_chunk: the same loss "
                                 "and gradients, one chunk's activations in memory at a time)")
        parser.add_argument("--run.checkpoint_layers", type=bool, default=False,
                            help="fit: activation checkpointing per layer (each layer's activations recomputed in the "
                                 "backward pass instead of kept: the same losses and gradients, less memory, about a "
                                 "third more compute); Transformer-XL's layer loop and the models built on it")
        parser.add_argument("--run.resume_changed", type=bool, default=False,
                            help="fit with --run.resume: continue even where the model, data, seed, optimiser or "
                                 "trainer settings differ from the checkpoint's (refused otherwise, naming them)")
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
        args = [a for a in sys.argv[1:]] if sys.argv[1:] else []
        if "--run.resume" not in " ".join(args):
            args += ["--run.resume", "true"]
        return "repro " + shlex.join(args) if args else f"repro fit … --ckpt_path {last}"

    def _dry_run(self) -> bool:
        return bool(self.subcommand is not None and self._run_cfg().get("dry_run"))

    def instantiate_classes(self) -> None:
        # a model's memory mechanisms are checked before anything is built: the config's key in the one line
        cfg = self.config.get(str(self.subcommand), self.config)
        key = "model.init_args.mechanisms"
        if cfg.get(key):
            check_mechanisms(cfg.get(key), key=key)
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
            parts.append(f"checkpoint {shown_path(Path(run['checkpoint']))}")
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
                                       "seed": cfg.get("seed_everything"), "mlflow_run": None},
                                      config=lambda: self._dump(cfg))
        ours.append(self._provenance)
        bar = self._get(self.config_init, "trainer", default={}).get("enable_progress_bar")
        if bar is None and not sys.stderr.isatty():  # a pipe or a job's log file: lines, not bars redrawn in place
            kwargs["enable_progress_bar"] = bar = False
        if self.subcommand == "fit":
            if bar is False:
                # under `repro runs` (a pipeline's log): a line every 5 minutes of a long fit, none for a short one
                ours.append(ProgressLine(f"fit {self._name()}",
                                         min_seconds=300.0 if self.summaries is not None else 0.0))
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
        run = self._run_cfg()
        sub = str(self.subcommand)
        cfg = self.config_init[sub]
        if self._default_ckpt is not None and self.trainer.global_rank == 0:
            flag, path = self._default_ckpt
            print(f"repro: checkpoint {shown_path(path)} ({flag} without --run.checkpoint: the default for paper "
                  f"{run.get('paper')}, profile {default_profile(run)}, experiment {run.get('experiment')})",
                  flush=True)
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

        # freed memory kept for the next step, on a CPU profile's model small enough that its heap's holes stay small
        keep_freed_memory(parameters=sum(p.numel() for p in self.model.parameters()), profile=run.get("profile"))

        set_attention_kernel(self.model, run.get("attention") or "auto")
        if run.get("compile"):
            self.model.compile_model(mode="reduce-overhead" if run["compile"] == "cudagraphs" else None)
        self._ckpt_info = check_checkpoint(ckpt, self.model) if ckpt else None
        if sub == "fit" and run.get("resume") and self._ckpt_info:
            check_resume(ckpt, self._ckpt_info.get("config"), self._dump(self.config.get(sub, self.config)),
                         allow=bool(run.get("resume_changed")))
        if sub == "fit" and int(run.get("batch_chunk") or 1) != 1:
            self._set_batch_chunk(int(run["batch_chunk"]))
        if sub == "fit" and run.get("checkpoint_layers"):
            self._set_checkpoint_layers()
        if sub == "fit" and run.get("checkpoint") and self.trainer.global_rank == 0:
            # one fit per checkpoint path: released when the fit ends (`after_fit`) or the process does
            self._lock = CheckpointLock(run["checkpoint"], command=" ".join(["repro", *sys.argv[1:]])[:300])
            note = self._lock.acquire()
            atexit.register(self._lock.release)
            if note:
                print(note, flush=True)
        if self.trainer.local_rank == 0:
            # data, downloads and tokenizers now, so that a missing one stops the command before its MLflow run
            # exists (Lightning calls it again: a cache hit)
            self.datamodule.prepare_data()
        self._start_tracking()

    def _set_batch_chunk(self, n: int) -> None:
        module = self.model
        if n < 1:
            raise ValueError(f"--run.batch_chunk {n}: give a number of chunks ≥ 1")
        if not isinstance(module, SegmentLM) or type(module).training_step is not SegmentLM.training_step:
            raise ValueError(f"--run.batch_chunk: {type(module).__name__} runs a training step of its own, which "
                             "does not split its batch: leave --run.batch_chunk at 1")
        batch = getattr(self.datamodule, "batch_size", None)
        if isinstance(batch, int) and batch % n:
            raise ValueError(f"--run.batch_chunk {n} does not divide the batch of {batch} streams: give a divisor "
                             f"of {batch}")
        module.batch_chunk = n

    def _set_checkpoint_layers(self) -> None:
        model = getattr(self.model, "model", None)
        if not getattr(model, "supports_checkpoint_layers", False):
            raise ValueError(f"--run.checkpoint_layers: {type(model).__name__} does not checkpoint its layers (only "
                             "the backbone without memory mechanisms, whose reads and writes a recomputed layer "
                             "would repeat, does): leave --run.checkpoint_layers false")
        model.checkpoint_layers = True

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
        try:
            self._after_fit()
        finally:
            if self._lock is not None:
                self._lock.release()

    def _after_fit(self):
        run = self._run_cfg()
        if run.get("checkpoint"):
            last = last_path(run["checkpoint"])
            if self._select is None:
                save_checkpoint(self.trainer, run["checkpoint"])
                if self.trainer.global_rank == 0 and last.exists():  # the final checkpoint supersedes it
                    last.unlink()
            else:
                finish_selection(self.trainer, self._select, ckpt=Path(run["checkpoint"]), last=last)
        self._record("fit")
        lg = self._mlflow()
        if run.get("curves") and self.trainer.global_rank == 0:
            png = plot_curves(run["curves"])
            if png is not None and lg is not None:
                lg.experiment.log_artifact(lg.run_id, str(png))

    def after_validate(self):
        self._record("validate")

    def after_test(self):
        self._record("test")

    def _record(self, stage: str) -> None:
        peaks = peak_rss_ranks(self.trainer)  # collective: every rank takes part
        if self.trainer.global_rank != 0:
            return
        run, lg = self._run_cfg(), self._mlflow()
        record = run_record(stage=stage, run=run, trainer=self.trainer, model=self.model, datamodule=self.datamodule,
                            logger=lg, peaks=peaks, wall_seconds=round(time.time() - self._t0, 1),
                            select=self._select)
        if run.get("record"):
            atomic_write_json(run["record"], record)
        line = summary_line(stage, self._name(), record["metrics"], record["provenance"],
                            keep=getattr(self.model, "summary_metrics", None))
        if ReproCLI.summaries is not None:  # `repro runs` prints one line per experiment
            ReproCLI.summaries.append(line)
        else:
            print(line, flush=True)
        if lg is not None:
            lg.experiment.log_dict(lg.run_id, record, f"record-{stage}.json")
