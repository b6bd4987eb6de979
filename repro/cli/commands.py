"""The shared non-Lightning subcommands of `repro` (describe, prepare, tables, bench, recl, generate, mirror) and
`repro --help`, which lists the shared commands, then each paper's own (`repro.cli.registry`) under its name.

The commands' work is library code (`repro.ops.bench`, `repro.context`, `repro.generate`, `repro.tables`) reached
through their command modules (`repro.cli.bench`, `repro.cli.context`, `repro.cli.generate`), imported only when
the command runs: `repro --help` starts without torch or Lightning."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from repro import tables as T
from repro.cli import rehearsal_record
from repro.cli.registry import paper_tables, table_papers
from repro.cli.rehearsal_configs import data_overrides
from repro.io import atomic_write_json, check_config_files
from repro.ops import docs, speed


def describe_configs(paths: list[str]) -> list[dict]:
    """`repro describe`'s row of each config (an *.eval.yaml built on top of its training config), on the meta
    device."""
    from repro.cli.cli import build  # heavy: Lightning

    rows = []
    for path in paths:
        base = path.replace(".eval.yaml", ".yaml")
        rows.append(describe_built(path, build([base, path] if base != path else [path], meta=True)))
    return rows


def describe_built(path: str, cli) -> dict:
    """The row of `describe_configs` from a config already built (`repro.cli.cli.build`)."""
    module, dm = cli.model, cli.datamodule
    run = cli.config.get("run", {}) or {}
    row = {"config": path, "paper": run.get("paper"), "experiment": run.get("experiment"),
           "profile": run.get("profile")}
    row |= module.describe() if hasattr(module, "describe") else {
        "module_class": type(module).__qualname__, "parameters": sum(p.numel() for p in module.parameters())}
    for key in ("corpus_name", "batch_size", "tgt_len", "eval_batch_size", "eval_tgt_len"):
        if hasattr(dm, key):
            row[key.replace("corpus_name", "corpus")] = getattr(dm, key)
    try:
        paper_params = getattr(paper_tables(row["paper"]), "PAPER_PARAMS", {}).get(row["experiment"])
    except ValueError:  # a config of no paper with tables
        paper_params = None
    row["paper_parameters"] = paper_params
    if paper_params:
        row["ratio_to_paper"] = round(row["parameters"] / paper_params, 4)
    return row


def _describe(args) -> None:
    for path in args.config:
        check_config_files(["-c", path])
    for row in describe_configs(args.config):
        print(json.dumps(row), flush=True)


def data_module(config_paths: list[str]):
    """The data module of a config, instantiated from the same parse as `repro fit`'s, without the model and trainer
    (`repro prepare` built every model too: the eleven Transformer-XL paper models, up to One Billion Word large's
    0.8B parameters, took 64 s to build and were thrown away; the data modules alone take 2 s)."""
    from jsonargparse import ArgumentParser  # heavy: jsonargparse
    from lightning.pytorch import LightningDataModule  # heavy: Lightning

    from repro.cli.lightning_cli import ReproCLI  # heavy: Lightning

    class DataOnly(ReproCLI):
        def instantiate_classes(self) -> None:
            parser = ArgumentParser(exit_on_error=False)
            parser.add_subclass_arguments(LightningDataModule, "data", required=True)
            cfg = parser.parse_object({"data": self.config["data"].as_dict()})
            self.datamodule = parser.instantiate_classes(cfg)["data"]
            self.model = self.trainer = None

    args = [a for c in config_paths for a in ("-c", c)] + ["--run.tracking", "none"]
    argv, sys.argv = sys.argv, sys.argv[:1]  # the args are given here, not on this process's command line
    try:
        return DataOnly(args=args, run=False).datamodule
    finally:
        sys.argv = argv


def _prepare(args) -> None:
    """Build (download if needed) every corpus the configs use; write a manifest of what was built."""
    paths = []
    for item in args.config:
        p = Path(item)
        if not p.exists():
            raise ValueError(f"config file {item} does not exist (give config files or a folder of them, e.g. "
                             "configs/transformer_xl/tiny)")
        # a folder's experiment configs: not the evaluation overrides, not the pre-registered claims (repro.claims)
        paths += sorted(str(x) for x in p.glob("*.yaml") if ".eval." not in x.name and x.name != "claims.yaml") \
            if p.is_dir() else [item]
    built = {}
    rehearsal = getattr(args, "rehearsal", "false") == "true"
    for path in paths:
        if rehearsal:  # the data modules' rehearsal sizes (configs/rehearsal/), e.g. a few generated ListOps trees
            dm = data_module([path, *data_overrides(path)])
        else:
            dm = data_module([path])
        name = getattr(dm, "corpus_name", None) or type(dm).__name__
        if name not in built:
            dm.prepare_data()
            dm.setup("fit")
            corpus = getattr(dm, "corpus", None)
            meta = getattr(corpus, "meta", None) or {"prepared": True}
            # what was built, not how long it took: the manifest is a dependency of every run stage, and a rebuilt
            # cache with the same contents must not make DVC retrain them
            built[name] = {k: v for k, v in meta.items() if k != "build_seconds"}
    print(f"repro prepare: {len(built)} corpora ready ({', '.join(built)})", flush=True)
    if args.manifest:
        atomic_write_json(args.manifest, built)


def readme_blocks() -> dict:
    """Every generated block of the READMEs: the library's (`repro.ops.docs.BLOCKS`) and the rehearsal's, which
    reads the pipeline (`repro.cli.rehearsal_record.BLOCKS`)."""
    return {**docs.BLOCKS, **rehearsal_record.BLOCKS}


def _tables(args) -> None:
    if args.paper == "speed":  # the shared speed tables, from the benchmark records
        paths = speed.write(speed.build())
        print(f"repro tables speed: {len(paths)} files in results/speed", flush=True)
        return
    if args.paper == "readme":  # the READMEs' generated blocks, from the tables and records
        changed = docs.write(blocks=readme_blocks())
        print(f"repro tables readme: {len(changed)} of {len(docs.documents())} documents changed", flush=True)
        return
    mod = paper_tables(args.paper)
    results = T.Results(args.paper)
    tables = mod.build(results)
    paths = T.write(args.paper, tables)
    folders = sorted({str(p.parent) for p in map(Path, paths)})
    # the READMEs' blocks made from these tables and records, rewritten with them: a stage that reruns leaves no
    # README behind its records
    changed = docs.write(blocks=readme_blocks())
    elsewhere = T.log_to_mlflow(args.paper, tables, paths, results) if not args.no_mlflow else 0
    print(f"repro tables {args.paper}: {len(paths)} files in {', '.join(folders)}"
          f"{f'; {len(changed)} README blocks rewritten' if changed else ''}"
          f"{f'; {elsewhere} cited MLflow runs were recorded in another database, not tagged' if elsewhere else ''}",
          flush=True)



USAGE = """one command line for every paper (docs/cli.md):

  repro fit|validate|test -c CONFIG [-c OVERRIDE ...] [--trainer.* ...] [--run.* ...]   the Lightning CLI
  repro steps "fit -c CONFIG ..." "test -c CONFIG -c EVAL ... --ckpt_path ..."     several runs, one process
  repro runs --paper P --profile tiny --group G CONFIG[+VARIANT][@SEED] ...          a DVC stage's experiments

`repro fit --help` lists every option of a run (`--run.checkpoint`, `--run.resume`, `--run.tracking`, ...);
`repro COMMAND --help` the options of any other command. REPRO_DEBUG=1 shows tracebacks, REPRO_VERBOSE=1
Lightning's and MLflow's own messages."""

# the commands that `repro.cli.entry` routes before this parser (listed here for `repro --help`)
ROUTED = {"fit": "train (Lightning CLI; `repro fit --help` lists every option)",
          "validate": "evaluate a checkpoint on the validation split (Lightning CLI)",
          "test": "evaluate a checkpoint on the test split (Lightning CLI)",
          "steps": "several quoted fit|validate|test commands in order, in one process",
          "runs": "the fit and tests of every experiment of a group (a DVC stage)",
          "profile": "dvc repro of another profile (params.<profile>.yaml, dvc.<profile>.lock): `repro profile small`",
          "rehearse": "rehearse the paper profile on a scratch copy against the local mirror (repro.cli.rehearsal)",
          "export": "a trained checkpoint as a self-describing folder: safetensors, config, model card (Hub, MLflow)",
          "step-memory": "a config's peak training-step memory per stream, and the batch_chunk that fits a GPU"}


def papers_help(papers: dict[str, dict[str, tuple]]) -> str:
    """The per-paper part of `repro --help`: each paper's commands under its name."""
    width = max((len(n) for cmds in papers.values() for n in cmds), default=0) + 2
    lines = ["commands of the papers (papers/<paper>/commands.py):"]
    for paper, cmds in papers.items():
        if cmds:
            lines.append(f"  {paper}:")
            lines += [f"    {name:<{width}}{text}" for name, (_, text) in cmds.items()]
    return "\n".join(lines) if len(lines) > 1 else ""


def main(argv: list[str], papers: dict[str, dict[str, tuple]] | None = None) -> None:
    """The shared commands; `papers` ({paper: {name: (run, help)}}, from `repro.cli.registry`) only join the help
    (`repro.cli.entry` runs them before this parser)."""
    papers = papers or {}
    parser = argparse.ArgumentParser(prog="repro", description=USAGE, epilog=papers_help(papers),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="shared commands")
    for name, text in ROUTED.items():
        sub.add_parser(name, help=text, add_help=False)
    d = sub.add_parser("describe", help="one JSON line per config: model class, parameters, lengths")
    d.add_argument("config", nargs="+")
    d.set_defaults(func=_describe)

    b = sub.add_parser("bench", help="tokens/s, model-FLOPs utilisation and peak memory of a config (one JSON line)")
    b.add_argument("config", nargs="+", help="config file(s), merged in order (e.g. a training and an eval config); "
                   "with --compare one model each (A.yaml,A.eval.yaml merges)")
    b.add_argument("--compare", action="store_true",
                   help="time each config's model in turns, interleaved over --rounds, and give each one's speed "
                        "relative to the first's")
    b.add_argument("--variants",
                   help="time one model under each comma-separated variant in turns: an attention kernel (auto, "
                        "eager, sdpa) with optional +compile and +foreach, e.g. eager+foreach,sdpa,sdpa+compile")
    b.add_argument("--rounds", type=int, default=2, help="--compare, --variants: rounds of turns")
    b.add_argument("--profile", type=int, default=0,
                   help="--variants: after each variant's timed steps, profile three more and list the N "
                        "operators (GPU kernels) that took the most device time")
    b.add_argument("--mode", choices=["train", "eval", "slowdown"], default="train")
    b.add_argument("--precision", choices=["32", "bf16"], default="32")
    b.add_argument("--steps", type=int, default=10, help="timed steps (after warm-up)")
    b.add_argument("--warmup", type=int, default=3)
    b.add_argument("--batch-size", type=int)
    b.add_argument("--tgt-len", type=int)
    b.add_argument("--device")
    b.add_argument("--threads", type=int)
    b.add_argument("--attention-lengths", help="slowdown: comma-separated attention lengths")
    b.add_argument("--segment", type=int, default=32, help="slowdown: segment length of the memory model")
    b.add_argument("--compile", action="store_true",
                   help="time the compiled model (as repro fit --run.compile true); warm-up includes compilation")
    b.add_argument("--attention", choices=["auto", "eager", "sdpa"], default="auto",
                   help="attention kernel (repro.nn.attention): auto = sdpa on a GPU, eager on a CPU")
    b.add_argument("--override", action="append", default=[],
                   help="extra CLI override, e.g. --override=--model.init_args.model.dropout=0")
    b.add_argument("--output", help="also write the JSON lines to this file")
    b.add_argument("--rehearsal", choices=["true", "false"], default="false",
                   help="true: one timed step, no warm-up, batch size 2 unless --batch-size (the paper profile's "
                        "rehearsal: the code path, not a measurement)")
    b.set_defaults(func=lambda a: importlib.import_module("repro.cli.bench").main(a))

    p = sub.add_parser("prepare", help="build the corpora of configs (files or folders of configs)")
    p.add_argument("config", nargs="+")
    p.add_argument("--manifest", help="write what was built (sizes, checksums) to this JSON file")
    p.add_argument("--rehearsal", choices=["true", "false"], default="false",
                   help="true: build the data at the rehearsal's sizes (configs/rehearsal/)")
    p.set_defaults(func=_prepare)

    t = sub.add_parser("tables", help="regenerate results/<paper>/*.md and .csv from the run records")
    t.add_argument("paper", choices=[*table_papers(), "speed", "readme"],
                   help=f"one of {', '.join(table_papers())}; speed: results/speed/ from the benchmark records; "
                        "readme: the READMEs' generated blocks from the tables and records")
    t.add_argument("--no-mlflow", action="store_true", help="do not attach the tables to the runs they cite")
    t.set_defaults(func=_tables)

    r = sub.add_parser("recl", help="loss against test-time context length and RECL for a group of models")
    r.add_argument("--model", action="append", required=True,
                   help="NAME=CONFIG[,CONFIG...]@CHECKPOINT[:memory|window] (repeat for every model of the group)")
    r.add_argument("--contexts", required=True, help="comma-separated attention lengths, e.g. 16,32,64,128")
    r.add_argument("--split", default="test", choices=["valid", "test"])
    r.add_argument("--max-tokens", type=int, help="score only the first N tokens of the split")
    r.add_argument("--ratios", default="0.1,0.5,1.0", help="the r of the top-r hardest tokens")
    r.add_argument("--threshold", type=float, default=0.01)
    r.add_argument("--stride", type=int, help="window models: tokens scored per window (default max(1, c // 8))")
    r.add_argument("--batch-size", type=int, help="streams the split is cut into (default: the eval batch size)")
    r.add_argument("--threads", type=int)
    r.add_argument("--device", help="where the models run (default: cuda where there is a GPU, else cpu)")
    r.add_argument("--output", help="write the JSON record here")
    r.add_argument("--plot", help="write the loss-vs-context plot (PNG) here")
    r.set_defaults(func=lambda a: importlib.import_module("repro.cli.context").main(a))

    g = sub.add_parser("generate", help="sample a continuation of a prompt file (top-k, memory carried)")
    g.add_argument("-c", "--config", action="append", required=True, help="config file(s), merged in order")
    g.add_argument("--ckpt_path", required=True)
    g.add_argument("--prompt", required=True, help="text file in the corpus's format")
    g.add_argument("--length", type=int, default=200, help="tokens to generate")
    g.add_argument("--top_k", type=int, default=40, help="the paper's k = 40; 0 samples from everything")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--greedy", action="store_true", help="argmax instead of sampling")
    g.add_argument("--seed", type=int, default=1111)
    g.add_argument("--mem_len", type=int, help="memory per layer (default: the config's eval_memory.mem_len)")
    g.add_argument("--window", type=int, help="attention length of a model without memory")
    g.add_argument("--threads", type=int)
    g.add_argument("--output", help="also write the continuation here")
    g.set_defaults(func=lambda a: importlib.import_module("repro.cli.generate").main(a))
    importlib.import_module("repro.ops.mirror.command").add_parser(sub)  # the rehearsal's local mirror of every source
    for cmds in papers.values():  # valid choices (listed in the epilog by paper), run by `repro.cli.entry`
        for name in cmds:
            sub.add_parser(name, add_help=False)

    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
